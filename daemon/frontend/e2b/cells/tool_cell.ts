// The E2B backend's tool-mode cell for TypeScript tools (daemon/frontend/e2b/e2b.cc,
// docs/E2B.md "TypeScript tools"), sent as it is with @BLOB@ replaced by one
// base64 literal of {"name", "nonce", "await", "args", "schema"}: the tool's
// name, this run's nonce, whether Letta would await the call, the arguments
// and Tool.json_schema as the client sent them. It runs in the same fresh
// kernel context after the environment cell and the tool's source cell, calls
// the function with the arguments in Letta's positional order, and writes
// the result as Letta's E2B sandbox would read it into the runner's nonce
// frame on stdout (daemon/frontend/letta/letta.h); a tool that throws, or a
// result JSON cannot hold, gives the kernel's error name and message in the
// frame and its stack on stderr. Its value is the exit status (0 or 1).
// Nothing of the request ever becomes code: the base64 alphabet cannot end
// the string literal, and the name is checked to be an identifier before it
// is looked up. Embedded at build time (daemon/cmake/embed_text.cmake).
(async (blob: string): Promise<number> => {
  const spec = JSON.parse(Buffer.from(blob, "base64").toString("utf8"));
  const inspect = require("util").inspect;
  const frame = (payload: unknown): void => {
    const body = Buffer.from(JSON.stringify(payload), "utf8").toString("base64");
    process.stdout.write("\n<<TSB-RESULT-" + spec.nonce + ">>" + body + "<<TSB-END-" + spec.nonce + ">>\n");
  };
  // As E2B's kernel reports an error (nel's formatError; the server joins the
  // stack's lines), and Letta appends the traceback to stderr.
  const fail = (e: any, kind: string): number => {
    const name = e && e.name ? String(e.name) : typeof e;
    const message = e && e.message ? String(e.message) : inspect(e);
    const traceback = e && e.stack ? String(e.stack).split("\n").join("") : "";
    if (traceback) process.stderr.write(traceback);
    frame({ results: null, agent_state: null, error: { kind, name, message } });
    return 1;
  };
  const named = (name: string, message: string): Error => {
    const e = new Error(message);
    e.name = name;
    return e;
  };
  if (typeof spec.name !== "string" || !/^[A-Za-z_$][A-Za-z0-9_$]*$/.test(spec.name))
    return fail(named("ValueError", "the tool's name is not an identifier"), "request");
  // Letta's generate_typescript_execution_script: required parameters in
  // order, then the schema's other properties, then the other arguments;
  // booleans converted as convert_param_to_ts_value does.
  const args = spec.args && typeof spec.args === "object" ? spec.args : {};
  const parameters = (spec.schema && spec.schema.parameters) || {};
  const properties = parameters.properties || {};
  const has = (o: object, k: string): boolean => Object.prototype.hasOwnProperty.call(o, k);
  const order: string[] = [];
  for (const p of Array.isArray(parameters.required) ? parameters.required : []) if (has(args, p)) order.push(p);
  for (const p of Object.keys(properties)) if (has(args, p) && !order.includes(p)) order.push(p);
  for (const p of Object.keys(args)) if (!order.includes(p)) order.push(p);
  const values: unknown[] = [];
  for (const p of order) {
    let v = args[p];
    const type = has(properties, p) && properties[p] ? properties[p].type : undefined;
    if (v !== null && type === "boolean" && typeof v !== "boolean") {
      if (typeof v === "number" && (v === 0 || v === 1)) v = v === 1;
      else if (typeof v === "string" && ["true", "false"].includes(v.trim().toLowerCase())) v = v.trim().toLowerCase() === "true";
      else return fail(named("ValueError", "Invalid boolean value: " + String(v)), "request");
    }
    values.push(v);
  }
  let text: string;
  try {
    // The name as Letta's script writes it, looked up in the kernel's global scope.
    const fn = (0, eval)(spec.name);
    // Letta's script makes `client` (its LettaClient, or null) a name the tool sees.
    let client: unknown = null;
    try {
      const { LettaClient } = await import("@letta-ai/letta-client");
      if (process.env.LETTA_API_KEY) client = new LettaClient({ apiKey: process.env.LETTA_API_KEY });
    } catch (e) {
      // Package not available - client remains null
    }
    (globalThis as any).client = client;
    let value = fn(...values);
    if (spec.await) value = await value;
    text = JSON.stringify({ results: value, agent_state: null });
  } catch (e) {
    return fail(e, "tool");
  }
  // What Letta makes of that text: E2B's kernel shows it with util.inspect,
  // its server strips one pair of outer quotes, parse_typescript_result parses
  // the rest as JSON, or keeps it as text when it is not JSON.
  let shown = inspect(text);
  if (shown.length >= 2 && (shown[0] === "'" || shown[0] === '"') && shown[shown.length - 1] === shown[0])
    shown = shown.slice(1, -1);
  let results: unknown = shown;
  try {
    const parsed = JSON.parse(shown);
    results = parsed !== null && typeof parsed === "object" && !Array.isArray(parsed) && parsed.results !== undefined
      ? parsed.results : null;
  } catch (e) {
    results = shown;
  }
  frame({ results, agent_state: null });
  return 0;
})("@BLOB@")

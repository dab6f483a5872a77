'use strict';
/*
 * toolsandbox TypeScript runner: runs one of Letta's TypeScript tools (Tool.source_type
 * "typescript") inside a local sandbox, in either mode.
 *
 * This file is trusted code, the fixed program the engine runs under node for a
 * TypeScript run (the policy's "typescript" section names node and the type
 * stripper, both below the sandbox's read-only /usr). Node's own modules only,
 * plus Debian's acorn (/usr/share/nodejs/acorn) and the stripper.
 *
 * Invocation
 * ==========
 *
 *     node /opt/toolsandbox/runner/toolsandbox_ts_runner.js esbuild|typescript PATH <&result-channel
 *
 * (the stripper the policy names, and its path: esbuild's program or
 * node-typescript's module directory)
 *
 * stdin is the result channel, one end of a stream socket pair whose other end
 * the daemon holds (daemon/frontend/letta/letta.h, "The result channel"); the
 * protocol is the Python runner's channel mode (toolsandbox_runner.py, "Channel
 * mode"), so the daemon's side is one code path:
 *
 * 1. the first part: a 4-byte big-endian length, then one JSON object:
 *    tool mode {"tool_name", "source_code"}; execute {"script"};
 * 2. the runner declares "TSB1 agent_state=0\n": a TypeScript tool never gets
 *    an agent state (Letta gives it none: process.env.LETTA_AGENT_ID instead);
 * 3. the second part, likewise: tool mode {"args", "json_schema", "agent_state",
 *    "agent_id", "env"} (agent_state null), execute {} or {"env"};
 * 4. the payload, JSON text: {"results": <value>, "agent_state": null}, or
 *    {"results": null, "agent_state": null, "error": {"kind": "tool" |
 *    "request", "name", "message"}};
 * 5. exit: 0 a result, 1 the tool failed, 2 an unusable request, 3 no payload.
 *
 * What runs (both modes, the script E2B's TypeScript kernel has)
 * ===============================================================
 *
 * The source's types are stripped (esbuild, or node-typescript's
 * transpileModule; value imports kept, as Babel's onlyRemoveTypeImports), then
 * evaluated as one script in one scope of its own, sloppy mode, top-level await
 * allowed: static imports become loads of the module (its default export is
 * `.default`, a CommonJS module's module.exports; node's built-in modules by
 * name, packages resolved from <workdir>/node_modules, then /node_modules,
 * which the per-tool packages bind read-only), `export` is dropped, dynamic
 * import() loads the same way, and `require` is there as in E2B's CommonJS
 * kernel. The value of its last expression statement is its completion value.
 *
 * Execute: the script is the one Letta generated (typescript_generator.py),
 * whose last statement is `JSON.stringify(_output);`. Its completion value is
 * read as Letta's E2B sandbox reads the kernel's text/plain result: a string as
 * it is, anything else as util.inspect shows it; then parse_typescript_result:
 * empty, results null; a JSON object, its "results"; JSON that is not an object,
 * the AttributeError Python's .get raises; not JSON, the text itself.
 *
 * Tool mode: the arguments stay data. The source gets what Letta's generator
 * gives it (single-line imports hoisted, every `export ` removed, `client`, one
 * const per argument holding the value as decoded from JSON, never spliced as
 * text), then the call `await tool_name(args...)` in Letta's positional order:
 * the schema's required names, then its other properties, then the rest. A
 * promise is awaited; the value becomes the payload through
 * JSON.stringify({results, agent_state: null}) exactly as Letta's script does
 * (a BigInt fails with its TypeError; undefined, a function: results null).
 *
 * A promise that never settles waits (until the run's timeout), as E2B's cell
 * waits. A failure (a throw, a rejected promise, an uncaught exception of a callback,
 * a syntax error) is reported as E2B's kernel reports it (nel's formatError):
 * the name (error.name, else typeof), the message (error.message, else
 * util.inspect), its stack on stderr.
 *
 * Threat model: as the Python runner's channel mode. The tool runs in this
 * process and can write on the channel (fd 0): that only chooses its own result,
 * which returning a value does too; it never receives anything it could not
 * have had (no agent state is ever sent after a "0"). Its programs inherit no
 * channel from node's child_process (stdio is piped by default).
 */

const fs = require('fs');
const path = require('path');
const util = require('util');
const vm = require('vm');
const Module = require('module');
const { spawnSync } = require('child_process');
const { pathToFileURL } = require('url');

const EXIT_OK = 0, EXIT_TOOL_ERROR = 1, EXIT_REQUEST_ERROR = 2, EXIT_NO_RESULT = 3;
const CHANNEL = 0;
const DECLARATION = 'TSB1 agent_state=0\n';
const MAX_PART = 1 << 30;
const ACORN = '/usr/share/nodejs/acorn';
// The stripper the policy names: its kind and path, the program's arguments.
const STRIPPER = process.argv[2] === 'typescript' ? 'typescript' : 'esbuild';
const STRIPPER_PATH = process.argv[3] || '/usr/bin/esbuild';

class RequestError extends Error {}

function sleepMs(ms) {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

// Reads and writes on the channel, blocking (a tool that touched process.stdin
// made the descriptor non-blocking: EAGAIN waits).
function readExact(n) {
  const buf = Buffer.alloc(n);
  let off = 0;
  while (off < n) {
    let got;
    try {
      got = fs.readSync(CHANNEL, buf, off, n - off, null);
    } catch (e) {
      if (e.code === 'EAGAIN') { sleepMs(1); continue; }
      if (e.code === 'EINTR') continue;
      throw e;
    }
    if (got === 0) throw new Error('the request ended early');
    off += got;
  }
  return buf;
}

function writeAll(data) {
  const buf = Buffer.from(data, 'utf8');
  let off = 0;
  while (off < buf.length) {
    try {
      off += fs.writeSync(CHANNEL, buf, off, buf.length - off);
    } catch (e) {
      if (e.code === 'EAGAIN') { sleepMs(1); continue; }
      if (e.code === 'EINTR') continue;
      throw e;
    }
  }
}

function readPart() {
  const n = readExact(4).readUInt32BE(0);
  if (n > MAX_PART) throw new Error('a request part of ' + n + ' bytes');
  const part = JSON.parse(readExact(n).toString('utf8'));
  if (part === null || typeof part !== 'object' || Array.isArray(part)) throw new Error('a request part is not a JSON object');
  return part;
}

// nel's formatError (E2B's JavaScript kernel): what a failure is called.
function errorNameMessage(e) {
  let name, message;
  try { name = e && e.name ? String(e.name) : typeof e; } catch (_) { name = typeof e; }
  try { message = e && e.message ? String(e.message) : util.inspect(e); } catch (_) { message = String(typeof e); }
  return { name, message };
}

function errorPayload(kind, name, message) {
  return JSON.stringify({ results: null, agent_state: null, error: { kind, name, message } });
}

// ---- the source ----------------------------------------------------------

// Letta's generator (typescript_generator.py): single-line imports are
// extracted and put first, and every `export ` is removed.
const LETTA_IMPORT = /^import\s+.+?['"];?\s*$/gm;
const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/;
const RESERVED = new Set(('break case catch class const continue debugger default delete do else enum export extends ' +
  'false finally for function if import in instanceof new null return super switch this throw true try typeof var ' +
  'void while with yield let static implements interface package private protected public await arguments eval').split(' '));

function jsName(n, what) {
  if (typeof n !== 'string' || !IDENTIFIER.test(n) || RESERVED.has(n))
    throw new RequestError(what + ' ' + JSON.stringify(n) + ' is not a JavaScript identifier');
  return n;
}

// Letta's convert_param_to_ts_value, on values: what the spliced literal
// would have evaluated to, the value itself where it is plain data.
function argumentValue(type, name, v) {
  if (v === null) return null;
  if (type === 'boolean') {
    if (typeof v === 'boolean') return v;
    if (v === 0 || v === 1) return v === 1;
    if (typeof v === 'string' && ['true', 'false'].includes(v.trim().toLowerCase())) return v.trim().toLowerCase() === 'true';
    throw new RequestError('Invalid boolean value: ' + (typeof v === 'string' ? v : JSON.stringify(v)));
  }
  return v;
}

function toolProgram(first, second) {
  const tool = jsName(first.tool_name, 'the tool name');
  if (typeof first.source_code !== 'string') throw new RequestError('source_code must be a string');
  const args = second.args == null ? {} : second.args;
  if (typeof args !== 'object' || Array.isArray(args)) throw new RequestError('args must be an object');
  const schema = second.json_schema && typeof second.json_schema === 'object' ? second.json_schema : {};
  const params = schema.parameters && typeof schema.parameters === 'object' ? schema.parameters : {};
  const props = params.properties && typeof params.properties === 'object' ? params.properties : {};
  const required = Array.isArray(params.required) ? params.required : [];
  const order = [];
  for (const p of required) if (Object.prototype.hasOwnProperty.call(args, p) && !order.includes(p)) order.push(p);
  for (const p of Object.keys(props)) if (Object.prototype.hasOwnProperty.call(args, p) && !order.includes(p)) order.push(p);
  for (const p of Object.keys(args)) if (!order.includes(p)) order.push(p);
  const values = {};
  for (const p of order) {
    jsName(p, 'the argument');
    const spec = props[p] && typeof props[p] === 'object' ? props[p] : {};
    values[p] = argumentValue(spec.type, p, args[p]);
  }
  const src = first.source_code;
  const imports = src.match(LETTA_IMPORT) || [];
  const body = src.replace(LETTA_IMPORT, '').replace(/\bexport\s+/g, '').trim();
  const lines = imports.map((s) => s.trim());
  if (lines.length) lines.push('');
  lines.push('let client: any = null;',
    'try {',
    "    const { LettaClient } = await import('@letta-ai/letta-client');",
    '    const apiKey = process.env.LETTA_API_KEY;',
    '    if (apiKey) {',
    '        client = new LettaClient({ apiKey });',
    '    }',
    '} catch (e) {',
    '}');
  for (const p of order) lines.push('const ' + p + ' = __tsb_args[' + JSON.stringify(p) + '];');
  lines.push(body, '', '(await ' + tool + '(' + order.join(', ') + '));');
  return { code: lines.join('\n') + '\n', args: values };
}

// ---- types stripped ------------------------------------------------------

function syntaxError(message) {
  const e = new SyntaxError(message);
  e.stack = 'SyntaxError: ' + message;
  return e;
}

function stripTypes(source) {
  if (STRIPPER === 'typescript') {
    const ts = require(STRIPPER_PATH);
    const out = ts.transpileModule(source, {
      reportDiagnostics: true,
      compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext, isolatedModules: true,
        preserveValueImports: true, importsNotUsedAsValues: ts.ImportsNotUsedAsValues.Preserve, sourceMap: false },
    });
    const d = (out.diagnostics || []).find((x) => x.category === ts.DiagnosticCategory.Error);
    if (d) throw syntaxError(ts.flattenDiagnosticMessageText(d.messageText, '\n'));
    return out.outputText;
  }
  // esbuild (a Go program): its threads are the sandbox's processes, so few.
  const r = spawnSync(STRIPPER_PATH, ['--loader=ts', '--log-level=error', '--color=false', '--charset=utf8',
    '--tsconfig-raw={"compilerOptions":{"preserveValueImports":true,"importsNotUsedAsValues":"preserve"}}'], {
    input: source, maxBuffer: 1 << 30, env: { GOMAXPROCS: '2', PATH: '/usr/bin:/bin' },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  if (r.error) throw new Error('cannot run the type stripper ' + STRIPPER_PATH + ': ' + r.error.message);
  if (r.status !== 0) {
    const text = r.stderr.toString('utf8');
    const m = /\[ERROR\]\s*(.*)/.exec(text);
    const at = /<stdin>:(\d+):(\d+):/.exec(text);
    throw syntaxError((m ? m[1].trim() : 'the type stripper failed: ' + text.trim()) + (at ? ' (' + at[1] + ':' + at[2] + ')' : ''));
  }
  return r.stdout.toString('utf8');
}

// ---- the script ----------------------------------------------------------

// Every node of an acorn tree, depth first.
function walk(node, visit) {
  if (!node || typeof node.type !== 'string') return;
  visit(node);
  for (const key of Object.keys(node)) {
    const v = node[key];
    if (Array.isArray(v)) { for (const c of v) if (c && typeof c.type === 'string') walk(c, visit); }
    else if (v && typeof v.type === 'string') walk(v, visit);
  }
}

function importText(node, n) {
  const m = '__tsb_m' + n;
  let out = 'const ' + m + ' = await __tsb.load(' + JSON.stringify(node.source.value) + ');';
  for (const s of node.specifiers) {
    const from = s.type === 'ImportDefaultSpecifier' ? m + '.default'
      : s.type === 'ImportNamespaceSpecifier' ? m
        : m + '[' + JSON.stringify(s.imported.type === 'Identifier' ? s.imported.name : s.imported.value) + ']';
    out += ' const ' + s.local.name + ' = ' + from + ';';
  }
  return out;
}

// The stripped script as the body of one async function: imports as loads,
// export dropped, import() through the same loader, the last expression
// statement's value returned (the completion value).
function scriptFunction(js) {
  const acorn = require(ACORN);
  let tree;
  try {
    tree = acorn.parse(js, { ecmaVersion: 'latest', sourceType: 'script', allowImportExportEverywhere: true,
      allowAwaitOutsideFunction: true, allowHashBang: true, allowReturnOutsideFunction: false });
  } catch (e) {
    throw syntaxError(e.message);
  }
  const edits = [];  // [start, end, text]
  let n = 0;
  for (const st of tree.body) {
    if (st.type === 'ImportDeclaration') edits.push([st.start, st.end, importText(st, n++)]);
    else if (st.type === 'ExportNamedDeclaration' || st.type === 'ExportDefaultDeclaration') {
      if (st.declaration) edits.push([st.start, st.declaration.start, '']);
      else edits.push([st.start, st.end, '']);
    } else if (st.type === 'ExportAllDeclaration') edits.push([st.start, st.end, '']);
  }
  walk(tree, (node) => {
    if (node.type === 'ImportExpression') edits.push([node.start, node.start + 6, '__tsb.load']);
  });
  const last = tree.body[tree.body.length - 1];
  if (last && last.type === 'ExpressionStatement')
    edits.push([last.start, last.end, 'return (' + js.slice(last.expression.start, last.expression.end) + ');']);
  edits.sort((a, b) => b[0] - a[0]);
  let out = js;
  for (const [s, e, t] of edits) out = out.slice(0, s) + t + out.slice(e);
  return '(async function (require, module, exports, __filename, __dirname, __tsb, __tsb_args) {\n' + out + '\n})';
}

function loader(workdir) {
  const req = Module.createRequire(path.join(workdir, 'index.js'));
  const load = (spec) => {
    spec = String(spec);
    if (spec.startsWith('node:') || Module.isBuiltin(spec)) return import(spec);
    return import(pathToFileURL(req.resolve(spec)).href);
  };
  return { req, load };
}

async function evaluate(source, args) {
  const fn = scriptFunction(stripTypes(source));
  const workdir = process.cwd();
  const { req, load } = loader(workdir);
  const filename = path.join(workdir, 'tool.js');
  const mod = { exports: {}, require: req, filename, id: '.', loaded: false };
  const compiled = vm.runInThisContext(fn, { filename });
  return await compiled(req, mod, mod.exports, filename, workdir, { load }, args);
}

// ---- results -------------------------------------------------------------

// Letta's parse_typescript_result over the text the kernel shows.
const PY_TYPE = (v) => v === null ? 'NoneType' : Array.isArray(v) ? 'list' : typeof v === 'string' ? 'str'
  : typeof v === 'boolean' ? 'bool' : Number.isInteger(v) ? 'int' : 'float';

function executePayload(value) {
  const text = typeof value === 'string' ? value : util.inspect(value);
  if (!text) return { payload: JSON.stringify({ results: null, agent_state: null }), code: EXIT_OK };
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch (_) {
    return { payload: JSON.stringify({ results: text, agent_state: null }), code: EXIT_OK };
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    const message = "'" + PY_TYPE(parsed) + "' object has no attribute 'get'";
    return { payload: errorPayload('tool', 'AttributeError', message), code: EXIT_TOOL_ERROR };
  }
  const results = parsed.results === undefined ? null : parsed.results;
  return { payload: JSON.stringify({ results, agent_state: null }), code: EXIT_OK };
}

function toolPayload(value) {
  // As Letta's script: JSON.stringify({results, agent_state: null}).
  const payload = JSON.stringify({ results: value, agent_state: null });
  return { payload: payload.startsWith('{"results"') ? payload : '{"results":null,' + payload.slice(1), code: EXIT_OK };
}

// ---- the program ---------------------------------------------------------

let answered = false;

function answer(payload, code) {
  if (answered) return;
  answered = true;
  try {
    writeAll(payload);
  } catch (e) {
    process.stderr.write('RuntimeError: cannot send the result: ' + e.message + '\n');
    code = EXIT_NO_RESULT;
  }
  process.exit(code);
}

function toolFailed(e) {
  const { name, message } = errorNameMessage(e);
  let stack = '';
  try { stack = e && e.stack ? String(e.stack) : name + ': ' + message; } catch (_) { stack = name + ': ' + message; }
  try { fs.writeSync(2, stack + '\n'); } catch (_) { /* stderr closed */ }
  answer(errorPayload('tool', name, message), EXIT_TOOL_ERROR);
}

async function main() {
  let first, second;
  try {
    if (!fs.fstatSync(CHANNEL).isSocket()) throw new Error('stdin must be the result channel, a stream socket');
    first = readPart();
    writeAll(DECLARATION);
    second = readPart();
  } catch (e) {
    process.stderr.write('RuntimeError: cannot read the request: ' + e.message + '\n');
    process.exit(EXIT_NO_RESULT);
  }
  let program;
  const execute = Object.prototype.hasOwnProperty.call(first, 'script');
  try {
    const known = execute ? ['script'] : ['tool_name', 'source_code'];
    const known2 = execute ? ['env'] : ['args', 'json_schema', 'agent_state', 'agent_id', 'env'];
    const unknown = Object.keys(first).filter((k) => !known.includes(k)).concat(Object.keys(second).filter((k) => !known2.includes(k)));
    if (unknown.length) throw new RequestError('unknown request field(s): ' + unknown.map((k) => JSON.stringify(k)).join(', '));
    if (second.agent_state != null) throw new RequestError('a TypeScript tool gets no agent_state');
    if (execute && typeof first.script !== 'string') throw new RequestError('script must be a string');
    program = execute ? { code: first.script, args: {} } : toolProgram(first, second);
    const env = second.env == null ? {} : second.env;
    if (typeof env !== 'object' || Array.isArray(env)) throw new RequestError('env must be an object');
    for (const [k, v] of Object.entries(env)) process.env[k] = String(v);
  } catch (e) {
    if (!(e instanceof RequestError)) throw e;
    process.stderr.write('ValueError: ' + e.message + '\n');
    answer(errorPayload('request', 'ValueError', e.message), EXIT_REQUEST_ERROR);
    return;
  }
  first = second = undefined;
  // From here on the tool's code runs: what it throws from a callback, or a
  // promise it leaves rejected, is its failure.
  process.on('uncaughtException', toolFailed);
  process.on('unhandledRejection', toolFailed);
  // A promise that never settles keeps the run waiting, as it keeps E2B's
  // cell waiting, until the run's timeout: node would otherwise exit
  // without a result once nothing else is pending.
  setInterval(() => {}, 1 << 30);
  let value;
  try {
    value = await evaluate(program.code, program.args);
  } catch (e) {
    toolFailed(e);
    return;
  }
  let out;
  try {
    out = execute ? executePayload(value) : toolPayload(value);
  } catch (e) {
    toolFailed(e);
    return;
  }
  answer(out.payload, out.code);
}

main().catch((e) => {
  process.stderr.write('RuntimeError: ' + (e && e.message) + '\n');
  process.exit(EXIT_NO_RESULT);
});

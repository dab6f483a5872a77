"""Letta's TypeScript tool path, as the reference the daemon is compared with.

Written from letta-ai/letta, the last release of the server:
  letta/services/tool_sandbox/typescript_generator.py
      convert_param_to_ts_value, is_async_typescript_function,
      generate_typescript_execution_script, parse_typescript_result
  letta/services/tool_sandbox/e2b_sandbox.py  what the E2B sandbox makes of an
      execution (its first result's text, its error, or neither)
  letta/utils.py  get_friendly_error_msg

The generator's output is the script Letta's E2B sandbox runs with
run_code(language="ts"); the daemon's execute runs the same text locally.
"""

import json
import re

MAX_ERROR_MESSAGE_CHAR_LIMIT = 1000


def convert_param_to_ts_value(param_type, raw_value):
    if raw_value is None:
        return "null"
    if param_type == "string":
        return json.dumps(raw_value)
    if param_type in ("number", "integer"):
        return str(raw_value)
    if param_type == "boolean":
        if isinstance(raw_value, bool):
            return "true" if raw_value else "false"
        if isinstance(raw_value, int) and raw_value in (0, 1):
            return "true" if raw_value else "false"
        if isinstance(raw_value, str) and raw_value.strip().lower() in ("true", "false"):
            return raw_value.strip().lower()
        raise ValueError(f"Invalid boolean value: {raw_value}")
    if param_type in ("array", "object"):
        return json.dumps(raw_value)
    return json.dumps(raw_value)


def is_async_typescript_function(source_code, function_name):
    if re.search(rf"export\s+async\s+function\s+{re.escape(function_name)}", source_code):
        return True
    return bool(re.search(rf"export\s+const\s+{re.escape(function_name)}\s*=\s*async", source_code))


def generate_typescript_execution_script(tool_name, tool_source_code, args, json_schema, env_vars_to_inject=None):
    lines = []
    import_pattern = r"^import\s+.+?['\"];?\s*$"
    user_imports = re.findall(import_pattern, tool_source_code, re.MULTILINE)
    source_without_imports = re.sub(import_pattern, "", tool_source_code, flags=re.MULTILINE)
    if user_imports:
        for imp in user_imports:
            lines.append(imp.strip())
        lines.append("")
    lines.extend([
        "// Initialize Letta client for TypeScript tool execution",
        "let client: any = null;",
        "try {",
        "    const { LettaClient } = await import('@letta-ai/letta-client');",
        "    const apiKey = process.env.LETTA_API_KEY;",
        "    if (apiKey) {",
        "        client = new LettaClient({ apiKey });",
        "    }",
        "} catch (e) {",
        "    // Package not available - client remains null",
        "}",
        "",
    ])
    if json_schema is None:
        json_schema = {}
    properties = json_schema.get("parameters", {}).get("properties", {})
    for param_name, param_value in args.items():
        param_spec = properties.get(param_name, {})
        lines.append(f"const {param_name} = {convert_param_to_ts_value(param_spec.get('type'), param_value)};")
    if args:
        lines.append("")
    lines.append(re.sub(r"\bexport\s+", "", source_without_imports).strip())
    lines.append("")
    is_async = is_async_typescript_function(tool_source_code, tool_name)
    parameters = json_schema.get("parameters", {})
    ordered = []
    for param in parameters.get("required", []):
        if param in args:
            ordered.append(param)
    for param in parameters.get("properties", {}).keys():
        if param in args and param not in ordered:
            ordered.append(param)
    for param in args.keys():
        if param not in ordered:
            ordered.append(param)
    func_call = f"{tool_name}({', '.join(ordered)})"
    lines.append(f"const _result = await {func_call};" if is_async else f"const _result = {func_call};")
    lines.append("const _output = { results: _result, agent_state: null };")
    lines.append("JSON.stringify(_output);")
    return "\n".join(lines) + "\n"


def parse_typescript_result(result_text):
    if not result_text:
        return None, None
    try:
        result = json.loads(result_text)
        return result.get("results"), result.get("agent_state")
    except json.JSONDecodeError:
        return result_text, None


def get_friendly_error_msg(function_name, exception_name, exception_message):
    error_msg = f"Error executing function {function_name}: {exception_name}: {exception_message}"
    if len(error_msg) > MAX_ERROR_MESSAGE_CHAR_LIMIT:
        error_msg = error_msg[:MAX_ERROR_MESSAGE_CHAR_LIMIT]
    return error_msg


def e2b_result(tool_name, completion_text=None, error=None):
    """What Letta's E2B sandbox returns for an execution whose first result's
    text is `completion_text`, or which raised `error` = (name, value):
    (status, func_return)."""
    if completion_text is not None:
        return "success", parse_typescript_result(completion_text)[0]
    if error is not None:
        return "error", get_friendly_error_msg(tool_name, error[0], error[1])
    raise ValueError(f"Tool {tool_name} returned execution with None")

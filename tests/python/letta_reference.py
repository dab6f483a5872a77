"""Letta's own local tool sandbox, as the reference the daemon is compared with.

Written from letta-ai/letta, the last release of the server:
  letta/services/tool_sandbox/base.py          _render_sandbox_code (the current
                                               generator), initialize_param,
                                               invoke_function_call, the marker
  letta/services/tool_sandbox/local_sandbox.py run, _execute_tool_subprocess,
                                               parse_out_function_results_markers
  letta/services/helpers/tool_parser_helper.py parse_function_arguments,
                                               convert_param_to_str_value,
                                               parse_stdout_best_effort
  letta/schemas/sandbox_config.py              SandboxConfig.fingerprint
  letta/utils.py                               get_friendly_error_msg,
                                               parse_stderr_error_msg
  letta/services/tool_executor/tool_execution_manager.py (what an exception
                                               of the sandbox becomes)

What it covers: tools without args_json_schema. A tool that takes
agent_state gets, in Letta's script, a pickle of Letta's AgentState, which
needs letta itself: make_venv() can add LETTA_STAND_IN, the part of Letta's
schemas a tool sees. Letta's script imports pydantic v2 to serialize the
result; Debian 12 has only pydantic 1 (no ConfigDict), with which the script
returns str(result). So that the reference is Letta as its users run it (in
letta-server's environment, which has pydantic v2), make_venv() builds a venv
holding a minimal pydantic stand-in (BaseModel, ConfigDict) whose model_dump
returns the result as pydantic v2 does for JSON values; the reference and the
daemon's sandbox both run with that venv.

The client set-up lines of the generator (letta_client) are shortened: they
run only when letta_client is importable, which it is not here.
"""

import ast
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import uuid

START_MARKER = uuid.uuid5(uuid.NAMESPACE_DNS, "local-sandbox-result-start-marker").bytes
RESULT_VAR = "result_ZQqiequkcFwRwwGQMqkt"
MAX_ERROR_MESSAGE_CHAR_LIMIT = 1000

PYDANTIC_STAND_IN = '''
class ConfigDict(dict):
    pass


def _dump(value):
    # pydantic v2 serializes an Any field by the value's type: models
    # (letta's schemas) become dicts, also inside lists and dicts.
    if hasattr(type(value), "model_dump"):
        return value.model_dump()
    if isinstance(value, (list, tuple)):
        return type(value)(_dump(v) for v in value)
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


class BaseModel:
    def __init__(self, **fields):
        self.__dict__.update(fields)

    def model_dump(self, **kw):
        return {k: _dump(v) for k, v in self.__dict__.items()}
'''


# Letta's schemas as a tool sees them (letta/schemas/{agent,memory,block}.py):
# pydantic models with validate_assignment, so fields are attributes, a name
# that is not a field cannot be set, a Block's value must be a string (NUL
# characters removed), models are not subscriptable and iterate as
# (name, value) pairs. Enough of letta for Letta's script to run a tool that
# takes agent_state: `import letta`, `from letta import *`, the pickled
# AgentState, agent_state.model_dump(mode="json").
LETTA_STAND_IN = {
    "letta/__init__.py": """
from letta.schemas.agent import AgentState
from letta.schemas.block import Block
from letta.schemas.memory import Memory
""",
    "letta/schemas/__init__.py": "",
    "letta/schemas/base.py": """
import copy
import uuid


class LettaBase:
    nested = {}

    def __init__(self, **data):
        # Fields in declaration order, as pydantic dumps them.
        data = dict(self.defaults(), **data)
        for name, value in data.items():
            self.__dict__[name] = self.validate_field(name, value)

    @classmethod
    def defaults(cls):
        return {}

    @classmethod
    def model_validate(cls, data):
        if not isinstance(data, dict):
            raise ValueError("1 validation error for " + cls.__name__)
        obj = cls.__new__(cls)
        for name, value in data.items():
            obj.__dict__[name] = obj.validate_field(name, value)
        return obj

    def validate_field(self, name, value):
        kind = self.nested.get(name)
        if kind is None:
            return value
        if isinstance(value, list):
            return [kind.model_validate(v) if isinstance(v, dict) else v for v in value]
        return kind.model_validate(value) if isinstance(value, dict) else value

    def __setattr__(self, name, value):
        if name not in self.__dict__:
            raise ValueError('"%s" object has no field "%s"' % (type(self).__name__, name))
        self.__dict__[name] = self.validate_field(name, value)

    def __iter__(self):
        yield from self.__dict__.items()

    def __eq__(self, other):
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def model_dump(self, mode="python", **kw):
        def dump(v):
            if isinstance(v, LettaBase):
                return v.model_dump(mode)
            if isinstance(v, list):
                return [dump(x) for x in v]
            if isinstance(v, dict):
                return {k: dump(x) for k, x in v.items()}
            return v
        return {k: dump(v) for k, v in self.__dict__.items()}
""",
    "letta/schemas/block.py": """
import uuid

from letta.schemas.base import LettaBase


class Block(LettaBase):
    @classmethod
    def defaults(cls):
        # "value" (required) first, where Letta's model has it.
        return {"value": None, "limit": 100000, "project_id": None, "template_name": None, "is_template": False,
                "template_id": None, "base_template_id": None, "deployment_id": None, "entity_id": None,
                "preserve_on_migration": False, "label": None, "read_only": False, "description": None,
                "metadata": {}, "hidden": None, "id": "block-%s" % uuid.uuid4(), "created_by_id": None,
                "last_updated_by_id": None, "tags": []}

    def __init__(self, **data):
        if "value" not in data:
            raise ValueError("1 validation error for Block")
        super().__init__(**data)

    def validate_field(self, name, value):
        if name == "value":
            if not isinstance(value, str):
                raise ValueError("1 validation error for Block")
            return value.replace("\\x00", "")
        return value
""",
    "letta/schemas/memory.py": """
from letta.schemas.base import LettaBase
from letta.schemas.block import Block


class Memory(LettaBase):
    nested = {"blocks": Block, "file_blocks": Block}

    def list_block_labels(self):
        return [block.label for block in self.blocks]

    def get_block(self, label):
        keys = []
        for block in self.blocks:
            if block.label == label:
                return block
            keys.append(block.label)
        raise KeyError(f"Block field {label} does not exist (available sections = {', '.join(keys)})")

    def get_blocks(self):
        return self.blocks

    def set_block(self, block):
        for i, b in enumerate(self.blocks):
            if b.label == block.label:
                self.blocks[i] = block
                return
        self.blocks.append(block)

    def update_block_value(self, label, value):
        if not isinstance(value, str):
            raise ValueError("Provided value must be a string")
        for block in self.blocks:
            if block.label == label:
                block.value = value
                return
        raise ValueError(f"Block with label {label} does not exist")
""",
    "letta/schemas/agent.py": """
from letta.schemas.base import LettaBase
from letta.schemas.block import Block
from letta.schemas.memory import Memory


class AgentEnvironmentVariable(LettaBase):
    pass


class LLMConfig(LettaBase):
    pass


class AgentState(LettaBase):
    nested = {"memory": Memory, "blocks": Block, "secrets": AgentEnvironmentVariable, "llm_config": LLMConfig}

    def get_agent_env_vars_as_dict(self):
        return {v.key: v.value or "" for v in self.secrets}
""",
}


def get_friendly_error_msg(function_name, exception_name, exception_message):
    error_msg = f"Error executing function {function_name}: {exception_name}: {exception_message}"
    if len(error_msg) > MAX_ERROR_MESSAGE_CHAR_LIMIT:
        error_msg = error_msg[:MAX_ERROR_MESSAGE_CHAR_LIMIT]
    return error_msg


def parse_stderr_error_msg(stderr_txt, last_n_lines=3):
    index = -(last_n_lines + 1)
    pattern = r"(\w+(?:Error|Exception)): (.+?)$"
    for line in stderr_txt.split("\n")[:index:-1]:
        if "Error" in line or "Exception" in line:
            match = re.search(pattern, line)
            if match:
                return match.group(1), match.group(2)
    return "", ""


def sandbox_config_fingerprint(config):
    """SandboxConfig.fingerprint() (letta/schemas/sandbox_config.py) of a
    config given as {"type", "organization_id", "config"}: its organization
    as it is, None included."""
    text = json.dumps({"type": config["type"], "organization_id": config["organization_id"], "config": config["config"]},
                      sort_keys=True, separators=(",", ":"))
    return str(int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest(), byteorder="big"))


def parse_function_arguments(source_code, tool_name):
    tree = ast.parse(source_code)
    args = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == tool_name:
            for arg in node.args.args:
                args.append(arg.arg)
    return args


def convert_param_to_str_value(param_type, raw_value):
    valid_types = {"string", "integer", "boolean", "number", "array", "object"}
    if param_type not in valid_types:
        raise TypeError(f"Unsupported type: {param_type}, raw_value={raw_value}")
    if param_type == "string":
        return repr(raw_value)
    if param_type == "integer":
        return str(int(raw_value))
    if param_type == "boolean":
        if isinstance(raw_value, bool):
            return str(raw_value)
        if isinstance(raw_value, int) and raw_value in (0, 1):
            return str(bool(raw_value))
        if isinstance(raw_value, str) and raw_value.strip().lower() in ("true", "false"):
            return raw_value.strip().lower().capitalize()
        raise ValueError(f"Invalid boolean value: {raw_value}")
    return str(raw_value)


def initialize_param(props, name, raw_value):
    """The argument's line, as both generators' initialize_param (args not in
    the schema are skipped)."""
    spec = props.get(name)
    if spec is None:
        return ""
    param_type = spec.get("type")
    if param_type is None and spec.get("parameters"):
        param_type = spec["parameters"].get("type")
    return f"{name} = {convert_param_to_str_value(param_type, raw_value)}\n"


def generate_script(tool_name, source_code, args, json_schema, agent_state_pickle=None, agent_id=None):
    """_render_sandbox_code(wrap_print_with_markers=True) for a tool without
    args_json_schema. agent_state_pickle: pickle.dumps(agent_state), agent_id:
    agent_state.id (both None without an agent state)."""
    props = json_schema["parameters"]["properties"]
    is_async = any(isinstance(n, ast.AsyncFunctionDef) and n.name == tool_name for n in ast.walk(ast.parse(source_code)))
    declared = parse_function_arguments(source_code, tool_name)
    inject_agent_state = "agent_state" in declared
    inject_agent_id = "agent_id" in declared
    if not inject_agent_state:
        agent_state_pickle = None
    tool_args = "".join(initialize_param(props, name, value) for name, value in args.items())
    params = [f"{a}={a}" for a in args if a in props]
    if inject_agent_state:
        params.append("agent_state=agent_state")
    if inject_agent_id:
        params.append("agent_id=agent_id")
    call = tool_name + "(" + ", ".join(params) + ")"

    lines = ["from typing import *", "import pickle", "import json as _letta_json", "import sys", "import base64",
             "import struct", "import hashlib"]
    if is_async:
        lines.append("import asyncio")
    if inject_agent_state:
        lines += ["import letta", "from letta import *"]
    lines += ["try:", "    from letta_client import Letta", "except ImportError:", "    Letta = None"]
    if agent_state_pickle is not None:
        lines.append(f"agent_state = pickle.loads({agent_state_pickle!r})")
    else:
        lines.append("agent_state = None")
    lines += ["# Initialize Letta client for tool execution", "import os", "client = None",
              "if Letta is not None and os.getenv('LETTA_API_KEY'):", "    client = Letta(api_key=os.getenv('LETTA_API_KEY'))"]
    if inject_agent_id:
        lines.append(f"agent_id = {agent_id!r}" if agent_id else "agent_id = None")
    if tool_args:
        lines.append(tool_args.rstrip())
    lines.append(source_code.rstrip())
    if args:
        raw_args = ", ".join(f"{n!r}: {n}" for n in args)
        lines += [f"__letta_raw_args = {{{raw_args}}}", "try:",
                  "    from letta.functions.ast_parsers import coerce_dict_args_by_annotations",
                  f"    __letta_func = {tool_name}",
                  "    __letta_annotations = getattr(__letta_func, '__annotations__', {})",
                  "    __letta_coerced_args = coerce_dict_args_by_annotations(",
                  "        __letta_raw_args,", "        __letta_annotations,", "        allow_unsafe_eval=True,",
                  "        extra_globals=__letta_func.__globals__,", "    )"]
        for n in args:
            lines.append(f"    {n} = __letta_coerced_args.get({n!r}, {n})")
        lines += ["except Exception:", "    pass"]
    serialize = ["try:", "    from pydantic import BaseModel, ConfigDict", "    from typing import Any", "",
                 "    class _TempResultWrapper(BaseModel):",
                 "        model_config = ConfigDict(arbitrary_types_allowed=True)", "        result: Any", "",
                 "    _wrapped = _TempResultWrapper(result=_function_result)",
                 "    _serialized_result = _wrapped.model_dump()['result']", "except ImportError:",
                 '    print("Pydantic not available in sandbox environment, falling back to string conversion")',
                 "    _serialized_result = str(_function_result)", "except Exception as e:",
                 '    print(f"Failed to serialize result with Pydantic wrapper: {e}")',
                 "    _serialized_result = str(_function_result)", "",
                 "if agent_state is not None:", "    try:",
                 "        _letta_agent_state_payload = agent_state.model_dump(mode='json')",
                 "    except Exception:", "        _letta_agent_state_payload = None", "else:",
                 "    _letta_agent_state_payload = None"]
    if not is_async:
        lines.append(f"_function_result = {call}")
        lines += serialize
        lines += [f"{RESULT_VAR} = {{", '    "results": _serialized_result,',
                  '    "agent_state": _letta_agent_state_payload', "}"]
    else:
        lines.append("async def _async_wrapper():")
        lines.append(f"    _function_result = await {call}")
        lines += ["    " + line if line else "" for line in serialize]
        lines += ["    return {", '        "results": _serialized_result,',
                  '        "agent_state": _letta_agent_state_payload', "    }"]
        lines.append(f"{RESULT_VAR} = asyncio.run(_async_wrapper())")
    lines.append(f"{RESULT_VAR}_pkl = _letta_json.dumps({RESULT_VAR}, default=str).encode('utf-8')")
    lines += [f"data_checksum = hashlib.md5({RESULT_VAR}_pkl).hexdigest().encode('ascii')",
              f"{RESULT_VAR}_msg = (", f"  {START_MARKER!r} +", f"  struct.pack('>I', len({RESULT_VAR}_pkl)) +",
              "  data_checksum +", f"  {RESULT_VAR}_pkl", ")", f"sys.stdout.buffer.write({RESULT_VAR}_msg)",
              "sys.stdout.buffer.flush()"]
    return "\n".join(lines) + "\n"


def parse_out_function_results_markers(data, errors="strict"):
    pos = data.find(START_MARKER)
    if pos < 0:
        return b"", data.decode("utf-8", errors) if data else ""
    pos_start = pos + len(START_MARKER)
    checksum_start = pos_start + 4
    message_start = checksum_start + 32
    message_len = struct.unpack(">I", data[pos_start:checksum_start])[0]
    checksum = data[checksum_start:message_start]
    message_data = data[message_start:message_start + message_len]
    if hashlib.md5(message_data).hexdigest().encode("ascii") == checksum:
        remainder = data[:pos] + data[message_start + message_len:]
        return message_data, (remainder.decode("utf-8", errors) if remainder else "")
    # Letta's only use of this message: a checksum that does not match (never
    # for output that does not decode, which raises UnicodeDecodeError).
    raise Exception("Function ran, but output is corrupted.")


def parse_stdout_best_effort(text):
    if not text:
        return None, None
    result = json.loads(text.decode("utf-8"))
    return result.get("results"), result.get("agent_state") or None


def make_venv(path, letta=True):
    """A venv at path (system site-packages off) with the pydantic stand-in
    and, when letta is true, the letta one; readable by anyone (a sandbox's
    ids). Returns its python3."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", path], check=True, capture_output=True)
    python = os.path.join(path, "bin", "python3")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    with open(os.path.join(site, "pydantic.py"), "w") as f:
        f.write(PYDANTIC_STAND_IN)
    for name, text in (LETTA_STAND_IN.items() if letta else ()):
        os.makedirs(os.path.dirname(os.path.join(site, name)), exist_ok=True)
        with open(os.path.join(site, name), "w") as f:
            f.write(text)
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            p = os.path.join(root, n)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | 0o005 | (0o040 if os.path.isdir(p) else 0))
    os.chmod(path, 0o755)
    return python


def pickle_agent_state(agent_state, python):
    """pickle.dumps(AgentState.model_validate(agent_state)), made by the
    venv's python (where the letta stand-in lives)."""
    code = ("import json, pickle, sys\nfrom letta.schemas.agent import AgentState\n"
            "sys.stdout.buffer.write(pickle.dumps(AgentState.model_validate(json.loads(sys.stdin.read()))))")
    return subprocess.run([python, "-c", code], input=json.dumps(agent_state).encode(), check=True,
                          capture_output=True).stdout


def letta_script(tool_name, source_code, args, json_schema, python, agent_state=None):
    """Letta's generated script for this call; agent_state is the JSON of
    Letta's AgentState (model_dump(mode="json")) or None."""
    declared = parse_function_arguments(source_code, tool_name)
    pickled = pickle_agent_state(agent_state, python) if agent_state is not None and "agent_state" in declared else None
    agent_id = agent_state["id"] if agent_state else None
    return generate_script(tool_name, source_code, args, json_schema, pickled, agent_id)


def run_local(tool_name, source_code, args, json_schema, python, env=None, timeout=60.0, agent_state=None,
              decode_errors="strict"):
    """AsyncToolSandboxLocal.run for this tool, as a ToolExecutionResult dict
    (without sandbox_config_fingerprint); agent_state as JSON, and so in the
    result (Letta's AgentState.model_validate of it, dumped again). An
    exception the sandbox raises (the timeout) becomes what
    ToolExecutionManager returns for it. decode_errors: how its
    _execute_tool_subprocess decodes stderr and stdout ("strict" in Letta;
    "replace" is the daemon's tool mode, PROTOCOL.md 13.2)."""
    script = letta_script(tool_name, source_code, args, json_schema, python, agent_state)
    with tempfile.TemporaryDirectory() as sandbox_dir:
        with tempfile.NamedTemporaryFile(mode="w", dir=sandbox_dir, suffix=".py", delete=False) as temp_file:
            temp_file.write(script)
        exec_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": sandbox_dir, "LANG": "C.UTF-8"}
        exec_env.update(env or {})
        exec_env.update({"PYTHONWARNINGS": "ignore", "NO_COLOR": "1", "TERM": "dumb", "PYTHONUNBUFFERED": "1"})
        stdout_text = ""
        try:
            try:
                proc = subprocess.run([python, temp_file.name], env=exec_env, cwd=sandbox_dir, capture_output=True,
                                      timeout=timeout)
            except subprocess.TimeoutExpired:
                msg = f"Executing tool {tool_name} timed out after {timeout} seconds."
                return {"status": "error", "func_return": get_friendly_error_msg(tool_name, "TimeoutError", msg),
                        "agent_state": None, "stdout": None, "stderr": ["TimeoutError: " + msg]}
            stderr = proc.stderr.decode("utf-8", decode_errors) if proc.stderr else ""
            func_result_bytes, stdout_text = parse_out_function_results_markers(proc.stdout, decode_errors)
            func_return, agent_state = parse_stdout_best_effort(func_result_bytes)
            if proc.returncode != 0 and func_return is None:
                exception_name, msg = parse_stderr_error_msg(stderr)
                func_return = get_friendly_error_msg(tool_name, exception_name, msg)
            return {"status": "success" if proc.returncode == 0 else "error", "func_return": func_return,
                    "agent_state": agent_state, "stdout": [stdout_text] if stdout_text else [],
                    "stderr": [stderr] if stderr else []}
        except Exception as e:
            return {"status": "error", "func_return": get_friendly_error_msg(tool_name, type(e).__name__, str(e)),
                    "agent_state": None, "stdout": [stdout_text], "stderr": [str(e)]}


# --- The seed: ToolExecutionSandbox before PR #3343 --------------------------
#
# letta/services/tool_executor/tool_execution_sandbox.py at 1131535~1:
# generate_execution_script(wrap_print_with_markers=True), the venv path
# (run_local_dir_sandbox_venv) and parse_best_effort, which pickle.loads the
# base64 between the text markers in the server.

LEGACY_START = str(uuid.uuid5(uuid.NAMESPACE_DNS, "local-sandbox-result-start-marker"))
LEGACY_END = str(uuid.uuid5(uuid.NAMESPACE_DNS, "local-sandbox-result-end-marker"))


def seed_script(tool_name, source_code, args, json_schema, python, agent_state=None, json_result=False):
    """json_result: the same generator after PR #3343 (legacy-json), whose
    result is base64(json.dumps(..., default=str)) of the agent state dumped
    before the call."""
    props = json_schema["parameters"]["properties"]
    inject = "agent_state" in parse_function_arguments(source_code, tool_name)
    code = "from typing import *\nimport pickle\n"
    if json_result:
        code += "import json as _letta_json\n"
    code += "import sys\nimport base64\n"
    if inject:
        code += "import letta\nfrom letta import * \n"
        pickled = pickle_agent_state(agent_state, python) if agent_state is not None else b"\x80\x04N."
        code += f"agent_state = pickle.loads({pickled})\n"
    else:
        code += "agent_state = None\n"
    code += "".join(initialize_param(props, name, value) for name, value in args.items())
    code += "\n" + source_code + "\n"
    if args:
        code += "__letta_raw_args = {" + ", ".join(f"{n!r}: {n}" for n in args) + "}\n"
        code += ("try:\n    from letta.functions.ast_parsers import coerce_dict_args_by_annotations\n"
                 f"    __letta_func = {tool_name}\n"
                 "    __letta_annotations = getattr(__letta_func, '__annotations__', {})\n"
                 "    __letta_coerced_args = coerce_dict_args_by_annotations(\n        __letta_raw_args,\n"
                 "        __letta_annotations,\n        allow_unsafe_eval=True,\n"
                 "        extra_globals=__letta_func.__globals__,\n    )\n")
        for n in args:
            code += f"    {n} = __letta_coerced_args.get({n!r}, {n})\n"
        code += "except Exception:\n    pass\n"
    params = [f"{a}={a}" for a in args if a in props]
    if inject:
        params.append("agent_state=agent_state")
    call = tool_name + "(" + ", ".join(params) + ")"
    if json_result:
        code += ("if agent_state is not None:\n    try:\n"
                 "        _letta_agent_state_payload = agent_state.model_dump(mode='json')\n"
                 "    except Exception:\n        _letta_agent_state_payload = None\n"
                 "else:\n    _letta_agent_state_payload = None\n")
        code += RESULT_VAR + ' = {"results": ' + call + ', "agent_state": _letta_agent_state_payload}\n'
        code += (f"{RESULT_VAR} = base64.b64encode("
                 f"_letta_json.dumps({RESULT_VAR}, default=str).encode('utf-8')).decode('utf-8')\n")
    else:
        code += RESULT_VAR + ' = {"results": ' + call + ', "agent_state": agent_state}\n'
        code += f"{RESULT_VAR} = base64.b64encode(pickle.dumps({RESULT_VAR})).decode('utf-8')\n"
    code += f"sys.stdout.write('{LEGACY_START}')\nsys.stdout.write(str({RESULT_VAR}))\nsys.stdout.write('{LEGACY_END}')\n"
    return code


def seed_unpickle(text, python):
    """What the seed's server got from parse_best_effort, as the JSON its
    ToolExecutionResult becomes (a model in func_return: its fields):
    pickle.loads in letta-server's own environment (the venv, which has the
    letta stand-in)."""
    code = ("import base64, json, pickle, sys\nr = pickle.loads(base64.b64decode(sys.stdin.read()))\n"
            "s = r['agent_state']\n"
            "sys.stdout.write(json.dumps({'results': r['results'],"
            " 'agent_state': s.model_dump(mode='json') if s is not None else None}, allow_nan=True,"
            " default=lambda o: o.model_dump(mode='json') if hasattr(o, 'model_dump') else str(o)))")
    out = subprocess.run([python, "-c", code], input=text.encode(), check=True, capture_output=True).stdout
    return json.loads(out)


def run_seed(tool_name, source_code, args, json_schema, python, env=None, agent_state=None, json_result=False,
             python_values=False):
    """The seed's run_local_dir_sandbox_venv for this tool (success path),
    as a ToolExecutionResult dict without the fingerprint; json_result: the
    legacy-json generation (its parse_best_effort: base64, UTF-8, json.loads,
    AgentState.model_validate of a truthy agent_state). python_values: the
    func_return the seed's server held, its parse_best_effort's pickle.loads
    here (for results of builtin types: tuples, sets, bytes, keys of any
    type), instead of its JSON."""
    script = seed_script(tool_name, source_code, args, json_schema, python, agent_state, json_result)
    with tempfile.TemporaryDirectory() as sandbox_dir:
        path = os.path.join(sandbox_dir, "tool.py")
        with open(path, "w") as f:
            f.write(script)
        exec_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": sandbox_dir, "LANG": "C.UTF-8"}
        exec_env.update(env or {})
        exec_env["PYTHONWARNINGS"] = "ignore"
        try:
            # text=True: stdout, then stderr, decoded strictly in the server
            # (its locale's encoding, UTF-8).
            proc = subprocess.run([python, path], env=exec_env, cwd=sandbox_dir, timeout=60, capture_output=True,
                                  text=True, encoding="utf-8", check=True)
        except UnicodeDecodeError as e:
            # Raised out of the sandbox; ToolExecutionManager reports it.
            import traceback

            return {"status": "error", "func_return": get_friendly_error_msg(tool_name, type(e).__name__, str(e)),
                    "agent_state": None, "stdout": None, "stderr": [traceback.format_exc()]}
        text = proc.stdout
        if LEGACY_START not in text:
            func_result, stdout = "", text
        else:
            start = text.index(LEGACY_START) + len(LEGACY_START)
            end = text.index(LEGACY_END)
            func_result, stdout = text[start:end], text[:start - len(LEGACY_START)] + text[end + len(LEGACY_END):]
        if not func_result:
            decoded = {"results": None, "agent_state": None}
        elif json_result:
            import base64

            result = json.loads(base64.b64decode(func_result).decode("utf-8"))
            decoded = {"results": result.get("results"), "agent_state": result.get("agent_state") or None}
        elif python_values:
            import base64
            import pickle

            decoded = {"results": pickle.loads(base64.b64decode(func_result))["results"], "agent_state": None}
        else:
            decoded = seed_unpickle(func_result, python)
        return {"status": "success", "func_return": decoded["results"], "agent_state": decoded["agent_state"],
                "stdout": [stdout] if stdout else [], "stderr": [proc.stderr] if proc.stderr else []}


# ---------------------------------------------------------------------------
# TypeScript tools on E2B
# ---------------------------------------------------------------------------
# Restated from letta/services/tool_sandbox/typescript_generator.py (the
# generator and parser, verbatim but for docstrings) and
# letta/services/tool_sandbox/e2b_sandbox.py (AsyncToolSandboxE2B.run: what
# an execution becomes).


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
    pattern1 = rf"export\s+async\s+function\s+{re.escape(function_name)}"
    if re.search(pattern1, source_code):
        return True
    pattern2 = rf"export\s+const\s+{re.escape(function_name)}\s*=\s*async"
    if re.search(pattern2, source_code):
        return True
    return False


def generate_typescript_execution_script(tool_name, tool_source_code, args, json_schema, env_vars_to_inject=None):
    lines = []
    import_pattern = r"^import\s+.+?['\"];?\s*$"
    user_imports = re.findall(import_pattern, tool_source_code, re.MULTILINE)
    source_without_imports = re.sub(import_pattern, "", tool_source_code, flags=re.MULTILINE)
    if user_imports:
        for imp in user_imports:
            lines.append(imp.strip())
        lines.append("")
    lines.extend(
        [
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
        ]
    )
    if json_schema is None:
        json_schema = {}
    properties = json_schema.get("parameters", {}).get("properties", {})
    for param_name, param_value in args.items():
        param_spec = properties.get(param_name, {})
        param_type = param_spec.get("type")
        ts_value = convert_param_to_ts_value(param_type, param_value)
        lines.append(f"const {param_name} = {ts_value};")
    if args:
        lines.append("")
    stripped_source = re.sub(r"\bexport\s+", "", source_without_imports)
    lines.append(stripped_source.strip())
    lines.append("")
    is_async = is_async_typescript_function(tool_source_code, tool_name)
    parameters = json_schema.get("parameters", {})
    required_params = parameters.get("required", [])
    schema_properties = parameters.get("properties", {})
    ordered_params = []
    for param in required_params:
        if param in args:
            ordered_params.append(param)
    for param in schema_properties.keys():
        if param in args and param not in ordered_params:
            ordered_params.append(param)
    for param in args.keys():
        if param not in ordered_params:
            ordered_params.append(param)
    params_str = ", ".join(ordered_params)
    func_call = f"{tool_name}({params_str})"
    if is_async:
        lines.append(f"const _result = await {func_call};")
    else:
        lines.append(f"const _result = {func_call};")
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


def e2b_typescript_result(tool_name, results, error, stdout, stderr):
    """AsyncToolSandboxE2B.run for a TypeScript tool, from what run_code
    returned: `results` the texts of execution.results, `error` None or
    (name, value, traceback), `stdout`/`stderr` execution.logs' lists. An
    exception it raises is what Letta's manager reports (its message)."""
    stderr = list(stderr)
    if results:
        func_return, agent_state = parse_typescript_result(results[0])
    elif error:
        func_return = get_friendly_error_msg(function_name=tool_name, exception_name=error[0], exception_message=error[1])
        stderr.append(error[2])
    else:
        raise ValueError(f"Tool {tool_name} returned execution with None")
    return {"func_return": func_return, "agent_state": None, "stdout": list(stdout), "stderr": stderr,
            "status": "error" if error else "success"}

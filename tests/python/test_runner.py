"""Tests for daemon/runner/toolsandbox_runner.py.

Run with either of:

    /usr/bin/python3 -m unittest discover -s tests/python -p test_runner.py -v
    /usr/bin/python3 tests/python/test_runner.py -v
    /usr/bin/python3 -m pytest tests/python/test_runner.py     (if pytest is installed)

The runner is started the way the engine starts it (python3 -I -S -B -u -X
utf8, request on a stdin pipe). TSB_RUNNER_PYTHON selects the interpreter
(default /usr/bin/python3). The frame parser below mirrors
extract_nonce_frame in protocol/letta.cc; tests/unit/letta_test.cc checks the
C++ side against the real runner too.
"""

import base64
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.normpath(os.path.join(HERE, "..", "..", "daemon", "runner", "toolsandbox_runner.py"))
PYTHON = os.environ.get("TSB_RUNNER_PYTHON", "/usr/bin/python3")
FLAGS = ["-I", "-S", "-B", "-u", "-X", "utf8"]
# As the daemon starts it (kRunnerBoot in daemon/policy/policy.h): imported
# from its directory, put after the standard library, and run.
BOOT = ("import sys\nsys.path.append(%r)\nimport toolsandbox_runner\ntoolsandbox_runner.run()\n"
        % os.path.dirname(RUNNER))
PROGRAM = ["-c", BOOT]

sys.path.insert(0, HERE)
from letta_reference import parse_stderr_error_msg as letta_parse_stderr_error_msg  # noqa: E402

LETTA_START = str(uuid.uuid5(uuid.NAMESPACE_DNS, "local-sandbox-result-start-marker"))
LETTA_END = str(uuid.uuid5(uuid.NAMESPACE_DNS, "local-sandbox-result-end-marker"))
LETTA_MARKER = uuid.uuid5(uuid.NAMESPACE_DNS, "local-sandbox-result-start-marker").bytes


class FrameError(Exception):
    pass


def extract_frame(out, nonce):
    """(payload or None, stdout without the frame); FrameError when malformed."""
    start = b"<<TSB-RESULT-" + nonce.encode() + b">>"
    end = b"<<TSB-END-" + nonce.encode() + b">>"
    i = out.find(start)
    if i < 0:
        if end in out:
            raise FrameError("end marker without start")
        return None, out
    if out.find(start, i + 1) >= 0:
        raise FrameError("start marker occurs more than once")
    j = out.find(end, i + len(start))
    if j < 0:
        raise FrameError("unterminated")
    if out.count(end) != 1:
        raise FrameError("end marker occurs more than once")
    payload = json.loads(base64.b64decode(out[i + len(start) : j], validate=True))
    before, after = out[:i], out[j + len(end) :]
    if before.endswith(b"\n"):
        before = before[:-1]
    if after.startswith(b"\n"):
        after = after[1:]
    return payload, before + after


class Run:
    def __init__(self, proc, nonce):
        self.code = proc.returncode
        self.raw_stdout = proc.stdout
        self.stderr = proc.stderr.decode("utf-8", "replace")
        self.payload, rest = extract_frame(proc.stdout, nonce)
        self.stdout = rest.decode("utf-8", "replace")

    @property
    def results(self):
        return self.payload["results"]

    @property
    def error(self):
        return self.payload.get("error")

    def __repr__(self):
        return "Run(code=%r, payload=%r, stdout=%r, stderr=%r)" % (self.code, self.payload, self.stdout, self.stderr)


def run_tool(source, tool_name, args=None, *, json_schema=None, agent_state=None, agent_id=None,
             request=None, nonce=None, prefix=(), flags=FLAGS, stdin_file=None):
    nonce = nonce if nonce is not None else secrets.token_hex(16)
    if request is None:
        request = {"nonce": nonce, "tool_name": tool_name, "source_code": source}
        if args is not None:
            request["args"] = args
        if json_schema is not None:
            request["json_schema"] = json_schema
        if agent_state is not None:
            request["agent_state"] = agent_state
        if agent_id is not None:
            request["agent_id"] = agent_id
    data = json.dumps(request).encode()
    cmd = [*prefix, PYTHON, *flags, *PROGRAM]
    # A working directory of its own, as the sandbox's: the runner writes the
    # tool's source there (and removes it).
    with tempfile.TemporaryDirectory() as cwd:
        if stdin_file is not None:
            stdin_file.write(data)
            stdin_file.flush()
            stdin_file.seek(0)
            proc = subprocess.run(cmd, stdin=stdin_file, capture_output=True, timeout=60, cwd=cwd)
        else:
            proc = subprocess.run(cmd, input=data, capture_output=True, timeout=60, cwd=cwd)
        run = Run(proc, nonce if isinstance(nonce, str) else "")
        run.cwd = cwd
        run.left_in_cwd = sorted(os.listdir(cwd))
    return run


def schema(*names):
    return {"name": "t", "parameters": {"type": "object", "properties": {n: {"type": "string"} for n in names}}}


class RunnerBasics(unittest.TestCase):
    def test_integers_of_any_size_arrive_exact(self):
        # The daemon forwards the client's digits as they are; more than
        # Python's default 4300 digits must still reach the tool exact, and
        # the tool's own conversions keep the interpreter's default limit.
        digits = "9" * 5000
        nonce = secrets.token_hex(16)
        src = ("import sys\n"
               "def t(x):\n"
               "    limit = sys.get_int_max_str_digits() if hasattr(sys, 'get_int_max_str_digits') else 0\n"
               "    return [x % 1000003, (x + 1).bit_length(), limit]\n")
        data = ('{"nonce": "%s", "tool_name": "t", "source_code": %s, "args": {"x": %s}}'
                % (nonce, json.dumps(src), digits)).encode()
        proc = subprocess.run([PYTHON, *FLAGS, *PROGRAM], input=data, capture_output=True, timeout=60)
        r = Run(proc, nonce)
        self.assertEqual(r.code, 0, r)
        value = 10 ** 5000 - 1
        limit = getattr(sys, "int_info").default_max_str_digits if hasattr(sys.int_info, "default_max_str_digits") else 0
        self.assertEqual(r.results, [value % 1000003, (value + 1).bit_length(), limit])

    def test_sync_tool(self):
        r = run_tool("def add(a: int, b: int = 2):\n    print('adding')\n    return a + b\n", "add",
                     {"a": 40}, json_schema=schema("a", "b"))
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.payload, {"results": 42, "agent_state": None})
        self.assertEqual(r.stdout, "adding\n")

    def test_async_tool(self):
        src = "import asyncio\nasync def slow(x):\n    await asyncio.sleep(0.01)\n    return {'x': x}\n"
        r = run_tool(src, "slow", {"x": [1, "two"]})
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results, {"x": [1, "two"]})

    def test_args_are_data(self):
        marker = os.path.join(tempfile.gettempdir(), "tsb-runner-test-" + secrets.token_hex(4))
        evil = "__import__('os').system('touch %s')" % marker
        src = "def echo(s, n, obj, arr):\n    return [s, type(s).__name__, n, obj, arr]\n"
        r = run_tool(src, "echo", {"s": evil, "n": evil, "obj": {"k": evil}, "arr": [evil]},
                     json_schema=schema("s", "n", "obj", "arr"))
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results, [evil, "str", evil, {"k": evil}, [evil]])
        self.assertFalse(os.path.exists(marker))

    def test_unknown_arg_rejected(self):
        src = "def f(a):\n    print('RAN')\n    return a\n"
        r = run_tool(src, "f", {"a": 1, "b": 2}, json_schema=schema("a"))
        self.assertEqual(r.code, 2, r)
        self.assertEqual(r.error["kind"], "request")
        self.assertEqual(r.error["name"], "TypeError")
        self.assertIn("'b'", r.error["message"])
        self.assertNotIn("RAN", r.stdout)
        self.assertEqual(letta_parse_stderr_error_msg(r.stderr)[0], "TypeError")

    def test_without_schema_args_go_straight_to_the_call(self):
        r = run_tool("def f(**kw):\n    return sorted(kw)\n", "f", {"b": 1, "a": 2})
        self.assertEqual(r.results, ["a", "b"])
        r = run_tool("def f(a):\n    return a\n", "f", {"zzz": 1})
        self.assertEqual(r.code, 1, r)
        self.assertEqual(r.error["name"], "TypeError")

    def test_missing_function(self):
        r = run_tool("def g():\n    return 1\n", "f")
        self.assertEqual(r.code, 2, r)
        self.assertEqual((r.error["kind"], r.error["name"]), ("request", "NameError"))
        self.assertEqual(letta_parse_stderr_error_msg(r.stderr), ("NameError", "name 'f' is not defined"))

    def test_bad_tool_name(self):
        r = run_tool("x = 1\n", "not valid")
        self.assertEqual(r.code, 2, r)
        self.assertEqual(r.error["kind"], "request")

    def test_unknown_request_field(self):
        nonce = secrets.token_hex(16)
        r = run_tool(None, None, nonce=nonce, request={"nonce": nonce, "tool_name": "f",
                                                         "source_code": "def f(): pass", "environment": {}})
        self.assertEqual(r.code, 2, r)
        self.assertIn("environment", r.error["message"])

    def test_env_reaches_the_tool_and_its_subprocesses(self):
        nonce = secrets.token_hex(16)
        src = ("import os, subprocess, sys\n"
               "def f():\n"
               "    child = subprocess.run(['/bin/sh', '-c', 'printf %s \"$MALLOC_ARENA_MAX\"'],\n"
               "                           capture_output=True, text=True).stdout\n"
               "    return [os.environ.get('MALLOC_ARENA_MAX'), child, '/nowhere/x' in sys.path]\n")
        r = run_tool(None, None, nonce=nonce, request={
            "nonce": nonce, "tool_name": "f", "source_code": src,
            "env": {"MALLOC_ARENA_MAX": "2", "PYTHONPATH": "/nowhere/x"}})
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results, ["2", "2", True])

    def test_env_must_hold_strings(self):
        for env in ({"A": 1}, ["A=1"], {"A=B": "c"}, {"": "x"}, {"A": "a\0b"}):
            nonce = secrets.token_hex(16)
            r = run_tool(None, None, nonce=nonce, request={
                "nonce": nonce, "tool_name": "f", "source_code": "def f(): pass", "env": env})
            self.assertEqual(r.code, 2, (env, r))
            self.assertIn("env", r.error["message"], env)

    def test_typing_names_available_like_letta(self):
        src = "def f(x: Optional[List[int]] = None) -> Dict[str, Any]:\n    return {'x': x}\n"
        r = run_tool(src, "f", {"x": [1]})
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results, {"x": [1]})

    def test_module_is_main_like_lettas_script(self):
        # Letta's script is the main program: its __main__ block runs (after
        # the module's code, before the call), __file__ is a .py file in the
        # working directory that holds the source, removed after the run.
        src2 = ("import os\nif __name__ == '__main__':\n    print('MAIN BLOCK')\n"
                "def f():\n    return [__name__, os.path.dirname(__file__), os.path.basename(__file__), open(__file__).read()]\n")
        r = run_tool(src2, "f")
        self.assertEqual(r.code, 0, r)
        name, dirname, basename, text = r.results
        self.assertEqual(name, "__main__")
        self.assertEqual(dirname, os.path.realpath(r.cwd))
        self.assertRegex(basename, r"^tmp[0-9a-f]{8}\.py$")
        self.assertEqual(text, src2)
        self.assertIn("MAIN BLOCK", r.stdout)
        self.assertEqual(r.left_in_cwd, [])

    def test_tool_classes_have_no_module_prefix(self):
        src = "class QuotaError(Exception):\n    pass\ndef f():\n    raise QuotaError('over')\n"
        r = run_tool(src, "f")
        self.assertEqual(r.stderr.rstrip("\n").split("\n")[-1], "QuotaError: over")
        self.assertEqual(letta_parse_stderr_error_msg(r.stderr), ("QuotaError", "over"))

    def test_stdin_is_empty_for_the_tool(self):
        r = run_tool("import sys\ndef f():\n    return sys.stdin.read()\n", "f")
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results, "")

    def test_output_before_frame_including_atexit(self):
        src = ("import atexit\n"
               "atexit.register(print, 'at exit')\n"
               "def f():\n    print('during')\n    return 1\n")
        r = run_tool(src, "f")
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.stdout, "during\nat exit\n")
        self.assertTrue(r.raw_stdout.endswith(b">>\n"))


class AgentState(unittest.TestCase):
    STATE = {"id": "agent-1", "memory": {"blocks": [{"label": "human", "value": "Ann"}]},
             "secrets": {"API_KEY": "s3cr3t"}}

    def test_round_trip(self):
        src = ("def remember(fact: str, agent_state):\n"
               "    agent_state.memory.blocks[0].value += ', ' + fact\n"
               "    return 'ok'\n")
        r = run_tool(src, "remember", {"fact": "likes tea"}, json_schema=schema("fact"), agent_state=self.STATE)
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results, "ok")
        self.assertEqual(r.payload["agent_state"]["memory"]["blocks"][0]["value"], "Ann, likes tea")
        self.assertEqual(r.payload["agent_state"]["id"], "agent-1")

    def test_stand_in_block_wants_a_value_as_lettas(self):
        src = ("def f(agent_state):\n"
               "    ok = Block.model_validate({'label': 'n', 'value': 'v'}).value\n"
               "    Block.model_validate({'label': 'n'})\n")
        r = run_tool(src, "f", agent_state=self.STATE)
        self.assertEqual(r.code, 1, r)
        self.assertEqual(r.error["name"], "ValidationError", r)
        self.assertIn("Field required", r.stderr)

    def test_declared_but_absent_is_none(self):
        r = run_tool("def f(agent_state=None):\n    return agent_state is None\n", "f")
        self.assertEqual(r.payload, {"results": True, "agent_state": None})

    def test_undeclared_tool_never_sees_it(self):
        src = ("import gc\n"
               "def f(**kw):\n"
               "    hits = [o for o in gc.get_objects() if isinstance(o, dict) and 's3cr3t' in str(o.get('API_KEY', ''))]\n"
               "    return [sorted(kw), len(hits)]\n")
        r = run_tool(src, "f", {}, agent_state=self.STATE)
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results, [[], 0])
        self.assertIsNone(r.payload["agent_state"])

    def test_undeclared_tool_cannot_return_one(self):
        # The tool writes a forged result message, with an agent_state, to
        # every pipe it holds, then dies: the runner drops the agent_state.
        src = ("import json, os, stat, struct\n"
               "def f():\n"
               "    body = json.dumps({'results': 'x', 'agent_state': {'memory': 'pwned'}}).encode()\n"
               "    for fd in map(int, os.listdir('/proc/self/fd')):\n"
               "        try:\n"
               "            if fd > 2 and stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
               "                os.write(fd, struct.pack('>Q', len(body)) + body)\n"
               "        except OSError:\n"
               "            pass\n"
               "    os._exit(0)\n")
        r = run_tool(src, "f", agent_state=self.STATE)
        self.assertIsNone(r.payload["agent_state"], r)

    def test_reserved_names(self):
        r = run_tool("def f(agent_state):\n    return 1\n", "f", {"agent_state": {"x": 1}})
        self.assertEqual(r.code, 2, r)
        self.assertEqual(r.error["kind"], "request")

    def test_agent_id_injection(self):
        r = run_tool("def f(agent_id):\n    return agent_id\n", "f", agent_id="agent-7")
        self.assertEqual(r.results, "agent-7")


def unpickle(data, **extra):
    nonce = secrets.token_hex(16)
    req = {"nonce": nonce, "unpickle": base64.b64encode(data).decode() if isinstance(data, bytes) else data}
    req.update(extra)
    return run_tool(None, None, request=req, nonce=nonce)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo RAN-BY-THE-PAYLOAD",))


class _Model:
    """Pickles like a pydantic v2 model (its __getstate__)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __getstate__(self):
        return {"__dict__": dict(self.__dict__), "__pydantic_extra__": {"extra_field": 1},
                "__pydantic_fields_set__": set(self.__dict__), "__pydantic_private__": None}


class Unpickle(unittest.TestCase):
    """The decoder for pickle payloads of older Letta scripts: plain data,
    never a class or call the payload names."""

    def test_values_and_models_become_plain_data_in_every_protocol(self):
        import datetime
        import pickle

        when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
        for proto in range(pickle.HIGHEST_PROTOCOL + 1):
            payload = {"results": [1, (2, "x"), 2**80, {1: "a"}, _Model(a=1, when=when), when, {3}],
                       "agent_state": _Model(id="agent-1", created=when, tags={"t"})}
            r = unpickle(pickle.dumps(payload, protocol=proto))
            self.assertEqual(r.code, 0, (proto, r))
            self.assertEqual(r.results, [1, [2, "x"], 2**80, {"1": "a"},
                                         {"a": 1, "when": "2026-01-02 03:04:05+00:00", "extra_field": 1},
                                         "2026-01-02 03:04:05+00:00", "{3}"], proto)
            self.assertEqual(r.payload["agent_state"],
                             {"id": "agent-1", "created": "2026-01-02T03:04:05Z", "tags": ["t"], "extra_field": 1})

    def test_a_payload_naming_a_call_gets_its_argument_never_the_call(self):
        import pickle

        r = unpickle(pickle.dumps({"results": _Evil(), "agent_state": None}))
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results, "echo RAN-BY-THE-PAYLOAD")
        self.assertNotIn("RAN-BY-THE-PAYLOAD", r.stdout)
        # An eval, an exec or a class's constructor fare the same: the
        # record of the call is no mapping, so result["results"] raises.
        r = unpickle(b"cbuiltins\neval\n(S'__import__(\"os\").system(\"echo EVAL-RAN\")'\ntR.")
        self.assertEqual(r.code, 1, r)
        self.assertEqual(r.error["name"], "TypeError")
        self.assertIn("_Stub", r.error["message"])
        self.assertNotIn("EVAL-RAN", r.stdout)
        # builtins.object is no exception, nor is an attribute set on one of
        # the decoder's own functions (a BUILD on it).
        r = unpickle(b"\x80\x02}(X\x07\x00\x00\x00resultscbuiltins\nobject\n)RX\x0b\x00\x00\x00agent_stateNu.")
        self.assertEqual(r.results, "<builtins.object object>", r)
        r = unpickle(b"\x80\x02ccopyreg\n_reconstructor\nN}X\x0b\x00\x00\x00__defaults__(K\x01tsb\x86b.")
        self.assertEqual(r.code, 1, r)

    def test_what_pickle_loads_or_the_server_raised(self):
        import pickle

        r = unpickle(b"\x80\x04\x95 truncated")
        self.assertEqual((r.code, r.error["name"]), (1, "UnpicklingError"), r)
        self.assertIn("UnpicklingError: ", r.stderr)
        r = unpickle(pickle.dumps({"agent_state": None}))
        self.assertEqual((r.error["name"], r.error["message"]), ("KeyError", "'results'"))
        r = unpickle(pickle.dumps({"results": 1, "agent_state": [1]}))
        self.assertEqual(r.error["name"], "TypeError")
        r = unpickle("not base64!")
        self.assertEqual(r.error["name"], "Error")
        # The request carries nothing else.
        r = unpickle(pickle.dumps(None), tool_name="f")
        self.assertEqual((r.code, r.error["kind"]), (2, "request"))

    def test_integers_past_pythons_digit_limit_fail_as_json_dumps_does(self):
        import pickle

        r = unpickle(pickle.dumps({"results": 10**5000, "agent_state": None}))
        self.assertEqual((r.code, r.error["name"]), (1, "ValueError"), r)
        self.assertIn("Exceeds the limit", r.stderr)
        # A tool returning one: as Letta's script, whose json.dumps raises.
        t = run_tool("def f():\n    return 10**5000\n", "f")
        self.assertEqual((t.code, t.error["name"]), (1, "ValueError"), t)
        self.assertTrue(t.error.get("raised"))
        self.assertIn("ValueError: Exceeds the limit", t.stderr)

    def test_shared_references_are_bounded(self):
        import pickle

        x = []
        for _ in range(24):
            x = [x, x]  # 48 bytes of pickle per level, 2**24 values expanded
        r = unpickle(pickle.dumps({"results": x, "agent_state": None}))
        self.assertEqual(r.error["name"], "ValueError", r)
        self.assertIn("expands to more than", r.error["message"])

    def test_cycles_and_depth_are_errors(self):
        import pickle

        a = []
        a.append(a)
        r = unpickle(pickle.dumps({"results": a, "agent_state": None}))
        self.assertEqual(r.code, 0, r)  # as Letta's script: str() of a value json cannot take
        self.assertEqual(r.results, "[[...]]")
        self.assertIn("Warning: result of type list is not JSON-serializable", r.stderr)
        r = unpickle(pickle.dumps({"results": 1, "agent_state": _Model(me=a)}))
        self.assertEqual((r.error["name"], r.error["message"]), ("ValueError", "Circular reference detected"))
        deep = None
        for _ in range(300):
            deep = [deep]
        r = unpickle(pickle.dumps({"results": 1, "agent_state": {"deep": deep}}))
        self.assertEqual(r.error["name"], "ValueError", r)
        self.assertIn("nested deeper", r.error["message"])
        # Keys json.dumps would write as strings, in agent_state too; an
        # empty state is none.
        r = unpickle(pickle.dumps({"results": {(1, 2): 3}, "agent_state": {(1, 2): 3, None: 4}}))
        self.assertEqual((r.results, r.payload["agent_state"]), ({"(1, 2)": 3}, {"(1, 2)": 3, "null": 4}), r)
        r = unpickle(pickle.dumps({"results": 1, "agent_state": {}}))
        self.assertIsNone(r.payload["agent_state"])


class Errors(unittest.TestCase):
    def test_exception_letta_compatible_stderr(self):
        src = "def divide(a, b):\n    return a / b\n"
        r = run_tool(src, "divide", {"a": 1, "b": 0})
        self.assertEqual(r.code, 1, r)
        self.assertEqual(r.error, {"kind": "tool", "name": "ZeroDivisionError", "message": "division by zero",
                                   "raised": True})
        self.assertIsNone(r.results)
        self.assertEqual(r.stderr.rstrip("\n").split("\n")[-1], "ZeroDivisionError: division by zero")
        self.assertEqual(letta_parse_stderr_error_msg(r.stderr), ("ZeroDivisionError", "division by zero"))
        self.assertTrue(r.stderr.startswith("Traceback (most recent call last):\n"), r.stderr)
        self.assertRegex(r.stderr, r'File ".*/tmp[0-9a-f]{8}\.py", line 2, in divide')
        self.assertIn("return a / b", r.stderr)  # source lines are shown
        self.assertNotIn("toolsandbox_runner", r.stderr)  # the runner's frames are not

    def test_exception_in_async_tool_starts_at_tool_frame(self):
        src = "async def f():\n    raise KeyError('k')\n"
        r = run_tool(src, "f")
        self.assertEqual(r.error["name"], "KeyError")
        self.assertNotIn("asyncio", r.stderr)
        self.assertEqual(letta_parse_stderr_error_msg(r.stderr), ("KeyError", "'k'"))

    def test_exception_at_import(self):
        r = run_tool("import no_such_module_xyz\ndef f():\n    pass\n", "f")
        self.assertEqual(r.code, 1, r)
        self.assertEqual(r.error["name"], "ModuleNotFoundError")
        self.assertEqual(letta_parse_stderr_error_msg(r.stderr)[0], "ModuleNotFoundError")

    def test_syntax_error(self):
        r = run_tool("def f(:\n    pass\n", "f")
        self.assertEqual(r.code, 1, r)
        self.assertEqual(r.error["name"], "SyntaxError")
        self.assertIn("SyntaxError", r.stderr.rstrip().split("\n")[-1])

    def test_sys_exit_with_a_message_or_code_is_a_tool_error(self):
        r = run_tool("import sys\ndef f():\n    sys.exit('bye')\n", "f")
        self.assertEqual(r.code, 1, r)
        self.assertEqual((r.error["name"], r.error["message"], r.error["raised"]), ("SystemExit", "bye", True))
        self.assertEqual(r.stderr, "bye\n")
        r = run_tool("import sys\ndef f():\n    sys.exit(3)\n", "f")
        self.assertEqual(r.code, 1, r)
        self.assertEqual((r.error["name"], r.error["message"]), ("SystemExit", "3"))
        self.assertEqual(r.stderr, "")  # CPython prints nothing for an int code

    def test_sys_exit_zero_is_a_success_without_result(self):
        # Letta's script ends with status 0 before writing its result.
        for call in ("sys.exit()", "sys.exit(0)", "sys.exit(None)", "raise SystemExit", "sys.exit(False)"):
            r = run_tool("import sys\ndef f(agent_state):\n    print('before')\n    %s\n" % call, "f",
                         agent_state={"memory": {}})
            self.assertEqual(r.code, 0, (call, r))
            self.assertEqual(r.payload, {"results": None, "agent_state": None}, call)
            self.assertEqual(r.stdout, "before\n", call)

    def test_keyword_only_agent_state_is_not_injected(self):
        # Letta injects agent_state only for a positional-or-keyword
        # parameter (parse_function_arguments reads node.args.args).
        r = run_tool("def f(*, agent_state=None):\n    return agent_state\n", "f", agent_state={"memory": {}})
        self.assertEqual(r.payload, {"results": None, "agent_state": None})
        r = run_tool("def f(agent_state=None, /):\n    return agent_state\n", "f", agent_state={"memory": {}})
        self.assertEqual(r.payload, {"results": None, "agent_state": None})

    def test_tool_killed(self):
        r = run_tool("import os, signal\ndef f():\n    os.kill(os.getpid(), signal.SIGKILL)\n", "f")
        self.assertEqual(r.code, 1, r)
        self.assertEqual(r.error["name"], "RuntimeError")
        self.assertIn("signal 9 (SIGKILL)", r.error["message"])
        self.assertEqual(letta_parse_stderr_error_msg(r.stderr)[0], "RuntimeError")

    def test_tool_os_exit(self):
        r = run_tool("import os\ndef f():\n    os._exit(5)\n", "f")
        self.assertEqual(r.code, 1, r)
        self.assertIn("status 5", r.error["message"])

    def test_oversized_result_message(self):
        # A header announcing 1 TiB: the runner kills the tool process instead
        # of buffering, and reports it.
        src = ("import os, stat, struct, time\n"
               "def f():\n"
               "    for fd in map(int, os.listdir('/proc/self/fd')):\n"
               "        try:\n"
               "            if fd > 2 and stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
               "                os.write(fd, struct.pack('>Q', 1 << 40))\n"
               "        except OSError:\n"
               "            pass\n"
               "    time.sleep(60)\n")
        r = run_tool(src, "f")
        self.assertEqual(r.code, 1, r)
        self.assertIn("larger than", r.error["message"])

    def test_custom_exception_name(self):
        # Letta's regex misses this one ("" name); the frame has it exactly.
        r = run_tool("class Boom(Exception):\n    pass\ndef f():\n    raise Boom('x')\n", "f")
        self.assertEqual((r.error["name"], r.error["message"]), ("Boom", "x"))


class ResultSerialization(unittest.TestCase):
    def test_non_json_values(self):
        src = ("import datetime, dataclasses, enum\n"
               "class Color(enum.Enum):\n    RED = 1\n"
               "class Level(enum.IntEnum):\n    HIGH = 3\n"
               "@dataclasses.dataclass\nclass P:\n    x: int\n    when: datetime.date\n"
               "class Thing:\n    def __str__(self):\n        return 'a thing'\n"
               "class Model:\n    def model_dump(self, mode='python'):\n        return {'mode': mode}\n"
               "def f():\n"
               "    return {'set': {3}, 'tuple': (1, 2), 'bytes': b'x', 'date': datetime.date(2024, 1, 2),\n"
               "            'enum': Color.RED, 'int_enum': Level.HIGH, 'dc': P(1, datetime.date(2024, 1, 2)),\n"
               "            'thing': Thing(), 'model': Model(), 1: 'int key', None: 'none key', False: 'f',\n"
               "            'floats': [float('nan'), float('inf'), -float('inf'), 1.5]}\n")
        r = run_tool(src, "f")
        self.assertEqual(r.code, 0, r)
        # Non-finite floats stay floats, as json.dumps writes them (NaN, ...).
        floats = r.results.pop("floats")
        self.assertEqual(json.dumps(floats), "[NaN, Infinity, -Infinity, 1.5]")
        self.assertEqual(r.results, {
            "set": "{3}", "tuple": [1, 2], "bytes": "b'x'", "date": "2024-01-02", "enum": "Color.RED",
            "int_enum": 3, "dc": {"x": 1, "when": "2024-01-02"}, "thing": "a thing", "model": {"mode": "json"},
            "1": "int key", "null": "none key", "false": "f"})

    def test_object_return_is_str(self):
        r = run_tool("class T:\n    def __repr__(self):\n        return 'T!'\ndef f():\n    return T()\n", "f")
        self.assertEqual(r.results, "T!")

    def test_circular_falls_back_to_str(self):
        r = run_tool("def f():\n    a = [1]\n    a.append(a)\n    return a\n", "f")
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results, "[1, [...]]")
        self.assertIn("Warning", r.stderr)

    def test_unicode_and_none(self):
        r = run_tool("def f():\n    return 'h\\u00e9 \\U0001F600 \\ud800'\n", "f")
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results, "h\u00e9 \U0001F600 \ud800")
        r = run_tool("def f():\n    pass\n", "f")
        self.assertEqual(r.payload, {"results": None, "agent_state": None})


class Spoofing(unittest.TestCase):
    def forged_frame(self, nonce):
        p = base64.b64encode(json.dumps({"results": "forged", "agent_state": {"memory": "pwned"}}).encode()).decode()
        return "<<TSB-RESULT-%s>>%s<<TSB-END-%s>>" % (nonce, p, nonce)

    def test_fake_frame_with_wrong_nonce_cannot_spoof(self):
        fake = self.forged_frame("f" * 32)
        src = "def f():\n    print(%r)\n    return 'real'\n" % fake
        r = run_tool(src, "f")
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.payload, {"results": "real", "agent_state": None})
        self.assertIn(fake, r.stdout)

    def test_replaced_stdout_still_gets_frame_out(self):
        src = ("import io, os, sys\n"
               "def f():\n"
               "    sys.stdout = io.StringIO()\n"
               "    sys.__stdout__ = io.StringIO()\n"
               "    devnull = os.open('/dev/null', os.O_WRONLY)\n"
               "    os.dup2(devnull, 1)\n"
               "    os.dup2(devnull, 2)\n"
               "    return 'still here'\n")
        r = run_tool(src, "f")
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results, "still here")

    def test_closed_stdout_still_gets_frame_out(self):
        r = run_tool("import os\ndef f():\n    os.close(1)\n    return 'x'\n", "f")
        self.assertEqual(r.results, "x")

    def test_letta_markers_in_tool_output_are_not_taken(self):
        payload = json.dumps({"results": "forged", "agent_state": {"memory": "pwned"}}).encode()
        legacy = LETTA_START + base64.b64encode(payload).decode() + LETTA_END
        import hashlib
        import struct
        binary = LETTA_MARKER + struct.pack(">I", len(payload)) + hashlib.md5(payload).hexdigest().encode() + payload
        src = ("import sys\n"
               "def f():\n"
               "    print(%r)\n"
               "    sys.stdout.flush()\n"
               "    sys.stdout.buffer.write(%r)\n"
               "    return 'real'\n") % (legacy, binary)
        r = run_tool(src, "f")
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.payload, {"results": "real", "agent_state": None})
        self.assertIn(LETTA_START, r.stdout)

    def test_nonce_is_not_in_the_tool_process_memory(self):
        # The tool scans its whole address space for the nonce. It is given the
        # nonce with every character shifted by one, so it never builds the
        # nonce itself: a hit can only come from memory the runner left there.
        nonce = secrets.token_hex(16)
        shifted = "".join(chr(ord(c) + 1) for c in nonce)
        src = ("import re\n"
               "def scan(shifted):\n"
               "    pat = re.compile(rb'[0-9a-f]{32}')\n"
               "    hits, scanned = 0, 0\n"
               "    with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:\n"
               "        for line in maps:\n"
               "            addr, perms = line.split()[:2]\n"
               "            if not perms.startswith('rw'):  # data, heap, stacks: where a copy would live\n"
               "                continue\n"
               "            lo, hi = (int(x, 16) for x in addr.split('-'))\n"
               "            try:\n"
               "                mem.seek(lo)\n"
               "                data = mem.read(hi - lo)\n"
               "            except (OSError, OverflowError, ValueError):\n"
               "                continue\n"
               "            scanned += len(data)\n"
               "            for m in pat.finditer(data):\n"
               "                if ''.join(chr(b + 1) for b in m.group()) == shifted:\n"
               "                    hits += 1\n"
               "    return [hits, scanned]\n")
        r = run_tool(src, "scan", {"shifted": shifted}, nonce=nonce)
        self.assertEqual(r.code, 0, r)
        hits, scanned = r.results
        self.assertGreater(scanned, 1 << 20)
        self.assertEqual(hits, 0)

    def test_nonce_cannot_be_read_from_the_parent(self):
        # Needs an unprivileged tool: root (CAP_SYS_PTRACE) may read any
        # process. When the tests run as root, drop to nobody with setpriv.
        prefix = ()
        if os.geteuid() == 0:
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                self.skipTest("running as root without setpriv")
            prefix = (setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--")
        src = ("import os\n"
               "def steal():\n"
               "    ppid = os.getppid()\n"
               "    out = {}\n"
               "    for name in ('fd/0', 'environ', 'maps', 'mem'):\n"
               "        try:\n"
               "            with open('/proc/%d/%s' % (ppid, name), 'rb') as f:\n"
               "                f.read(1)\n"
               "            out[name] = 'READABLE'\n"
               "        except OSError as e:\n"
               "            out[name] = type(e).__name__\n"
               "    return out\n")
        r = run_tool(src, "steal", prefix=prefix)
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results, {"fd/0": "PermissionError", "environ": "PermissionError",
                                     "maps": "PermissionError", "mem": "PermissionError"})


class Invocation(unittest.TestCase):
    def test_stdin_must_be_a_pipe(self):
        with tempfile.TemporaryFile() as f:
            r = run_tool("def f():\n    return 1\n", "f", stdin_file=f)
        self.assertEqual(r.code, 3, r)
        self.assertIsNone(r.payload)
        self.assertIn("pipe", r.stderr)

    def test_requires_isolated_no_site(self):
        r = run_tool("def f():\n    return 1\n", "f", flags=["-I"])
        self.assertEqual(r.code, 3, r)
        self.assertIsNone(r.payload)

    def test_bad_nonce(self):
        r = run_tool("def f():\n    return 1\n", "f", nonce="ABC")
        self.assertEqual(r.code, 3, r)
        self.assertIsNone(r.payload)
        self.assertEqual(r.raw_stdout, b"")

    def test_runs_as_a_script_too(self):
        # python3 -I -S ... toolsandbox_runner.py is the same program (E2B
        # sandboxes run it so).
        nonce = secrets.token_hex(16)
        req = {"nonce": nonce, "tool_name": "f", "source_code": "def f(a):\n    return a * 2\n", "args": {"a": 21}}
        proc = subprocess.run([PYTHON, *FLAGS, RUNNER], input=json.dumps(req).encode(), capture_output=True, timeout=60)
        r = Run(proc, nonce)
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results, 42)

    def test_not_json(self):
        proc = subprocess.run([PYTHON, *FLAGS, *PROGRAM], input=b"{nope", capture_output=True, timeout=60)
        self.assertEqual(proc.returncode, 3)
        self.assertEqual(proc.stdout, b"")

    def test_venv_site_packages_only_in_the_tool_process(self):
        # A venv whose site-packages holds a module and a .pth file: the tool
        # imports the module, and the .pth code runs in the tool process only.
        with tempfile.TemporaryDirectory() as d:
            venv = os.path.join(d, "venv")
            made = subprocess.run([PYTHON, "-m", "venv", "--without-pip", venv], capture_output=True)
            if made.returncode != 0:
                self.skipTest("cannot create a venv: %s" % made.stderr.decode(errors="replace"))
            site = subprocess.run([os.path.join(venv, "bin", "python3"), "-I", "-c",
                                   "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            with open(os.path.join(site, "tsb_probe_mod.py"), "w") as f:
                f.write("VALUE = 'from the venv'\n")
            with open(os.path.join(site, "tsb_probe.pth"), "w") as f:
                f.write("import os, sys; sys.stderr.write('PTH %d\\n' % os.getpid())\n")
            src = "import os, tsb_probe_mod\ndef f():\n    return [tsb_probe_mod.VALUE, os.getpid()]\n"
            nonce = secrets.token_hex(16)
            req = {"nonce": nonce, "tool_name": "f", "source_code": src}
            proc = subprocess.run([os.path.join(venv, "bin", "python3"), *FLAGS, *PROGRAM],
                                  input=json.dumps(req).encode(), capture_output=True, timeout=60)
            r = Run(proc, nonce)
        self.assertEqual(r.code, 0, r)
        value, tool_pid = r.results
        self.assertEqual(value, "from the venv")
        # Debian's site.py processes a venv's .pth files twice on any start;
        # what matters is that every run happened in the tool process.
        pth_pids = re.findall(r"PTH (\d+)", r.stderr)
        self.assertTrue(pth_pids)
        self.assertEqual(set(pth_pids), {str(tool_pid)})


class FrameParser(unittest.TestCase):
    """The reference parser above must reject what the C++ one rejects."""

    def test_duplicates_rejected(self):
        nonce = "a" * 32
        frame = b"\n<<TSB-RESULT-" + nonce.encode() + b">>e30=<<TSB-END-" + nonce.encode() + b">>\n"
        with self.assertRaises(FrameError):
            extract_frame(frame + frame, nonce)
        self.assertEqual(extract_frame(b"x" + frame + b"y", nonce), ({}, b"xy"))


if __name__ == "__main__":
    unittest.main()

"""Tests for isolate/runner/toolsandbox_runner.py, in both of its modes.

Run with either of:

    /usr/bin/python3 -m unittest discover -s tests/python -p 'test_runner*.py' -v
    /usr/bin/python3 tests/python/test_runner.py -v          (nonce mode only)
    /usr/bin/python3 -m pytest tests/python/test_runner.py tests/python/test_runner_channel.py

The runner is started the way its users start it (python3 -I -S -B -u -X
utf8 -c BOOT), in one of its two modes:

- nonce mode (run(), what E2B cells use): the request is one JSON object on
  a stdin pipe and the result is a frame with the request's nonce on stdout.
  The frame parser below mirrors extract_nonce_frame in daemon/frontend/letta/letta.cc.
- channel mode (run_channel(), what the daemon uses for every local
  sandbox): stdin is one end of a socket pair; run_tool sends the request's
  first part, reads the runner's declaration, sends the second part (the
  agent state only when declared, as the daemon does) and reads the payload
  from the socket to EOF, while stdout is all the tool's (daemon/frontend/letta/letta.h,
  "The result channel").
- pooled mode (run_pooled(), a warm sandbox's runner): the channel mode
  after a hand-over: the runner writes its ready line first, run_channel
  sends the environ part before the first part (daemon/frontend/letta/letta.h, "Warm
  sandboxes").

Every test class derives from RunnerCase, whose `mode` (set into the module
global MODE by setUp) selects what run_tool does. The classes here run in
nonce mode; tests/python/test_runner_channel.py subclasses each of them with
mode = "channel" and mode = "pooled", so the whole suite runs once per mode. A
test that is about one mode only (the frame, the nonce, the two processes of
the nonce mode, a channel's declaration or parts) is marked @nonce_only or
@channel_only (the channel and pooled modes) and skipped, with its reason, in
the others. tests/unit/letta_test.cc and
tests/unit/result_channel_test.cc check the C++ side against the real runner
too. TSB_RUNNER_PYTHON selects the interpreter (default /usr/bin/python3).
"""

import base64
import functools
import json
import os
import re
import secrets
import selectors
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.normpath(os.path.join(HERE, "..", "..", "isolate", "runner", "toolsandbox_runner.py"))
PYTHON = os.environ.get("TSB_RUNNER_PYTHON", "/usr/bin/python3")
FLAGS = ["-I", "-S", "-B", "-u", "-X", "utf8"]
# As the daemon starts it (kRunnerBoot in daemon/policy/policy.h): imported
# from its directory, put after the standard library, and run.
BOOT = ("import sys\nsys.path.append(%r)\nimport toolsandbox_runner\ntoolsandbox_runner.run()\n"
        % os.path.dirname(RUNNER))
CHANNEL_BOOT = ("import sys\nsys.path.append(%r)\nimport toolsandbox_runner\ntoolsandbox_runner.run_channel()\n"
                % os.path.dirname(RUNNER))
POOLED_BOOT = ("import sys\nsys.path.append(%r)\nimport toolsandbox_runner\n"
               "toolsandbox_runner.run_pooled()\n" % os.path.dirname(RUNNER))
PROGRAM = ["-c", BOOT]
CHANNEL_PROGRAM = ["-c", CHANNEL_BOOT]
# The daemon's pooled command ends with the modules of the policy's
# warm_pool.preload (a tool's by default none, a script's what Letta's
# generated scripts import: kLettaPreload in daemon/policy/policy.h); these
# tests give the tool runner Letta's list, so that its preloading is run.
LETTA_PRELOAD = ["base64", "hashlib", "json", "pickle", "struct", "sys", "typing"]
POOLED_PROGRAM = ["-c", POOLED_BOOT, *LETTA_PRELOAD]
# A warm runner's ready line (kChannelReady in daemon/frontend/letta/letta.h).
READY = b"TSB1 ready\n"
TIMEOUT = 60  # seconds, per runner started

# The channel's declarations (kChannelDeclaredNo/Yes in daemon/frontend/letta/letta.h).
DECLARED_NO = b"TSB1 agent_state=0\n"
DECLARED_YES = b"TSB1 agent_state=1\n"
DECLARATION_SIZE = 19
FIRST_PART_FIELDS = ("tool_name", "source_code", "unpickle")

# The mode run_tool speaks: "nonce" or "channel", set by RunnerCase.setUp.
MODE = "nonce"

sys.path.insert(0, HERE)
from letta_reference import parse_stderr_error_msg as letta_parse_stderr_error_msg  # noqa: E402

LETTA_START = str(uuid.uuid5(uuid.NAMESPACE_DNS, "local-sandbox-result-start-marker"))
LETTA_END = str(uuid.uuid5(uuid.NAMESPACE_DNS, "local-sandbox-result-end-marker"))
LETTA_MARKER = uuid.uuid5(uuid.NAMESPACE_DNS, "local-sandbox-result-start-marker").bytes


class FrameError(Exception):
    pass


# Integers of any size in this process's json, as the daemon forwards them
# (Python 3.11+ refuses more than 4300 digits by default): the runner's own
# switch for it (imported without writing bytecode beside the runner).
sys.path.insert(0, os.path.dirname(RUNNER))
_write_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
from toolsandbox_runner import _ExactIntegers as _AnyIntegers  # noqa: E402
sys.dont_write_bytecode = _write_bytecode


def dumps(obj):
    with _AnyIntegers():
        return json.dumps(obj).encode()


def loads(data):
    with _AnyIntegers():
        return json.loads(data)


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
    payload = loads(base64.b64decode(out[i + len(start) : j], validate=True))
    before, after = out[:i], out[j + len(end) :]
    if before.endswith(b"\n"):
        before = before[:-1]
    if after.startswith(b"\n"):
        after = after[1:]
    return payload, before + after


class Run:
    """proc: a finished subprocess (returncode, stdout, stderr as bytes).
    nonce mode: the payload is the frame's in stdout. channel mode (channel
    is what the socket carried): the declaration is its first 19 bytes, the
    payload the rest (None when nothing came), stdout all the tool's."""

    def __init__(self, proc, nonce, channel=None):
        self.code = proc.returncode
        self.raw_stdout = proc.stdout
        self.stderr = proc.stderr.decode("utf-8", "replace")
        if channel is None:
            self.declaration = None
            self.payload, rest = extract_frame(proc.stdout, nonce)
        else:
            self.declaration = channel[:DECLARATION_SIZE]
            rest_of_channel = channel[DECLARATION_SIZE:]
            self.payload = loads(rest_of_channel) if rest_of_channel else None
            rest = proc.stdout
        self.stdout = rest.decode("utf-8", "replace")

    @property
    def results(self):
        return self.payload["results"]

    @property
    def error(self):
        return self.payload.get("error")

    def __repr__(self):
        return "Run(code=%r, declaration=%r, payload=%r, stdout=%r, stderr=%r)" % (
            self.code, self.declaration, self.payload, self.stdout, self.stderr)


def part(body):
    """A channel request part: 4-byte big-endian length, then the JSON text
    (body: an object, or the text itself as bytes)."""
    data = body if isinstance(body, bytes) else dumps(body)
    return struct.pack(">I", len(data)) + data


def _shutdown_write(sock):
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the runner is gone


def channel_exchange(cmd, first, second, *, cwd=None, timeout=TIMEOUT, ready=False, env=None):
    """Start cmd with stdin one end of a socket pair and speak the channel
    on the other: write `first` (bytes, header included), read the
    declaration, then write second(declaration) (bytes, or None to send no
    more) and shut down the writing side. Everything (the socket both ways,
    stdout, stderr) is served from one selector loop, so neither side blocks
    the other whatever the sizes. Returns (CompletedProcess, channel bytes).
    The process is killed, and TimeoutExpired raised, after `timeout`.
    ready: a warm runner's, whose channel starts with its ready line (left
    out of the bytes returned; missing when it ended before it). env: the
    process's whole environment (default: this process's)."""
    ours, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen(cmd, stdin=theirs, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    deadline = time.monotonic() + timeout
    received = {"chan": bytearray(), "out": bytearray(), "err": bytearray()}
    sending = memoryview(first)
    second_done = False  # the second part was decided (sent, or none)
    sel = selectors.DefaultSelector()
    try:
        ours.setblocking(False)
        for f, name in ((proc.stdout, "out"), (proc.stderr, "err")):
            os.set_blocking(f.fileno(), False)
            sel.register(f, selectors.EVENT_READ, name)
        chan_events = lambda: selectors.EVENT_READ | (selectors.EVENT_WRITE if sending else 0)  # noqa: E731
        sel.register(ours, chan_events(), "chan")
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                proc.kill()
                proc.wait()
                raise subprocess.TimeoutExpired(cmd, timeout)
            for key, events in sel.select(left):
                if key.data != "chan":
                    try:
                        chunk = os.read(key.fd, 1 << 16)
                    except BlockingIOError:
                        continue
                    if chunk:
                        received[key.data] += chunk
                    else:
                        sel.unregister(key.fileobj)
                    continue
                if events & selectors.EVENT_WRITE and sending:
                    try:
                        sending = sending[ours.send(sending[: 1 << 20]) :]
                    except BlockingIOError:
                        pass
                    except (BrokenPipeError, ConnectionResetError):
                        sending = memoryview(b"")  # the runner is gone: it reads no more
                    else:
                        if not sending and second_done:
                            _shutdown_write(ours)
                eof = False
                if events & selectors.EVENT_READ:
                    try:
                        chunk = ours.recv(1 << 16)
                    except BlockingIOError:
                        chunk = None
                    except ConnectionResetError:
                        chunk = b""
                    if chunk:
                        received["chan"] += chunk
                    elif chunk == b"":
                        eof = True
                skip = len(READY) if ready and received["chan"].startswith(READY) else 0
                if not second_done and len(received["chan"]) >= skip + DECLARATION_SIZE and not sending:
                    second_done = True
                    data = second(bytes(received["chan"][skip:skip + DECLARATION_SIZE]))
                    if data is not None:
                        sending = memoryview(data)
                        if not sending:
                            _shutdown_write(ours)
                if eof:
                    sel.unregister(ours)
                else:
                    sel.modify(ours, chan_events(), "chan")
        try:
            proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    finally:
        sel.close()
        ours.close()
        proc.stdout.close()
        proc.stderr.close()
        if proc.returncode is None:
            proc.kill()
            proc.wait()
    done = subprocess.CompletedProcess(cmd, proc.returncode, bytes(received["out"]), bytes(received["err"]))
    chan = bytes(received["chan"])
    return done, chan[len(READY):] if ready and chan.startswith(READY) else chan


def environ_part(environ):
    return part({"environ": environ})


def run_channel(first, second, *, python=PYTHON, flags=FLAGS, prefix=(), environ=None):
    """A channel-mode run from raw parts (see channel_exchange), in a working
    directory of its own. Returns a Run with .declaration, .cwd and
    .left_in_cwd. In pooled mode the runner is a warm one, and `first`
    follows the environ part of `environ` (default: none)."""
    pooled = MODE == "pooled"
    cmd = [*prefix, python, *flags, *(POOLED_PROGRAM if pooled else CHANNEL_PROGRAM)]
    if pooled:
        first = environ_part(environ or {}) + first
    with tempfile.TemporaryDirectory() as cwd:
        proc, chan = channel_exchange(cmd, first, second, cwd=cwd, ready=pooled)
        run = Run(proc, None, channel=chan)
        run.cwd = cwd
        run.left_in_cwd = sorted(os.listdir(cwd))
    return run


def run_tool(source, tool_name, args=None, *, json_schema=None, agent_state=None, agent_id=None,
             request=None, nonce=None, prefix=(), flags=FLAGS, stdin_file=None, python=PYTHON,
             send_agent_state="declared", on_declaration=None):
    """Run one request in the mode of the running test (MODE). The request is
    built from the arguments, or given whole as `request` (with a nonce,
    ignored in channel mode). In channel mode it is split as the daemon
    splits it: tool_name, source_code or unpickle in the first part, the rest
    in the second, whose agent_state is sent only when the runner declared
    it, else null (send_agent_state="always" sends it anyway); on_declaration,
    if given, is called with the declaration as it arrives."""
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
    if MODE in ("channel", "pooled"):
        assert stdin_file is None, "the channel mode's stdin is the channel"
        first = {k: v for k, v in request.items() if k in FIRST_PART_FIELDS}
        rest = {k: v for k, v in request.items() if k not in FIRST_PART_FIELDS and k != "nonce"}

        def second(declaration):
            if on_declaration is not None:
                on_declaration(declaration)
            if "agent_state" in rest and declaration != DECLARED_YES and send_agent_state != "always":
                rest["agent_state"] = None
            return part(rest)

        return run_channel(part(first), second, python=python, flags=flags, prefix=prefix)
    assert MODE == "nonce", MODE
    data = dumps(request)
    cmd = [*prefix, python, *flags, *PROGRAM]
    # A working directory of its own, as the sandbox's: the runner writes the
    # tool's source there (and removes it).
    with tempfile.TemporaryDirectory() as cwd:
        if stdin_file is not None:
            stdin_file.write(data)
            stdin_file.flush()
            stdin_file.seek(0)
            proc = subprocess.run(cmd, stdin=stdin_file, capture_output=True, timeout=TIMEOUT, cwd=cwd)
        else:
            proc = subprocess.run(cmd, input=data, capture_output=True, timeout=TIMEOUT, cwd=cwd)
        run = Run(proc, nonce if isinstance(nonce, str) else "")
        run.cwd = cwd
        run.left_in_cwd = sorted(os.listdir(cwd))
    return run


def schema(*names):
    return {"name": "t", "parameters": {"type": "object", "properties": {n: {"type": "string"} for n in names}}}


class RunnerCase(unittest.TestCase):
    """Base of every test class: run_tool speaks `mode` ("nonce" here;
    test_runner_channel.py subclasses each class with "channel")."""

    mode = "nonce"

    def setUp(self):
        global MODE
        super().setUp()
        MODE = self.mode
        self.addCleanup(globals().__setitem__, "MODE", "nonce")

    def unprivileged(self):
        """What runs a command as nobody when the tests run as root (root,
        with CAP_SYS_PTRACE, may read any process): a prefix, or ()."""
        if os.geteuid() != 0:
            return ()
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            self.skipTest("running as root without setpriv")
        return (setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--")

    def make_venv(self, d):
        """A venv (no pip) in directory d: its path and its site-packages."""
        venv = os.path.join(d, "venv")
        made = subprocess.run([PYTHON, "-m", "venv", "--without-pip", venv], capture_output=True)
        if made.returncode != 0:
            self.skipTest("cannot create a venv: %s" % made.stderr.decode(errors="replace"))
        site = subprocess.run([os.path.join(venv, "bin", "python3"), "-I", "-c",
                               "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        return venv, site


def _only(mode, why):
    modes = ("channel", "pooled") if mode == "channel" else (mode,)

    def decorate(test):
        @functools.wraps(test)
        def wrapper(self, *args, **kwargs):
            if self.mode not in modes:
                self.skipTest("%s mode only: %s" % (mode, why))
            return test(self, *args, **kwargs)

        return wrapper

    return decorate


def nonce_only(why):
    """A test of what only the nonce mode has (skipped in channel mode)."""
    return _only("nonce", why)


def channel_only(why):
    """A test of what only the channel mode has (skipped in nonce mode; run
    in pooled mode, which is the channel mode after a hand-over)."""
    return _only("channel", why)


class RunnerBasics(RunnerCase):
    def test_integers_of_any_size_arrive_exact(self):
        # The daemon forwards the client's digits as they are; more than
        # Python's default 4300 digits must still reach the tool exact, and
        # the tool's own conversions keep the interpreter's default limit.
        # (run_tool's json writes the 5000 digits of x as they are.)
        value = 10 ** 5000 - 1
        src = ("import sys\n"
               "def t(x):\n"
               "    limit = sys.get_int_max_str_digits() if hasattr(sys, 'get_int_max_str_digits') else 0\n"
               "    return [x % 1000003, (x + 1).bit_length(), limit]\n")
        r = run_tool(src, "t", {"x": value})
        self.assertEqual(r.code, 0, r)
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

    def test_lettas_imports_are_there_without_importing(self):
        # Letta's script imports pickle, sys, base64, struct, hashlib, os and
        # json (as _letta_json) before the tool: a tool may use them without
        # importing them. Those its code names are the modules themselves
        # (exactly: cloudpickle, pickling a function by value, looks at the
        # type of each global it uses).
        src = ("import sys as _s\n"
               "def f():\n"
               "    real = [type(m) is type(_s) for m in (pickle, base64, hashlib)]  # before any use\n"
               "    out = [hashlib.sha256(b'x').hexdigest()[:8], base64.b64encode(b'ab').decode(),\n"
               "           pickle.loads(pickle.dumps({'k': 1})), _letta_json.dumps([1]), struct.pack('>H', 1).hex(),\n"
               "           os.sep, sys.maxsize > 0]\n"
               "    return [out, real]\n")
        r = run_tool(src, "f")
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results, [["2d711642", "YWI=", {"k": 1}, "[1]", "0001", "/", True], [True, True, True]])
        # Those it does not name are imported at their first use (a warm
        # runner imports them before its hand-over, at no cost to the run).
        # That use gets the real module, which then replaces the stand-in
        # in the tool's globals, unless the tool rebound the name.
        src = ("import sys\n"
               "def f():\n"
               "    g, names = globals(), ('pickle', 'base64', 'hashlib')\n"
               "    before = [n in sys.modules for n in names]\n"
               "    modules = [type(g[n]) is type(sys) for n in names]\n"
               "    text = repr(g['base64'])\n"
               "    p = g['pickle']\n"
               "    g['pickle'] = 'mine'\n"
               "    p.dumps(1)\n"
               "    g['hashlib'].tsb_mark = 7\n"
               "    return [before, modules, text.startswith(\"<module 'base64'\"), g['base64'] is sys.modules['base64'],\n"
               "            g['pickle'], sys.modules['hashlib'].tsb_mark, g['hashlib'] is sys.modules['hashlib']]\n")
        r = run_tool(src, "f")
        self.assertEqual(r.code, 0, r)
        loaded = self.mode == "pooled"
        self.assertEqual(r.results, [[loaded] * 3, [loaded] * 3, True, True, "mine", 7, True])

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
        if self.mode == "nonce":
            self.assertTrue(r.raw_stdout.endswith(b">>\n"))
        else:  # no frame: stdout is the tool's alone
            self.assertEqual(r.raw_stdout, b"during\nat exit\n")

    def test_threads_joined_and_atexit_run_before_the_end(self):
        # As at the end of Letta's script: non-daemon threads are joined,
        # then atexit handlers run; the source file is gone afterwards,
        # whether the tool returned or raised.
        src = ("import atexit, threading, time\n"
               "atexit.register(print, 'atexit')\n"
               "def f(fail):\n"
               "    def late():\n"
               "        time.sleep(0.3)\n"
               "        print('thread')\n"
               "    threading.Thread(target=late).start()\n"
               "    if fail:\n"
               "        raise KeyError('k')\n"
               "    return 'returned'\n")
        r = run_tool(src, "f", {"fail": False})
        self.assertEqual((r.code, r.payload), (0, {"results": "returned", "agent_state": None}), r)
        self.assertEqual(r.stdout, "thread\natexit\n")
        self.assertEqual(r.left_in_cwd, [])
        r = run_tool(src, "f", {"fail": True})
        self.assertEqual((r.code, r.error["name"]), (1, "KeyError"), r)
        self.assertEqual(r.stdout, "thread\natexit\n")
        self.assertEqual(r.left_in_cwd, [])

    def test_files_left_open_are_flushed_at_the_end(self):
        # Letta's script ends with the interpreter's teardown, which flushes
        # a file object the tool never closed (a log kept at module level);
        # the channel mode's lean exit must not lose that data either. A
        # file opened only for reading, and none at all, change nothing.
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "log.txt")
            src = ("log = open(%r, 'a')\n"
                   "text = open(%r, 'w', encoding='utf-8', buffering=1 << 20)\n"
                   "def f(n):\n"
                   "    log.write('kept %%d\\n' %% n)\n"
                   "    text.write('\u00e9' * n)\n"
                   "    return n\n" % (path, path + ".2"))
            r = run_tool(src, "f", {"n": 3})
            self.assertEqual((r.code, r.results), (0, 3), r)
            with open(path) as f:
                self.assertEqual(f.read(), "kept 3\n")
            with open(path + ".2", encoding="utf-8") as f:
                self.assertEqual(f.read(), "\u00e9" * 3)

    def test_large_args_output_and_results(self):
        # MBs in every direction at once: the request, stdout, stderr and
        # the result.
        big = "x" * (4 << 20)
        src = ("import sys\n"
               "def f(s):\n"
               "    sys.stdout.write('o' * (2 << 20))\n"
               "    sys.stderr.write('e' * (1 << 20))\n"
               "    return [len(s), s + s[::-1]]\n")
        r = run_tool(src, "f", {"s": big})
        self.assertEqual(r.code, 0, r.code)
        self.assertEqual(r.results, [len(big), big + big])
        self.assertEqual(r.stdout, "o" * (2 << 20))
        self.assertEqual(r.stderr, "e" * (1 << 20))


class AgentState(RunnerCase):
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

    @channel_only("the declaration that decides what the second part holds")
    def test_declaration_says_whether_agent_state_is_declared(self):
        # 1 exactly when the function (any def of the tool's name, as
        # Letta's parse_function_arguments finds it) has a positional-or-
        # keyword agent_state parameter, and for every unpickle request.
        cases = [
            ("def f(a):\n    return a\n", "f", DECLARED_NO),
            ("def f(agent_state):\n    return 1\n", "f", DECLARED_YES),
            ("def f(a, agent_state=None):\n    return 1\n", "f", DECLARED_YES),
            ("async def f(agent_state):\n    return 1\n", "f", DECLARED_YES),
            ("class C:\n    def f(self, agent_state):\n        pass\ndef f():\n    return 1\n", "f", DECLARED_YES),
            ("def f(*, agent_state=None):\n    return 1\n", "f", DECLARED_NO),
            ("def f(agent_state=None, /):\n    return 1\n", "f", DECLARED_NO),
            ("def f(**agent_state):\n    return 1\n", "f", DECLARED_NO),
            ("def g(agent_state):\n    return 1\n", "f", DECLARED_NO),
            ("def f(agent_state:\n", "f", DECLARED_NO),  # unparsable: declares nothing
            ("def f(agent_id):\n    return agent_id\n", "f", DECLARED_NO),
        ]
        for src, name, declaration in cases:
            r = run_tool(src, name, agent_state=self.STATE)
            self.assertEqual(r.declaration, declaration, (src, r))
        r = unpickle(__import__("pickle").dumps({"results": 1, "agent_state": None}))
        self.assertEqual((r.declaration, r.code), (DECLARED_YES, 0), r)
        # The declaration comes before the second part is sent, whatever it holds.
        r = unpickle("not base64!")
        self.assertEqual(r.declaration, DECLARED_YES, r)

    @channel_only("the daemon never sends agent_state to a runner that did not declare it; "
                  "this sends it anyway")
    def test_undeclared_tool_never_gets_one_sent_anyway(self):
        src = ("import gc\n"
               "def f(**kw):\n"
               "    hits = [o for o in gc.get_objects() if isinstance(o, dict) and 's3cr3t' in str(o.get('API_KEY', ''))]\n"
               "    return [sorted(kw), len(hits), agent_state is None]\n")
        r = run_tool(src, "f", {}, agent_state=self.STATE, send_agent_state="always")
        self.assertEqual(r.declaration, DECLARED_NO, r)
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results, [[], 0, True])
        self.assertIsNone(r.payload["agent_state"])

    @nonce_only("the forged message goes to the pipe from the tool process to the runner's parent, "
                "which the channel mode does not have (see test_tool_writing_its_own_payload_to_the_channel)")
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

    @channel_only("the tool runs in the runner's own process, which holds the channel")
    def test_tool_writing_its_own_payload_to_the_channel(self):
        # The tool finds the channel among its descriptors, writes a payload
        # of its own and ends its process before the runner writes one. The
        # payload is taken as it is (documented: daemon/frontend/letta/letta.h, "The
        # result channel"), which does what returning the value does...
        src = ("import json, os, stat\n"
               "def f():\n"
               "    body = json.dumps(%r).encode()\n"
               "    for fd in map(int, os.listdir('/proc/self/fd')):\n"
               "        try:\n"
               "            if fd > 2 and stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
               "                os.write(fd, body)\n"
               "        except OSError:\n"
               "            pass\n"
               "    os._exit(0)\n")
        forged = run_tool(src % {"results": "x", "agent_state": None}, "f", agent_state=self.STATE)
        returned = run_tool("def f():\n    return 'x'\n", "f", agent_state=self.STATE)
        self.assertEqual((forged.code, forged.declaration, forged.payload),
                         (returned.code, returned.declaration, returned.payload), forged)
        self.assertEqual(forged.payload, {"results": "x", "agent_state": None})
        # ... and an agent_state in it comes from a runner that declared none:
        # the daemon refuses that result (shape_tool_result).
        r = run_tool(src % {"results": "x", "agent_state": {"memory": "pwned"}}, "f", agent_state=self.STATE)
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.declaration, DECLARED_NO)
        self.assertEqual(r.payload, {"results": "x", "agent_state": {"memory": "pwned"}})

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


class Unpickle(RunnerCase):
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

    def test_types_say_which_values_json_lacks_and_rebuild_them(self):
        # What letta-server's pickle.loads kept: the client rebuilds it from
        # the plain data and "types" alone (nothing unpickled there).
        import pickle

        sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
        from toolsandbox_client.protocol import rebuild_pickled_types

        value = (1, ("a", None), [2.5, b"\x00\xff", bytearray(b"xy")], set(), frozenset({(1, b"k")}),
                 {1: "a", -2: {3.5: (4,)}, None: "n", True: "t", float("nan"): "nan", "s": {(1, 2), "x"},
                  (5, 6): "a tuple key"})
        r = unpickle(pickle.dumps({"results": value, "agent_state": None}))
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results[0:3], [1, ["a", None], [2.5, "b'\\x00\\xff'", "bytearray(b'xy')"]])
        types = r.payload["types"]
        self.assertIn([[], "tuple"], types)
        self.assertIn([[5, "1"], "key", "int"], types)
        got = rebuild_pickled_types(r.results, types)
        want = list(value)
        want[5] = {(str(k) if k == (5, 6) else k): v for k, v in value[5].items()}  # a tuple key stays its str()
        def canon(v):  # the value with its types spelled out, sets in a stable order
            if isinstance(v, dict):
                return ["dict", [[canon(k), canon(x)] for k, x in v.items()]]
            if isinstance(v, (list, tuple)):
                return [type(v).__name__, [canon(x) for x in v]]
            if isinstance(v, (set, frozenset)):
                return [type(v).__name__, sorted((canon(x) for x in v), key=repr)]
            return [type(v).__name__, repr(v)]

        self.assertEqual(canon(got), canon(tuple(want)))
        self.assertIs(type(got[4]), frozenset)
        self.assertIs(type(got[2][2]), bytearray)
        # Nothing to say: no "types".
        self.assertNotIn("types", unpickle(pickle.dumps({"results": [1, {"a": "b"}], "agent_state": None})).payload)
        # Bounded: past 65536 entries none are sent, and the result stays.
        r = unpickle(pickle.dumps({"results": [(i,) for i in range(70000)], "agent_state": None}))
        self.assertEqual((r.code, r.payload.get("types_omitted"), "types" in r.payload), (0, True, False), r.stderr)
        self.assertEqual(r.results[69999], [69999])

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


class Errors(RunnerCase):
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

    @nonce_only("the runner's parent process reports how its tool process died; in channel mode the "
                "tool's process is the runner (see test_tool_killed_leaves_no_payload)")
    def test_tool_killed(self):
        r = run_tool("import os, signal\ndef f():\n    os.kill(os.getpid(), signal.SIGKILL)\n", "f")
        self.assertEqual(r.code, 1, r)
        self.assertEqual(r.error["name"], "RuntimeError")
        self.assertIn("signal 9 (SIGKILL)", r.error["message"])
        self.assertEqual(letta_parse_stderr_error_msg(r.stderr)[0], "RuntimeError")

    @channel_only("the tool's process is the runner: the daemon reads the death from the status")
    def test_tool_killed_leaves_no_payload(self):
        r = run_tool("import os, signal\ndef f():\n    print('before')\n    os.kill(os.getpid(), signal.SIGKILL)\n", "f")
        self.assertEqual((r.code, r.declaration, r.payload), (-9, DECLARED_NO, None), r)
        self.assertEqual(r.stdout, "before\n")

    @nonce_only("the runner's parent process reports the tool process's status; in channel mode the "
                "tool's process is the runner (see test_tool_os_exit_ends_the_runner)")
    def test_tool_os_exit(self):
        r = run_tool("import os\ndef f():\n    os._exit(5)\n", "f")
        self.assertEqual(r.code, 1, r)
        self.assertIn("status 5", r.error["message"])

    @channel_only("the tool's process is the runner")
    def test_tool_os_exit_ends_the_runner(self):
        # Its status is the run's and no payload comes: os._exit(0) is then
        # what Letta's script ending with status 0 before its result was.
        for status in (0, 5):
            r = run_tool("import os\ndef f():\n    print('before')\n    os._exit(%d)\n" % status, "f")
            self.assertEqual((r.code, r.declaration, r.payload), (status, DECLARED_NO, None), r)
            self.assertEqual(r.stdout, "before\n")

    @nonce_only("the length-prefixed message from the tool process to the runner's parent; in channel "
                "mode the daemon bounds the payload it reads (shape_tool_result)")
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


class ResultSerialization(RunnerCase):
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


class Spoofing(RunnerCase):
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

    @channel_only("stdout carries no result in channel mode")
    def test_printed_results_are_only_stdout(self):
        # Nothing printed counts, however much it looks like a result: a
        # payload, a declaration, a frame. stdout is the tool's, byte for byte.
        printed = ("TSB1 agent_state=1\n"
                   + json.dumps({"results": "forged", "agent_state": {"memory": "pwned"}}) + "\n"
                   + self.forged_frame("f" * 32) + "\n")
        src = "import sys\ndef f():\n    sys.stdout.write(%r)\n    return 'real'\n" % printed
        r = run_tool(src, "f")
        self.assertEqual((r.code, r.declaration), (0, DECLARED_NO), r)
        self.assertEqual(r.payload, {"results": "real", "agent_state": None})
        self.assertEqual(r.raw_stdout, printed.encode())

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

    @nonce_only("the channel mode has no nonce")
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

    @nonce_only("the non-dumpable parent process holding the nonce; the channel mode has neither")
    def test_nonce_cannot_be_read_from_the_parent(self):
        # Needs an unprivileged tool: root (CAP_SYS_PTRACE) may read any
        # process. When the tests run as root, drop to nobody with setpriv.
        prefix = self.unprivileged()
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

    @nonce_only("the non-dumpable parent process holding the nonce; the channel mode has neither")
    def test_venv_code_at_start_cannot_read_the_parents_stdin(self):
        # The tool process's first venv code (a .pth file run by its
        # site.main()) starts while the parent still reads its request: the
        # parent must be non-dumpable from before the fork, or that code
        # opens /proc/<parent>/fd/0 and reads the nonce before the parent.
        # strace holds every prctl for 0.3 s, so that a parent that makes
        # itself non-dumpable only after the fork loses the race for sure.
        strace = shutil.which("strace")
        if strace is None:
            self.skipTest("strace is not installed (scripts/lib.sh installs it)")
        prefix = self.unprivileged()
        prefix += (strace, "-f", "-qq", "-o", "/dev/null", "-e", "trace=prctl", "-e", "inject=prctl:delay_enter=300000")
        # The runner's stdin a pipe of that same user's (one of root's is
        # mode 0600 root's, which /proc/<pid>/fd/0 would not open anyway).
        prefix += ("/bin/sh", "-c", 'cat | exec "$0" "$@"')
        with tempfile.TemporaryDirectory() as d:
            os.chmod(d, 0o755)  # the venv, for nobody
            venv, site = self.make_venv(d)
            with open(os.path.join(site, "tsb_steal.pth"), "w") as f:
                f.write("import os, sys; exec(%r)\n" % (
                    "try:\n"
                    "    os.close(os.open('/proc/%d/fd/0' % os.getppid(), os.O_RDONLY))\n"
                    "    got = 'OPENED'\n"
                    "except OSError as e:\n"
                    "    got = type(e).__name__\n"
                    "sys.stderr.write('STEAL %s\\n' % got)\n"))
            r = run_tool("def f():\n    return 1\n", "f", python=os.path.join(venv, "bin", "python3"), prefix=prefix)
        self.assertEqual(r.code, 0, r)
        steals = re.findall(r"STEAL (\w+)", r.stderr)
        self.assertTrue(steals, r.stderr)
        self.assertEqual(set(steals), {"PermissionError"}, r.stderr)


class Invocation(RunnerCase):
    @nonce_only("in channel mode stdin must be the socket (see test_stdin_must_be_the_channel)")
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
        if self.mode != "nonce":
            self.assertEqual(r.declaration, b"")

    @channel_only("the channel mode's stdin")
    def test_stdin_must_be_the_channel(self):
        first = part({"tool_name": "f", "source_code": "def f():\n    return 1\n"})
        second = part({})
        with tempfile.TemporaryFile() as f:
            f.write(first + second)
            f.flush()
            for stdin in (first + second, f):
                if stdin is f:
                    f.seek(0)
                    proc = subprocess.run([PYTHON, *FLAGS, *CHANNEL_PROGRAM], stdin=f, capture_output=True,
                                          timeout=TIMEOUT)
                else:
                    proc = subprocess.run([PYTHON, *FLAGS, *CHANNEL_PROGRAM], input=stdin, capture_output=True,
                                          timeout=TIMEOUT)
                self.assertEqual((proc.returncode, proc.stdout), (3, b""), proc)
                self.assertIn(b"stdin must be the result channel", proc.stderr)

    @channel_only("the channel's parts")
    def test_unusable_parts(self):
        # No usable request: status 3, and nothing on the channel but the
        # declaration, if the first part was read.
        src = part({"tool_name": "f", "source_code": "def f():\n    return 1\n"})
        for first, message in ((part(b"{nope"), "cannot read the request"),
                               (part(b"[1]"), "not a JSON object"),
                               (part(b"{}")[:5], "ended early"),  # then EOF
                               (b"\0\0", "ended early")):
            r = self._first_then_eof(first)
            self.assertEqual((r.code, r.declaration, r.payload, r.raw_stdout), (3, b"", None, b""), (first, r))
            self.assertIn(message, r.stderr)
        for second, message in ((part(b"{nope"), "cannot read the request"),
                                (part(b"null"), "not a JSON object"),
                                (b"", "ended early"),  # no second part, EOF
                                (part({})[:-1], "ended early")):
            r = run_channel(src, lambda d: second)
            self.assertEqual((r.code, r.declaration, r.payload, r.raw_stdout), (3, DECLARED_NO, None, b""), (second, r))
            self.assertIn(message, r.stderr)

    def _first_then_eof(self, first):
        # The first part, then EOF on the channel: the runner reads no more.
        cmd = [PYTHON, *FLAGS, *CHANNEL_PROGRAM]
        ours, theirs = socket.socketpair()
        with ours:
            with theirs:
                proc = subprocess.Popen(cmd, stdin=theirs, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            ours.sendall(first)
            ours.shutdown(socket.SHUT_WR)
            out, err = proc.communicate(timeout=TIMEOUT)
            chan = ours.recv(1 << 16)
        return Run(subprocess.CompletedProcess(cmd, proc.returncode, out, err), None, channel=chan)

    @channel_only("the channel's parts")
    def test_oversized_first_part_is_refused_unread(self):
        # A header claiming more than 1 GiB: refused at once, without reading
        # on (the channel stays open here: a runner reading on would wait).
        start = time.monotonic()
        r = run_channel(struct.pack(">I", (1 << 30) + 1) + b"{", lambda d: part({}))
        self.assertEqual((r.code, r.declaration, r.payload), (3, b"", None), r)
        self.assertIn("a request part of %d bytes (at most %d)" % ((1 << 30) + 1, 1 << 30), r.stderr)
        self.assertLess(time.monotonic() - start, TIMEOUT / 2)
        # 1 GiB itself is read (here it ends early).
        r = self._first_then_eof(struct.pack(">I", 1 << 30) + b"{")
        self.assertEqual((r.code, r.declaration, r.payload), (3, b"", None), r)
        self.assertIn("ended early", r.stderr)

    @nonce_only("the channel mode has no nonce")
    def test_bad_nonce(self):
        r = run_tool("def f():\n    return 1\n", "f", nonce="ABC")
        self.assertEqual(r.code, 3, r)
        self.assertIsNone(r.payload)
        self.assertEqual(r.raw_stdout, b"")

    @nonce_only("running the file as a script calls run(), the nonce mode")
    def test_runs_as_a_script_too(self):
        # python3 -I -S ... toolsandbox_runner.py is the same program (E2B
        # sandboxes run it so).
        nonce = secrets.token_hex(16)
        req = {"nonce": nonce, "tool_name": "f", "source_code": "def f(a):\n    return a * 2\n", "args": {"a": 21}}
        proc = subprocess.run([PYTHON, *FLAGS, RUNNER], input=json.dumps(req).encode(), capture_output=True, timeout=60)
        r = Run(proc, nonce)
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results, 42)

    @nonce_only("a nonce-mode request (see test_unusable_parts)")
    def test_not_json(self):
        proc = subprocess.run([PYTHON, *FLAGS, *PROGRAM], input=b"{nope", capture_output=True, timeout=60)
        self.assertEqual(proc.returncode, 3)
        self.assertEqual(proc.stdout, b"")

    def test_venv_site_packages_only_in_the_tool_process(self):
        # A venv whose site-packages holds a module and a .pth file: the tool
        # imports the module, and the .pth code runs in the tool process only.
        with tempfile.TemporaryDirectory() as d:
            venv, site = self.make_venv(d)
            with open(os.path.join(site, "tsb_probe_mod.py"), "w") as f:
                f.write("VALUE = 'from the venv'\n")
            ran = os.path.join(d, "pth-ran")
            with open(os.path.join(site, "tsb_probe.pth"), "w") as f:
                f.write("import os, sys; sys.stderr.write('PTH %%d\\n' %% os.getpid()); open(%r, 'a').close()\n"
                        % ran)
            src = "import os, tsb_probe_mod\ndef f():\n    return [tsb_probe_mod.VALUE, os.getpid()]\n"
            # In channel mode: no venv code has run when the declaration comes.
            pth_before_declaration = []
            r = run_tool(src, "f", python=os.path.join(venv, "bin", "python3"),
                         on_declaration=lambda d: pth_before_declaration.append(os.path.exists(ran)))
        self.assertEqual(r.code, 0, r)
        value, tool_pid = r.results
        self.assertEqual(value, "from the venv")
        # Debian's site.py processes a venv's .pth files twice on any start;
        # what matters is that every run happened in the tool process (in
        # channel mode the runner's own, once the declaration is out).
        pth_pids = re.findall(r"PTH (\d+)", r.stderr)
        self.assertTrue(pth_pids)
        self.assertEqual(set(pth_pids), {str(tool_pid)})
        if self.mode == "channel":
            self.assertEqual((r.declaration, pth_before_declaration), (DECLARED_NO, [False]))
        elif self.mode == "pooled":
            # A warm runner (of the policy's own venv, the operator's: warm
            # sandboxes never have a per-tool one) sets its site-packages up
            # before the hand-over.
            self.assertEqual((r.declaration, pth_before_declaration), (DECLARED_NO, [True]))


class PooledHandOver(unittest.TestCase):
    """What only a warm runner does: its ready line, then the environ part,
    adopted as a cold start's environment (run_pooled, await_script)."""

    ENV_TOOL = ("import os, subprocess\n"
                "def f():\n"
                "    proc = open('/proc/self/environ', 'rb').read().decode()\n"
                "    child = subprocess.run(['/usr/bin/env', '-0'], capture_output=True, env=None).stdout.decode()\n"
                "    return [dict(os.environ), proc, child]\n")

    def exchange(self, first, second=lambda d: part({}), program=POOLED_PROGRAM, env=None, python=PYTHON):
        with tempfile.TemporaryDirectory() as cwd:
            cmd = [python, *FLAGS, *program]
            done, chan = channel_exchange(cmd, first, second, cwd=cwd, ready=True,
                                          env=env if env is not None else {"FIXED": "1", "LANG": "C.UTF-8"})
        return Run(done, None, channel=chan), done

    def test_the_environment_is_a_cold_starts(self):
        first = environ_part({"A_NEW": "x y", "B_NEW": "é"}) + part({"tool_name": "f", "source_code": self.ENV_TOOL})
        r, _ = self.exchange(first)
        self.assertEqual(r.code, 0, r)
        environ, proc, child = r.results
        self.assertEqual(list(environ.items()), [("FIXED", "1"), ("LANG", "C.UTF-8"), ("A_NEW", "x y"), ("B_NEW", "é")])
        self.assertEqual(proc, "FIXED=1\0LANG=C.UTF-8\0A_NEW=x y\0B_NEW=é\0")
        self.assertEqual(child, proc)

    def test_an_environ_part_no_start_could_have_is_refused(self):
        tool = part({"tool_name": "f", "source_code": "def f():\n    return 1\n"})
        for bad in (environ_part({"FIXED": "2"}), environ_part({"A": 1}), environ_part({"A=B": "1"}),
                    environ_part({"A": "x\0y"}), environ_part({"": "1"}), part({"environ": []}),
                    part({"environ": {}, "more": 1}), part([1])):
            r, _ = self.exchange(bad + tool)
            self.assertEqual((r.code, r.declaration, r.payload), (3, b"", None), (bad, r))

    def test_preloaded_modules_are_loaded_and_argv_is_a_cold_starts(self):
        # The modules after the program are imported before the ready line;
        # the tool then finds them loaded, and sys.argv as a cold start's.
        tool = ("import sys\n"
                "def f():\n"
                "    return [sys.argv, 'email.mime.text' in sys.modules, 'xml.dom.minidom' in sys.modules]\n")
        first = environ_part({}) + part({"tool_name": "f", "source_code": tool})
        r, _ = self.exchange(first, program=["-c", POOLED_BOOT, "email.mime.text"])
        self.assertEqual(r.code, 0, r)
        self.assertEqual(r.results, [["-c"], True, False])

    def test_a_module_that_cannot_be_preloaded_ends_the_runner_before_ready(self):
        for module, why in (("no_such_module_tsb", b"ModuleNotFoundError"), ("json.no_such_part", b"ModuleNotFoundError")):
            ours, theirs = socket.socketpair()
            with ours:
                with theirs:
                    proc = subprocess.Popen([PYTHON, *FLAGS, "-c", POOLED_BOOT, "json", module], stdin=theirs,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                ours.settimeout(TIMEOUT)
                got = ours.recv(len(READY), socket.MSG_WAITALL)
                _, err = proc.communicate(timeout=TIMEOUT)
            self.assertEqual(got, b"", "no ready line")
            self.assertEqual(proc.returncode, 3)
            self.assertIn(b"cannot preload module " + module.encode(), err)
            self.assertIn(why, err)

    def test_ready_before_any_request(self):
        ours, theirs = socket.socketpair()
        with ours:
            with theirs:
                proc = subprocess.Popen([PYTHON, *FLAGS, *POOLED_PROGRAM], stdin=theirs, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE)
            ours.settimeout(TIMEOUT)
            self.assertEqual(ours.recv(len(READY), socket.MSG_WAITALL), READY)
            ours.shutdown(socket.SHUT_WR)  # EOF before any hand-over
            _, err = proc.communicate(timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 3)
        self.assertIn(b"cannot read the hand-over", err)


class FrameParser(RunnerCase):
    """The reference parser above must reject what the C++ one rejects."""

    @nonce_only("the nonce frame's parser (no runner runs)")
    def test_duplicates_rejected(self):
        nonce = "a" * 32
        frame = b"\n<<TSB-RESULT-" + nonce.encode() + b">>e30=<<TSB-END-" + nonce.encode() + b">>\n"
        with self.assertRaises(FrameError):
            extract_frame(frame + frame, nonce)
        self.assertEqual(extract_frame(b"x" + frame + b"y", nonce), ({}, b"xy"))


if __name__ == "__main__":
    unittest.main()

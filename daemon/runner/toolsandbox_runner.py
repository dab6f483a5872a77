"""toolsandbox runner: call one Letta-style Python tool function inside a sandbox.

This file is trusted code. It is the fixed program the engine runs in place of
the script letta-server generates: the tool's source, arguments and agent state
travel as JSON data, never as spliced source text. Standard library only.

Invocation
==========

Two ways, one per place the runner runs:

    /venv/bin/python3 -I -S -B -u -X utf8 -c "<import and run_channel()>" <&result-channel
    python3 -I -S -B -u -X utf8 toolsandbox_runner.py < request-pipe      (run())

In a local sandbox, the -c line (kRunnerBoot in daemon/policy/policy.h)
appends /opt/toolsandbox/runner to the end of sys.path (after the standard
library), imports this module and calls run_channel(): the "channel mode",
one process, request and result on the stream socket that is its stdin
(see "Channel mode" below). In an E2B cell, which has no such socket, the
file runs as a script and calls run(): the "nonce mode" described first
below, two processes, the result in a frame on stdout. Imported rather than run as a script,
its bytecode comes from __pycache__/toolsandbox_runner.<tag>.pyc beside it,
compiled at build time as a "checked-hash" .pyc (PEP 552): used only while it
matches this source, else the source is compiled in memory as a script would
be. Running this file as a script (python3 -I -S ... toolsandbox_runner.py)
is the same program.

-I       Isolated mode: PYTHON* variables (PYTHONPATH, PYTHONSTARTUP, ...), the
         user site directory and the script's own directory are ignored.
         Required: the runner refuses to start without it.
-S       Do not process site-packages at startup. Required. The venv's
         site-packages (and their .pth files, which may run code) are added by
         the tool process only, with the same site.main() call a normal start
         would make: in the nonce mode after the fork described below, so no
         venv code ever runs in the process that holds the nonce; in the
         channel mode after the runner's declaration. The venv stays fully
         importable for the tool. (Without -S, -I alone would also keep the venv's
         site-packages: site.py reads <venv>/pyvenv.cfg; checked on Python 3.11.)
-B       Write no .pyc files.
-u       Unbuffered stdout/stderr: output written before a timeout kill is not
         lost. (Letta sets PYTHONUNBUFFERED=1, which -I ignores.)
-X utf8  UTF-8 mode whatever the sandbox locale, so stdout and stderr are
         UTF-8 as letta-server expects.

stdin must be a pipe or a socket, never a regular file: a tool could re-read a
file from offset 0 and learn the nonce.

Nonce mode (run()). Request: one JSON object on stdin, read to EOF
==================================================================

    {"nonce":       "<32 lowercase hex>",       required, fresh per run
     "tool_name":   "<Python identifier>",      required
     "source_code": "<module source>",          required
     "args":        {"name": <json>, ...},      optional, default {}
     "json_schema": {...} | null,               optional; when given, every arg
                                                name must be a key of
                                                json_schema.parameters.properties
     "agent_state": {...} | null,               optional
     "agent_id":    "<id>" | null,              optional
     "env":         {"NAME": "value", ...}}     optional, default {}

or, to decode the result of a script Letta generated before it switched to
JSON (a pickle, which letta-server then unpickled with its own classes):

    {"nonce": "<32 lowercase hex>", "unpickle": "<base64 of the pickle>"}

The child decodes it with an unpickler that constructs no class of the
payload's choosing (_PlainUnpickler below) and answers as for a tool:
{"results", "agent_state"} as plain JSON, or an error named as pickle.loads
or the server's result["results"] would have raised it.

Unknown fields are rejected. The environment is set by the engine when it
starts this process, except the request's variables that change how a
program starts (LD_*, MALLOC_*, PYTHON*, GLIBC_TUNABLES and the others glibc
ignores for setuid programs): the engine leaves those out, so that no
request can change how this trusted program starts, and sends them as
"env", which the tool process sets before the tool's module runs
(_apply_tool_env).

Argument values are passed to the function as keyword arguments exactly as
decoded from JSON (a string stays a string whatever it contains). They are
neither coerced by annotations nor evaluated. Letta silently drops args that
are not in the schema; the runner rejects them instead.

agent_state and agent_id are injected only when the function declares a
parameter of that name, decided from the source's syntax tree as Letta does
(any def of that name in the module), in the parent process. The tool then
receives agent_state as Letta's script gives it, an AgentState: Letta's own
(AgentState.model_validate of the JSON the engine sent, after `import letta`
and `from letta import *` in the tool's namespace, as the script does) when
letta's schemas import in the venv, else the stand-in defined below, which
offers the tool-facing API of Letta's schemas over the same JSON (fields as
attributes, memory.get_block / get_blocks / list_block_labels / set_block /
update_block_value, get_agent_env_vars_as_dict, model_dump) and predefines
AgentState, Memory and Block. After the call the module's agent_state is
returned as agent_state.model_dump(mode="json") (null when that fails), so
the tool's in-place changes come back. A tool that does not declare
agent_state never receives it (it holds secrets) and can never return one.
An injected name may not also appear in args.

The tool module is "__main__" (registered in sys.modules in the tool process),
as in Letta's generated script, which runs as the main program: an
`if __name__ == "__main__":` block in a tool runs (after the module's other
top-level code, before the call), and tracebacks name the tool's own
exception classes without a module prefix. Its __file__ is
<working directory>/tmpXXXXXXXX.py, a file holding the source (Letta's script
is a temporary .py file in its sandbox directory), and its code objects use
that filename. Its namespace starts with what Letta's generated script
defines before the tool's source: the names of `from typing import *`, the
modules pickle, sys, base64, struct, hashlib and os, json as _letta_json,
`Letta` and `client` (None), `agent_state` (the injected state, else None),
`agent_id` when injected, and each argument as a global; so tools that use
Optional, List or os without importing them keep working. pickle, base64
and hashlib are imported only when the tool's code names them, or at its
first use of one it reaches otherwise (_letta_modules): a tool that never
uses them does not pay for them.

Output
======

stdout carries whatever the tool prints and, at the end, exactly one result
frame (unless the runner could not read a usable request, see exit code 3):

    "\\n<<TSB-RESULT-" nonce ">>" base64(payload) "<<TSB-END-" nonce ">>\\n"

payload is ASCII text, written by json.dumps (ensure_ascii, allow_nan), so
Python JSON rather than strict JSON where the value needs it: NaN, Infinity
and -Infinity for non-finite floats, \\uXXXX escapes of lone surrogates,
integers of any size. The engine keeps these values exactly:

    success: {"results": <json>, "agent_state": <object|null>}
    failure: {"results": null, "agent_state": null,
              "error": {"kind": "tool" | "request", "name": str, "message": str,
                        "raised": true (optional, see below)}}

results is the return value turned into JSON the way Letta's script does it
(json.dumps(..., default=str) after a pydantic wrapper): JSON types map
directly (tuples become lists, dict keys become strings), pydantic models and
dataclasses become objects, anything else becomes str(value). When that fails
(a cycle, extreme depth) the whole value becomes str(value) and a warning goes
to stderr. Non-finite floats stay floats (NaN, Infinity, -Infinity above).

stderr carries the tool's own stderr. When the tool raises (while its module
is executed or while it is called), the traceback is printed to stderr as
CPython would print it, starting at the first tool frame, so its last line is
e.g. "ZeroDivisionError: division by zero", which Letta's
parse_stderr_error_msg understands. A runner-detected failure prints one line
of the same form ("TypeError: ...").

error.raised is true when the tool itself raised the exception (or called
sys.exit with a non-zero code): its traceback, or what CPython prints for
that exit, is on stderr, and the daemon reads the error from there as
Letta's parse_stderr_error_msg does. sys.exit(), sys.exit(0) and
sys.exit(None) are a success with results null, as in Letta's script (which
then ends with status 0 before writing its result).

Exit status: 0 success; 1 the tool failed (raised, called sys.exit with a
non-zero code, or its process died: error.kind "tool"); 2 the request was unusable (unknown argument,
missing function: error.kind "request"); 3 no frame was written (stdin not a
pipe, unreadable request, no valid nonce, runner started without -I -S, the
runner could not protect itself or write to stdout).

Channel mode (run_channel())
============================

stdin must be a stream socket: one end of a pair whose other end the daemon
holds (daemon/frontend/letta/letta.h, "The result channel"). The runner moves it off fd 0
(close-on-exec; the tool reads EOF from stdin), then:

1. reads the first part: a 4-byte big-endian length (at most 1 GiB), then
   {"tool_name", "source_code"}, or {"unpickle": "<base64>"};
2. writes its declaration, b"TSB1 agent_state=1\n" when the function
   declares agent_state (_declared_params; always for unpickle), else
   b"TSB1 agent_state=0\n", before any code but its own and the standard
   library's has run in its process;
3. reads the second part, likewise: {"args", "json_schema", "agent_state",
   "agent_id", "env"} (the fields above; the daemon sends agent_state only
   after a "1"), or {} for unpickle;
4. runs the tool in this same process, as the nonce mode's tool process
   does (site.main(), the tool module as __main__, its source file, the
   namespace, the env), and writes the payload (as above, JSON text) on
   the socket;
5. ends as Letta's script ends, without the interpreter's teardown:
   non-daemon threads joined, atexit handlers run, stdio and every file
   object left open for writing flushed, the source file removed, os._exit
   with the exit status above (what it skips: __del__ of objects still
   alive, see _lean_exit).

stdout and stderr carry the tool's output only: nothing in them is the
result. A request the runner cannot read ends it with status 3 and no
payload; a request it can read but not run, with a "request" error payload
and status 2.

Threat model (channel mode)
===========================

What must hold is the same as below: no result the tool did not return, no
agent_state from a tool that does not declare it. No secret is needed for
the first: the result's channel is not the tool's output, so nothing the
tool prints counts. The tool can write to the channel itself (the
descriptor is in its process); that only chooses its own result, which
returning a value does too. The daemon accepts an agent_state only after a
"1" declaration, which this runner writes before the tool's source is even
compiled, so a tool that does not declare agent_state never receives the
agent's state and cannot return one. docs/SECURITY.md ("Tool mode: the
result channel") weighs the two modes.

Threat model (nonce mode)
=========================

The tool is hostile and runs with the runner's uid. What must hold: nothing
the tool does or prints can make the engine accept a result the tool did not
return, or an agent_state from a tool that did not declare agent_state. Letta's
framings fail this (fixed public markers, first occurrence wins), and a nonce
held in the tool's own process would too: a tool could find it in the
runner's variables, on the interpreter's heap or by re-reading stdin.

So the nonce never enters the tool's address space:

1. The runner forks before it reads stdin. The child (the tool process) first
   replaces its fd 0 with an empty pipe, then waits for the request the
   parent forwards to it over a private pipe, without the nonce. The nonce is
   only ever read by the parent, after the fork, so it is not in the memory the
   child inherited either.
2. The runner makes itself non-dumpable (prctl(PR_SET_DUMPABLE, 0) through
   ctypes) before the fork, so the parent is from the first instruction the
   child runs (its site.main() runs the venv's .pth files, which would
   otherwise race the parent). A same-uid process can then no longer
   ptrace it, read /proc/<parent>/mem or open its /proc/<parent>/fd/0.
   If that call fails the runner exits without running the tool. The child
   makes itself dumpable again first thing, as a tool's process normally is.
3. The parent never executes tool or venv code (-S, see above); it only
   parses the source with ast to see which parameters the function declares.
4. The child sends {results, agent_state} or {error} back over a private
   pipe; the parent checks the shape, drops agent_state unless it was
   declared, and writes the only frame to its own fd 1, which the tool cannot
   redirect (it can only change its own descriptor table). It does so after
   the child exited, so the child's output comes first.

What the tool can still do: lie about its own result (it could just return
that value), print any text including forged frames (ignored: wrong nonce),
kill or stop the parent (the run then ends without a frame, which the engine
reports as an error), and leave a grandchild writing to stdout after the
frame (text after the frame is returned as stdout; a write that lands inside
the frame, possible for frames larger than PIPE_BUF, breaks the frame's
base64 and the run fails). The engine accepts a frame only if it occurs
exactly once (see extract_nonce_frame in daemon/frontend/letta/letta.h).

What this relies on from the sandbox: the tool has no CAP_SYS_PTRACE (with it,
non-dumpable does not stop /proc/<pid>/mem or ptrace; as root outside a user
namespace the nonce is readable); the pids limit leaves room for the runner's
two processes plus the tool's own; the seccomp policy allows fork/clone,
pipe2, poll, wait4, kill and prctl(PR_SET_DUMPABLE); the image has libffi for
ctypes; stdin is a pipe.
"""

# Only cheap modules at the top: imports before the fork sit on every run's
# critical path. The rest is imported where needed, in the one process that
# needs it.
import json
import os
import stat
import struct
import sys

EXIT_OK = 0
EXIT_TOOL_ERROR = 1
EXIT_REQUEST_ERROR = 2
EXIT_NO_FRAME = 3

FRAME_START = b"<<TSB-RESULT-"
FRAME_END = b"<<TSB-END-"
FRAME_CLOSE = b">>"

_REQUEST_FIELDS = frozenset(
    ["nonce", "tool_name", "source_code", "args", "json_schema", "agent_state", "agent_id", "env"]
)
# Channel mode (run_channel): the request in two parts, the declaration between them.
_FIRST_PART_FIELDS = frozenset(["tool_name", "source_code"])
_SECOND_PART_FIELDS = frozenset(["args", "json_schema", "agent_state", "agent_id", "env"])
_PART_HEADER = struct.Struct(">I")
_MAX_PART_BYTES = 1 << 30  # the daemon sends far less (its request limit)
CHANNEL_DECLARATION = b"TSB1 agent_state=%d\n"
_MAX_RESULT_DEPTH = 200  # nesting depth kept as JSON; deeper values fall back to str()
_MSG_HEADER = struct.Struct(">Q")  # child -> parent: length, then JSON
# Bounds the parent's memory only: the engine's stdout cap (1 MiB by default)
# stops far smaller results from reaching the engine anyway.
_MAX_RESULT_BYTES = 64 << 20


class RequestError(Exception):
    """The request cannot be run; reported as error.kind "request"."""

    def __init__(self, name, message):
        super().__init__(message)
        self.name = name
        self.message = message


class Fatal(Exception):
    """No frame can be written (exit 3)."""


# ---------------------------------------------------------------------------
# Raw fd I/O: it keeps working whatever sys.stdout has become
# ---------------------------------------------------------------------------


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _error_line(fd, name, message):
    """One CPython-style exception line on stderr, for Letta's stderr regex."""
    text = "%s: %s\n" % (name, message) if message else "%s\n" % name
    try:
        _write_all(fd, text.encode("utf-8", "backslashreplace"))
    except OSError:
        pass


def _error_payload(kind, name, message, raised=False):
    """raised: the tool raised it and its traceback (or, for SystemExit, what
    CPython prints) is on stderr, where Letta reads the error from."""
    err = {"kind": kind, "name": name, "message": message}
    if raised:
        err["raised"] = True
    return {"results": None, "agent_state": None, "error": err}


# ---------------------------------------------------------------------------
# Parent: holds the nonce, never runs tool code
# ---------------------------------------------------------------------------


def _set_dumpable(dumpable):
    # ctypes is only imported here, just before the fork (nonce mode only).
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    PR_SET_DUMPABLE = 4
    if prctl(PR_SET_DUMPABLE, dumpable, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "prctl(PR_SET_DUMPABLE, %d): %s" % (dumpable, os.strerror(err)))


def _valid_nonce(nonce):
    return (
        isinstance(nonce, str)
        and len(nonce) == 32
        and all(c in "0123456789abcdef" for c in nonce)
    )


def _declared_params(source, tool_name):
    """Parameter names of every def named tool_name, as Letta's
    parse_function_arguments finds them (ast.walk over the whole module, the
    positional-or-keyword parameters of each def). The
    source is parsed, never executed. Unparsable source declares nothing; the
    child will report the SyntaxError."""
    # The C-level _ast module and compile(PyCF_ONLY_AST) are what ast.parse
    # uses; importing the ast module itself would cost ~10 ms of startup.
    import _ast

    try:
        tree = compile(source, "<tool>", "exec", _ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    names = set()
    stack = [tree]
    while stack:  # ast.walk, without recursion
        node = stack.pop()
        if isinstance(node, (_ast.FunctionDef, _ast.AsyncFunctionDef)) and node.name == tool_name:
            # node.args.args only, as Letta: a positional-only or
            # keyword-only agent_state is not injected (the call then fails
            # as it does in Letta).
            names.update(arg.arg for arg in node.args.args)
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, _ast.AST):
                stack.append(value)
            elif isinstance(value, list):
                stack.extend(v for v in value if isinstance(v, _ast.AST))
    return names


def _validate_request(req, declared=None):
    """Check the request and build what the tool process receives (no
    nonce). declared: _declared_params of its source, when known already."""
    import keyword

    unknown = sorted(set(req) - _REQUEST_FIELDS)
    if unknown:
        raise RequestError("ValueError", "unknown request field(s): " + ", ".join(map(repr, unknown)))
    tool_name = req.get("tool_name")
    if not isinstance(tool_name, str) or not tool_name.isidentifier() or keyword.iskeyword(tool_name):
        raise RequestError("ValueError", "tool_name must be a Python identifier")
    source = req.get("source_code")
    if not isinstance(source, str):
        raise RequestError("ValueError", "source_code must be a string")
    args = req.get("args")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise RequestError("ValueError", "args must be an object")
    agent_state = req.get("agent_state")
    if agent_state is not None and not isinstance(agent_state, dict):
        raise RequestError("ValueError", "agent_state must be an object or null")
    agent_id = req.get("agent_id")
    if agent_id is not None and not isinstance(agent_id, str):
        raise RequestError("ValueError", "agent_id must be a string or null")
    env = req.get("env")
    if env is None:
        env = {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise RequestError("ValueError", "env must be an object of strings")
    if any(not k or "=" in k or "\0" in k or "\0" in v for k, v in env.items()):
        raise RequestError("ValueError", "env holds a name or value no environment can")

    schema = req.get("json_schema")
    if schema is not None:
        if not isinstance(schema, dict):
            raise RequestError("ValueError", "json_schema must be an object or null")
        params = schema.get("parameters", {})
        props = params.get("properties", {}) if isinstance(params, dict) else None
        if not isinstance(props, dict):
            raise RequestError("ValueError", "json_schema.parameters.properties must be an object")
        extra = [name for name in args if name not in props]
        if extra:
            raise RequestError(
                "TypeError",
                "%s() got unexpected argument(s) not in its json_schema: %s"
                % (tool_name, ", ".join(map(repr, extra))),
            )

    if declared is None:
        declared = _declared_params(source, tool_name)
    inject_agent_state = "agent_state" in declared
    inject_agent_id = "agent_id" in declared
    for name, injected in (("agent_state", inject_agent_state), ("agent_id", inject_agent_id)):
        if injected and name in args:
            raise RequestError(
                "TypeError", "%s() argument %r is supplied by the sandbox, not by args" % (tool_name, name)
            )

    child_req = {
        "tool_name": tool_name,
        "source_code": source,
        "args": args,
        "inject_agent_state": inject_agent_state,
        # Only a tool that declares agent_state ever sees it: it carries secrets.
        "agent_state": agent_state if inject_agent_state else None,
        "inject_agent_id": inject_agent_id,
        "agent_id": agent_id if inject_agent_id else None,
        "env": env,
    }
    return child_req, inject_agent_state


def _validate_unpickle_request(req):
    unknown = sorted(set(req) - {"nonce", "unpickle"})
    if unknown:
        raise RequestError("ValueError", "an unpickle request has only nonce and unpickle, not " + ", ".join(map(repr, unknown)))
    if not isinstance(req["unpickle"], str):
        raise RequestError("ValueError", "unpickle must be a base64 string")
    return {"unpickle": req["unpickle"]}


class _ChildFailure(Exception):
    """The child could not report; the parent describes what happened."""


def _read_nonblocking(fd):
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None


def _message_complete(buf):
    if len(buf) < _MSG_HEADER.size:
        return False
    (n,) = _MSG_HEADER.unpack_from(buf)
    return len(buf) >= _MSG_HEADER.size + n


def _collect_child(pid, fd):
    """Read the child's message and reap it. The message is length-prefixed
    rather than read to EOF: a forked grandchild may hold the pipe open. If the
    child dies without a complete message while a grandchild keeps the pipe
    open, the periodic waitpid notices and stops waiting for data. Returns
    (body or None, wait status); raises _ChildFailure for an oversized result."""
    import select

    os.set_blocking(fd, False)
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    buf = bytearray()
    status = None
    while not _message_complete(buf):
        if len(buf) >= _MSG_HEADER.size and _MSG_HEADER.unpack_from(buf)[0] > _MAX_RESULT_BYTES:
            # The child may be blocked writing the rest into a full pipe.
            import signal

            os.kill(pid, signal.SIGKILL)
            if status is None:
                os.waitpid(pid, 0)
            raise _ChildFailure("tool result is larger than %d bytes" % _MAX_RESULT_BYTES)
        if status is not None:
            chunk = _read_nonblocking(fd)  # child gone: take only what is already there
            if not chunk:
                break
            buf += chunk
            continue
        if poller.poll(100):
            chunk = _read_nonblocking(fd)
            if chunk == b"":
                break  # EOF
            if chunk:
                buf += chunk
                continue
        pid_done, st = os.waitpid(pid, os.WNOHANG)
        if pid_done == pid:
            status = st
    if status is None:
        _, status = os.waitpid(pid, 0)
    if not _message_complete(buf):
        return None, status
    (n,) = _MSG_HEADER.unpack_from(buf)
    return bytes(buf[_MSG_HEADER.size : _MSG_HEADER.size + n]), status


def _describe_death(status):
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            import signal

            signame = " (%s)" % signal.Signals(sig).name
        except (ImportError, ValueError):
            signame = ""
        return "tool process was killed by signal %d%s before returning a result" % (sig, signame)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
    return "tool process exited with status %d before returning a result" % code


def _final_payload(body, status, inject_agent_state):
    """Turn the child's message into the frame payload, trusting nothing in it
    beyond its JSON shape. Returns (payload, exit_code); raises _ChildFailure
    when there is no usable message."""
    if body is None:
        # Status 0 without a result (os._exit(0)): Letta's script ended with
        # status 0 before writing one, a success returning None.
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            return {"results": None, "agent_state": None}, EXIT_OK
        raise _ChildFailure(_describe_death(status))
    try:
        msg = json.loads(body)
    except (ValueError, RecursionError, MemoryError):
        msg = None
    if not isinstance(msg, dict):
        raise _ChildFailure("tool process sent a malformed result")
    if "error" in msg:
        err = msg["error"]
        if (
            isinstance(err, dict)
            and err.get("kind") in ("tool", "request")
            and isinstance(err.get("name"), str)
            and isinstance(err.get("message"), str)
        ):
            code = EXIT_REQUEST_ERROR if err["kind"] == "request" else EXIT_TOOL_ERROR
            return _error_payload(err["kind"], err["name"], err["message"], err.get("raised") is True), code
        raise _ChildFailure("tool process sent a malformed error")
    if "results" not in msg:
        raise _ChildFailure("tool process sent a malformed result")
    agent_state = msg.get("agent_state") if inject_agent_state else None
    if agent_state is not None and not isinstance(agent_state, dict):
        return (
            _error_payload("tool", "TypeError", "agent_state must stay a dict, got %s" % type(agent_state).__name__),
            EXIT_TOOL_ERROR,
        )
    return {"results": msg["results"], "agent_state": agent_state}, EXIT_OK


def _frame(nonce, payload):
    import base64

    text = json.dumps(payload, ensure_ascii=True, allow_nan=True, separators=(",", ":"))
    n = nonce.encode("ascii")
    return (
        b"\n" + FRAME_START + n + FRAME_CLOSE
        + base64.b64encode(text.encode("ascii"))
        + FRAME_END + n + FRAME_CLOSE + b"\n"
    )


def _emit(nonce, payload):
    try:
        frame = _frame(nonce, payload)
    except (ValueError, TypeError, RecursionError) as e:
        # The parent re-encodes what json.loads produced, so this should not happen.
        frame = _frame(nonce, _error_payload("tool", "RuntimeError", "result could not be encoded: %s" % e))
    try:
        _write_all(1, frame)
    except OSError as e:
        raise Fatal("cannot write the result frame to stdout: %s" % e) from None


def _abort_child(pid, to_child):
    """Release a child that will not get a request: EOF makes it exit."""
    try:
        os.close(to_child)
    except OSError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


class _ExactIntegers:
    """Integers of any size while the request is read and handed on.

    The daemon passes the client's integers through byte for byte; Python
    (3.11+) refuses to convert one of more than 4300 digits by default. The
    limit is lifted only around the runner's own json.loads/json.dumps of
    the request, so the tool's code sees the interpreter's usual behaviour.
    """

    def __enter__(self):
        self.old = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else None
        if self.old is not None:
            sys.set_int_max_str_digits(0)

    def __exit__(self, *exc):
        if self.old is not None:
            sys.set_int_max_str_digits(self.old)
        return False


def _loads_request(data):
    with _ExactIntegers():
        return json.loads(data)


def _parent_main(pid, to_child, from_child):
    try:
        data = _read_all(0)
        req = _loads_request(data)
    except (OSError, ValueError, RecursionError) as e:
        _abort_child(pid, to_child)
        raise Fatal("cannot read the request: %s" % e) from None
    del data
    if not isinstance(req, dict) or not _valid_nonce(req.get("nonce")):
        _abort_child(pid, to_child)
        raise Fatal("request must be an object with a 32-character lowercase hex nonce")
    nonce = req["nonce"]

    try:
        if "unpickle" in req:
            child_req, inject_agent_state = _validate_unpickle_request(req), True
        else:
            child_req, inject_agent_state = _validate_request(req)
    except RequestError as e:
        _abort_child(pid, to_child)
        _error_line(2, e.name, e.message)
        _emit(nonce, _error_payload("request", e.name, e.message))
        return EXIT_REQUEST_ERROR
    del req

    source_file = child_req["source_file"] = None if "unpickle" in child_req else _source_path()
    with _ExactIntegers():
        child_text = json.dumps(child_req)
    try:
        _write_all(to_child, child_text.encode("utf-8"))
    except OSError:
        pass  # the child died already; _collect_child reports how
    finally:
        os.close(to_child)
    del child_req, child_text

    try:
        body, status = _collect_child(pid, from_child)
        payload, code = _final_payload(body, status, inject_agent_state)
    except _ChildFailure as e:
        # The child printed nothing about this; leave the usual stderr line.
        payload, code = _error_payload("tool", "RuntimeError", str(e)), EXIT_TOOL_ERROR
        _error_line(2, "RuntimeError", str(e))
    finally:
        try:
            if source_file is not None:
                os.unlink(source_file)
        except OSError:
            pass
    _emit(nonce, payload)
    return code


# ---------------------------------------------------------------------------
# Child: runs the tool
# ---------------------------------------------------------------------------


def _flush_std():
    for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            f.flush()
        except Exception:
            pass


def _safe_str(value):
    try:
        return str(value)
    except Exception:
        try:
            return "<unprintable %s object>" % type(value).__name__
        except Exception:
            return "<unprintable object>"


def _report_exception(exc, err_fd, filename):
    """Print exc to stderr the way CPython prints an uncaught exception, then
    describe it for the frame."""
    _flush_std()
    name = type(exc).__name__
    if isinstance(exc, SystemExit):
        # As the interpreter running Letta's script: sys.exit(), sys.exit(0)
        # and sys.exit(None) end it with status 0 before any result is
        # written (Letta: success, func_return None); CPython prints nothing
        # for an int code, else str(code), and exits with status 1.
        code = exc.code
        if code is None or (isinstance(code, int) and code == 0):
            return {"results": None, "agent_state": None}
        if not isinstance(code, int):
            _error_line(err_fd, _safe_str(code), "")
        return _error_payload("tool", name, _safe_str(code), raised=True)
    try:
        import traceback

        # Drop the runner's own frames (and asyncio's, for async tools): the
        # traceback starts at the first frame of the tool's code. With no tool
        # frame (a SyntaxError, a bad call) only the exception itself is shown.
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != filename:
            tb = tb.tb_next
        text = "".join(traceback.format_exception(type(exc), exc, tb))
        _write_all(err_fd, text.encode("utf-8", "backslashreplace"))
    except Exception:
        _error_line(err_fd, name, _safe_str(exc))
    return _error_payload("tool", name, _safe_str(exc), raised=True)


def _json_float(f):
    if f != f:
        return "NaN"
    if f in (float("inf"), float("-inf")):
        return "Infinity" if f > 0 else "-Infinity"
    return f


def _json_key(k):
    # json.dumps turns these key types into strings; other keys make it raise,
    # Letta's script then fails. Using str() for them is kinder and harmless.
    if isinstance(k, str):
        return str.__str__(k)
    if k is True:
        return "true"
    if k is False:
        return "false"
    if k is None:
        return "null"
    if isinstance(k, int):
        return int.__repr__(k)
    if isinstance(k, float):
        f = _json_float(float(k))
        return f if isinstance(f, str) else float.__repr__(f)  # as json.dumps writes float keys
    return str(k)


_NOT_CONVERTED = object()


def _jsonable(obj, depth, active):
    """A JSON-only copy of obj, following json.dumps(default=str) after
    pydantic's Any serialization: models and dataclasses become dicts."""
    if obj is None or obj is True or obj is False:
        return obj
    if isinstance(obj, str):
        return str.__str__(obj)
    if isinstance(obj, int):
        return int(int.__index__(obj))
    if isinstance(obj, float):
        # NaN and the infinities stay floats: json.dumps writes them as NaN,
        # Infinity and -Infinity, as in Letta's script.
        return float(obj)
    if depth > _MAX_RESULT_DEPTH:
        raise ValueError("result nested deeper than %d levels" % _MAX_RESULT_DEPTH)
    if isinstance(obj, (list, tuple, dict)):
        if id(obj) in active:
            raise ValueError("Circular reference detected")
        active.add(id(obj))
        try:
            if isinstance(obj, dict):
                return {_json_key(k): _jsonable(v, depth + 1, active) for k, v in obj.items()}
            return [_jsonable(v, depth + 1, active) for v in obj]
        finally:
            active.discard(id(obj))
    if not isinstance(obj, type):
        converted = _NOT_CONVERTED
        model_dump = getattr(obj, "model_dump", None)  # a pydantic v2 model
        if callable(model_dump):
            try:
                converted = model_dump(mode="json")
            except Exception:
                pass
        elif hasattr(type(obj), "__dataclass_fields__"):
            try:
                import dataclasses

                converted = dataclasses.asdict(obj)
            except Exception:
                pass
        if converted is not _NOT_CONVERTED:
            return _jsonable(converted, depth + 1, active)
    return str(obj)


def _serialize_result(value, err_fd):
    try:
        return _jsonable(value, 0, set())
    except Exception as e:
        _error_line(
            err_fd,
            "Warning",
            "result of type %s is not JSON-serializable (%s); returning str() of it"
            % (type(value).__name__, _safe_str(e)),
        )
        return _safe_str(value)


def _payload_bytes(msg):
    return json.dumps(msg, ensure_ascii=True, allow_nan=True, separators=(",", ":")).encode("ascii")


def _encode_result(msg, err_fd):
    """(the JSON text the runner sends on, the message it holds): msg, or
    where json.dumps refuses its value as it would in Letta's script (an
    integer past sys.get_int_max_str_digits()), the error the run fails with."""
    try:
        return _payload_bytes(msg), msg
    except ValueError as e:
        _error_line(err_fd, "ValueError", _safe_str(e))
        msg = _error_payload("tool", "ValueError", _safe_str(e), raised=True)
        return _payload_bytes(msg), msg


def _source_path():
    """Where the tool's source goes: a random .py name in the working
    directory, as Letta's temporary script (chosen by the parent, which
    removes the file once the tool process has ended, as Letta does)."""
    try:
        return os.path.join(os.getcwd(), "tmp%s.py" % os.urandom(4).hex())
    except OSError:
        return "/tmp/tmp%s.py" % os.urandom(4).hex()


def _write_source(path, source):
    """The tool's source as a file at path, if the directory is writable."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            _write_all(fd, source.encode("utf-8", "surrogatepass"))
        finally:
            os.close(fd)
    except OSError:
        pass


# ---------------------------------------------------------------------------
# agent_state as a tool sees it. Letta's script gives a tool Letta's own
# pydantic AgentState; where the venv has letta, so does the runner
# (AgentState.model_validate of the JSON the engine sent). Otherwise the tool
# gets the stand-in below: Letta's tool-facing API over the same JSON, written
# from letta/schemas/{agent,memory,block}.py. What it keeps of pydantic:
# fields are attributes (reading a name that is no field is an
# AttributeError, setting one a ValueError), a model is not subscriptable
# (agent_state["id"] is a TypeError, as in Letta), iterating yields
# (name, value) pairs, model_dump()/model_dump_json() give the JSON back. Field
# values are not re-validated on assignment, except a Block's value, which
# must be a string and loses NUL characters as in Letta. Memory.compile()
# (prompt rendering) is not offered.


class ValidationError(ValueError):
    """What the stand-in raises where pydantic raises its ValidationError."""


class _Model:
    _nested = {}  # field -> (model class, holds a list of them)
    _defaults = None  # fields a model built by the tool starts with (Block)

    def __init__(self, **fields):
        if self._defaults is not None:
            fields = dict(self._defaults(), **fields)
        object.__setattr__(self, "_fields", {})
        for k, v in fields.items():
            self._fields[k] = self._wrap(k, v)

    @classmethod
    def model_validate(cls, data):
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise ValidationError("%s expects an object, got %s" % (cls.__name__, type(data).__name__))
        return cls(**data)

    def _wrap(self, name, value):
        nested = self._nested.get(name)
        if nested is None:
            return value
        kind, many = nested
        if many and isinstance(value, list):
            return [kind.model_validate(v) if isinstance(v, dict) else v for v in value]
        if not many and isinstance(value, dict):
            return kind.model_validate(value)
        return value

    def __getattr__(self, name):
        fields = self.__dict__.get("_fields")
        if fields is not None and name in fields and not name.startswith("__"):
            return fields[name]
        raise AttributeError("%r object has no attribute %r" % (type(self).__name__, name))

    def __setattr__(self, name, value):
        if name not in self._fields:
            raise ValueError('"%s" object has no field "%s"' % (type(self).__name__, name))
        self._fields[name] = self._wrap(name, value)

    def __iter__(self):
        return iter(list(self._fields.items()))

    def __eq__(self, other):
        return type(other) is type(self) and other._fields == self._fields

    __hash__ = None

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % kv for kv in self._fields.items()))

    def __str__(self):
        return " ".join("%s=%r" % kv for kv in self._fields.items())

    def _construct(self, fields):
        copied = type(self).__new__(type(self))
        object.__setattr__(copied, "_fields", fields)
        return copied

    def __copy__(self):
        return self._construct(dict(self._fields))

    def __deepcopy__(self, memo):
        import copy

        return self._construct(copy.deepcopy(self._fields, memo))

    def model_dump(self, mode="python", include=None, exclude=None, exclude_none=False, **_):
        out = {}
        for k, v in self._fields.items():
            if (include is not None and k not in include) or (exclude is not None and k in exclude):
                continue
            if exclude_none and v is None:
                continue
            out[k] = _dump_value(v, mode, exclude_none)
        return out

    def model_dump_json(self, **kw):
        return json.dumps(self.model_dump(mode="json", **kw), ensure_ascii=False, default=str)

    def model_copy(self, update=None, deep=False):
        import copy

        copied = copy.deepcopy(self) if deep else copy.copy(self)
        for k, v in (update or {}).items():
            copied._fields[k] = copied._wrap(k, v)
        return copied


def _dump_value(v, mode, exclude_none):
    if isinstance(v, _Model):
        return v.model_dump(mode=mode, exclude_none=exclude_none)
    if isinstance(v, (list, tuple)):
        return [_dump_value(x, mode, exclude_none) for x in v]
    if isinstance(v, dict):
        return {k: _dump_value(x, mode, exclude_none) for k, x in v.items()}
    if mode == "json" and not (v is None or isinstance(v, (str, int, float, bool))):
        return _jsonable(v, 0, set())
    return v


class Block(_Model):
    def __init__(self, **fields):
        # value is required and validated, as in Letta's model.
        if "value" not in fields:
            raise ValidationError("1 validation error for Block\nvalue\n  Field required")
        super().__init__(**fields)
        self.value = fields["value"]

    @staticmethod
    def _defaults():
        import uuid

        # Letta's Block fields and defaults (CORE_MEMORY_BLOCK_CHAR_LIMIT).
        # "value" (required) first, where Letta's model has it.
        return {"value": None, "limit": 100000, "project_id": None, "template_name": None, "is_template": False,
                "template_id": None, "base_template_id": None, "deployment_id": None, "entity_id": None,
                "preserve_on_migration": False, "label": None, "read_only": False, "description": None,
                "metadata": {}, "hidden": None, "id": "block-%s" % uuid.uuid4(), "created_by_id": None,
                "last_updated_by_id": None, "tags": []}

    @classmethod
    def model_validate(cls, data):
        if isinstance(data, dict):
            if "value" not in data:
                raise ValidationError("1 validation error for Block\nvalue\n  Field required")
            block = cls.__new__(cls)
            object.__setattr__(block, "_fields", dict(data))
            block.value = data["value"]
            return block
        return super().model_validate(data)

    def __setattr__(self, name, value):
        if name == "value":
            if not isinstance(value, str):
                raise ValidationError("1 validation error for Block\nvalue\n  Input should be a valid string")
            value = value.replace("\x00", "")
        super().__setattr__(name, value)


class Memory(_Model):
    _nested = {"blocks": (Block, True), "file_blocks": (Block, True)}

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


def _submodel(name):
    return type(name, (_Model,), {})


class AgentState(_Model):
    _nested = {
        "memory": (Memory, False),
        "blocks": (Block, True),
        "llm_config": (_submodel("LLMConfig"), False),
        "embedding_config": (_submodel("EmbeddingConfig"), False),
        "tools": (_submodel("Tool"), True),
        "sources": (_submodel("Source"), True),
        "secrets": (_submodel("AgentEnvironmentVariable"), True),
        "tool_exec_environment_variables": (_submodel("AgentEnvironmentVariable"), True),
        "identities": (_submodel("Identity"), True),
        "managed_group": (_submodel("Group"), False),
        "multi_agent_group": (_submodel("Group"), False),
    }

    def get_agent_env_vars_as_dict(self):
        return {v.key: v.value or "" for v in self._fields.get("secrets") or []}


def _agent_state_for_tool(data, namespace):
    """agent_state as the tool receives it: Letta's AgentState when letta's
    schemas import in the venv (then, as Letta's script does, `from letta
    import *` fills the tool's namespace), else the stand-in (whose
    AgentState, Memory and Block are then predefined)."""
    if data is None:
        return None
    try:
        exec("import letta\nfrom letta import *", namespace)
        from letta.schemas.agent import AgentState as LettaAgentState

        return LettaAgentState.model_validate(data)
    except Exception:
        pass
    namespace.update(AgentState=AgentState, Memory=Memory, Block=Block)
    return AgentState.model_validate(data)


def _agent_state_back(state):
    """The agent state the run returns, as Letta's script makes it:
    agent_state.model_dump(mode="json"), None when that fails."""
    if state is None:
        return None
    try:
        dumped = state.model_dump(mode="json")
        return _jsonable(dumped, 0, set()) if isinstance(dumped, dict) else None
    except Exception:
        return None


def _apply_tool_env(env):
    """The request's variables that change how a program starts (LD_*,
    PYTHON*, ...): the runner started without them, the tool gets them.
    They are set in os.environ (so the tool and every process it starts see
    them), and PYTHONPATH's entries go into sys.path where Python's start-up
    would have put them (before the standard library). Effects that only a
    fresh start has (LD_PRELOAD into this very interpreter, PYTHONHASHSEED)
    apply to the tool's subprocesses only."""
    if not env:
        return
    os.environ.update(env)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if extra:
        import sysconfig

        stdlib = sysconfig.get_paths().get("stdlib")
        at = next((i for i, p in enumerate(sys.path) if stdlib and p.startswith(os.path.dirname(stdlib))), 0)
        sys.path[at:at] = [os.path.abspath(p) for p in extra]


class _ModuleOnFirstUse(type(sys)):  # types.ModuleType
    """One of Letta's script's imports that the tool's code never names
    (_letta_modules), reachable only through globals(), eval() or another
    module. Its first use (an attribute read or set, dir(), repr())
    imports the real module, puts it in the tool's global in its place
    (unless the tool has rebound that name), and forwards to it. What a
    tool can tell apart: type() of the object, and sys.modules without
    that module until its first use."""

    def __init__(self, name, namespace):
        super().__init__(name)
        _LAZY[id(self)] = [namespace, name, self, None]

    def __getattribute__(self, attr):
        return getattr(_module_of(self), attr)

    def __setattr__(self, attr, value):
        setattr(_module_of(self), attr, value)

    def __delattr__(self, attr):
        delattr(_module_of(self), attr)

    def __dir__(self):
        return dir(_module_of(self))

    def __repr__(self):
        return repr(_module_of(self))


_LAZY = {}  # id(stand-in) -> [the tool's globals, the name, the stand-in, the real module once imported]


def _module_of(stand_in):
    entry = _LAZY[id(stand_in)]
    namespace, name, _, real = entry
    if real is None:
        real = __import__(name)
        if isinstance(real, _ModuleOnFirstUse):  # the tool put a stand-in in sys.modules
            raise ImportError("module %r is not available" % name, name=name)
        entry[3] = real
    if namespace.get(name) is stand_in:
        namespace[name] = real
    return real


def _names_in(code):
    """Every name the code objects of a compiled module mention (co_names:
    globals, attributes, imports), nested functions and classes included."""
    names, todo = set(), [code]
    while todo:
        c = todo.pop()
        names.update(c.co_names)
        todo.extend(k for k in c.co_consts if isinstance(k, type(c)))
    return names


def _letta_modules(namespace, names):
    """The modules Letta's script imports before every tool, under the names
    it gives them (import pickle, sys, base64, struct, hashlib, os; import
    json as _letta_json). Those the runner has imported already, and those
    the tool's code names, are the modules themselves. pickle, base64 and
    hashlib (OpenSSL's library) cost a tool that uses none of them about a
    sixth of its run's CPU: one the code never names is a stand-in that
    imports it on first use. (Named ones are real so that what inspects
    the tool's globals by type, as cloudpickle does when it pickles a
    function by value, sees modules.)"""
    namespace.update(sys=sys, os=os, struct=struct, _letta_json=json)
    for name in ("pickle", "base64", "hashlib"):
        module = sys.modules.get(name)
        if module is None and name in names:
            module = __import__(name)
        namespace[name] = module if module is not None else _ModuleOnFirstUse(name, namespace)


def _run_tool(req, err_fd):
    """Execute the tool module and call the function. Returns the message for
    the parent."""
    import linecache
    import types

    name = req["tool_name"]
    source = req["source_code"]
    # As Letta's script, which is a file in the sandbox directory run as the
    # main program: the tool's module is "__main__" (so its
    # `if __name__ == "__main__":` block runs, and tracebacks name its
    # classes without a module), its __file__ is a .py file in the working
    # directory holding its source (a random name, as Letta's temporary
    # file: a tool named like a module must not shadow it there).
    filename = req["source_file"]
    _write_source(filename, source)
    # Let tracebacks show the tool's source lines even where the file could
    # not be written; an entry without an mtime is never invalidated by
    # linecache.checkcache().
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)

    _apply_tool_env(req["env"])

    module = types.ModuleType("__main__")
    module.__file__ = filename
    sys.modules["__main__"] = module  # pickle, dataclasses and typing look modules up here
    try:
        # The names Letta's generated script defines before the tool's
        # source, so a tool written for Letta may use them without importing
        # them: `from typing import *`, the modules it imports, `Letta` and
        # `client` (None without letta_client and LETTA_API_KEY),
        # `agent_state` (the injected state, else None), `agent_id` when
        # injected, and each argument as a global.
        code = compile(source, filename, "exec", dont_inherit=True)
        exec("from typing import *", module.__dict__)
        _letta_modules(module.__dict__, _names_in(code))
        state = None
        if req["inject_agent_state"]:
            state = _agent_state_for_tool(req["agent_state"], module.__dict__)
        module.__dict__.update(Letta=None, client=None, agent_state=state)
        if req["inject_agent_id"]:
            module.__dict__["agent_id"] = req["agent_id"]
        module.__dict__.update(req["args"])
        exec(code, module.__dict__)
    except BaseException as e:
        return _report_exception(e, err_fd, filename)

    fn = module.__dict__.get(name)
    if fn is None or not callable(fn):
        if fn is None:
            exc_name, message = "NameError", "name %r is not defined" % name
        else:
            exc_name, message = "TypeError", "%r object is not callable" % type(fn).__name__
        _flush_std()
        _error_line(err_fd, exc_name, message)
        return _error_payload("request", exc_name, message)

    kwargs = dict(req["args"])
    if req["inject_agent_state"]:
        kwargs["agent_state"] = state
    if req["inject_agent_id"]:
        kwargs["agent_id"] = req["agent_id"]
    try:
        value = fn(**kwargs)
        if hasattr(type(value), "__await__"):
            import asyncio

            async def _await(awaitable):
                return await awaitable

            value = asyncio.run(_await(value))
    except BaseException as e:
        return _report_exception(e, err_fd, filename)

    results = _serialize_result(value, err_fd)
    # As Letta's script: the module's agent_state, which is the object the
    # tool received unless the tool rebound the global.
    agent_state = _agent_state_back(module.__dict__.get("agent_state")) if req["inject_agent_state"] else None
    return {"results": results, "agent_state": agent_state}


# ---------------------------------------------------------------------------
# Child: decodes a pickle payload into plain data
# ---------------------------------------------------------------------------
#
# Scripts Letta generated before it switched to JSON (the seed's
# ToolExecutionSandbox, and its asyncio sandbox until PR #3343) end with
# base64(pickle.dumps({"results": value, "agent_state": agent_state})), which
# letta-server pickle.loads-ed: code execution in the server for any tool
# that prints such a frame. Here the payload is decoded in the run's own
# sandbox, by an unpickler whose find_class never hands out a class or a
# function of the payload's choosing: a few value types are rebuilt (_values()),
# every other global becomes a _Stub class that only records what the pickle
# gives it (constructor arguments, state, items). Stubs then become plain
# data: a model or any object with a __dict__ state becomes a dict of its
# fields (a pydantic model: its __dict__, plus __pydantic_extra__), an object
# built from one argument (an enum member) that argument. results then
# becomes JSON as Letta's JSON script turns a result into it (_jsonable), and
# agent_state as AgentState.model_dump(mode="json") would (datetimes in
# ISO 8601, sets as lists), for the daemon's client to revalidate.


class _Stub:
    """An instance of a class the payload named; records, never runs, anything."""

    _module = _qualname = ""

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        object.__setattr__(obj, "_args", args)
        object.__setattr__(obj, "_kwargs", kwargs)
        object.__setattr__(obj, "_state", None)
        object.__setattr__(obj, "_items", [])
        object.__setattr__(obj, "_mapping", [])
        return obj

    def __init__(self, *args, **kwargs):
        pass

    def __repr__(self):
        return "<%s.%s object>" % (self._module, self._qualname)

    def __setstate__(self, state):
        object.__setattr__(self, "_state", state)

    def __setitem__(self, key, value):
        self._mapping.append((key, value))

    def append(self, value):
        self._items.append(value)

    def extend(self, values):
        self._items.extend(values)


def _stub_class(module, qualname):
    return type("_Stub", (_Stub,), {"_module": module, "_qualname": qualname})


def _reconstructor(cls, base, state):
    # copyreg._reconstructor, which protocols 0 and 1 name for objects: an
    # object of a str, int, list ... subclass carries its value as `state`.
    if isinstance(cls, type) and issubclass(cls, _Stub):
        return cls.__new__(cls) if state is None else cls.__new__(cls, state)
    import uuid

    if cls is uuid.UUID and state is None:  # then its __setstate__, from the BUILD
        return object.__new__(uuid.UUID)
    import pickle

    raise pickle.UnpicklingError("cannot rebuild %r from %r" % (cls, base))


def _latin1_encode(text, encoding="utf-8"):
    # _codecs.encode, which protocols 0 to 2 name for bytes objects.
    import pickle

    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("unexpected bytes encoding in the payload")
    return text.encode("latin1")


def _tz_info(seconds):
    # pydantic_core's TzInfo (the zone of a datetime pydantic parsed).
    import datetime

    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
        return datetime.timezone(datetime.timedelta(seconds=seconds))
    import pickle

    raise pickle.UnpicklingError("bad TzInfo state")


def _ordered_dict(items=()):
    # collections.OrderedDict, as a plain dict: an OrderedDict instance has a
    # __dict__ that the pickle's BUILD could fill.
    return dict(items)


def _values():
    """What find_class hands out for these names: immutable builtin types,
    whose instances have no __dict__ a BUILD could fill, and functions of
    ours, each wrapped anew (a BUILD that sets attributes on one changes
    nothing anything reads)."""
    import datetime
    import decimal
    import uuid

    def fresh(fn):
        return lambda *args: fn(*args)

    return {
        ("builtins", "set"): lambda: set, ("builtins", "frozenset"): lambda: frozenset,
        ("builtins", "bytearray"): lambda: bytearray, ("builtins", "complex"): lambda: complex,
        ("datetime", "datetime"): lambda: datetime.datetime, ("datetime", "date"): lambda: datetime.date,
        ("datetime", "time"): lambda: datetime.time, ("datetime", "timedelta"): lambda: datetime.timedelta,
        ("datetime", "timezone"): lambda: datetime.timezone, ("decimal", "Decimal"): lambda: decimal.Decimal,
        ("uuid", "UUID"): lambda: uuid.UUID,
        ("collections", "OrderedDict"): lambda: fresh(_ordered_dict),
        ("copyreg", "_reconstructor"): lambda: fresh(_reconstructor),
        ("_codecs", "encode"): lambda: fresh(_latin1_encode),
        ("pydantic_core._pydantic_core", "TzInfo"): lambda: fresh(_tz_info),
    }


_MAX_DECODED_VALUES = 1 << 18  # what a pickle's shared references may expand to


class _TooLarge(Exception):
    pass


def _plain(obj, json_mode, depth, active, budget):
    """obj with every stub replaced by plain data; in json_mode also every
    other non-JSON value, as pydantic's mode="json" writes it. budget: a
    one-element list counting down the values produced (shared references
    are copied, so a small pickle can name a huge tree)."""
    import datetime
    import decimal
    import uuid

    budget[0] -= 1
    if budget[0] < 0:
        raise _TooLarge("the payload expands to more than %d values" % _MAX_DECODED_VALUES)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if depth > _MAX_RESULT_DEPTH:
        raise ValueError("the payload is nested deeper than %d levels" % _MAX_RESULT_DEPTH)
    if isinstance(obj, type):
        if issubclass(obj, _Stub):
            return "<class '%s.%s'>" % (obj._module, obj._qualname)
        return str(obj)
    if id(obj) in active:
        raise ValueError("Circular reference detected")
    active.add(id(obj))
    try:
        def sub(v):
            return _plain(v, json_mode, depth + 1, active, budget)

        def key(k):
            # A stub is no key json.dumps takes, and its plain form may not
            # be hashable; in json_mode every key becomes a string as
            # json.dumps writes it (a tuple's str()).
            if isinstance(k, _Stub):
                return _safe_str(sub(k))
            return _json_key(k) if json_mode else k

        if isinstance(obj, _Stub):
            state = obj._state
            if isinstance(state, tuple) and len(state) == 2 and all(x is None or isinstance(x, dict) for x in state):
                merged = dict(state[0] or {})  # (state, slotstate)
                merged.update(state[1] or {})
                state = merged
            if isinstance(state, dict):
                fields = state
                if isinstance(state.get("__dict__"), dict):  # a pydantic model
                    fields = dict(state["__dict__"])
                    if isinstance(state.get("__pydantic_extra__"), dict):
                        fields.update(state["__pydantic_extra__"])
                out = {k: sub(v) for k, v in fields.items()}
                out.update((key(k), sub(v)) for k, v in obj._mapping)
                return out
            if obj._mapping:
                return {key(k): sub(v) for k, v in obj._mapping}
            if obj._items:
                return [sub(v) for v in obj._items]
            if state is None and len(obj._args) == 1 and not obj._kwargs:
                return sub(obj._args[0])  # an enum member, a str or int subclass
            return "<%s.%s object>" % (obj._module, obj._qualname)
        if isinstance(obj, dict):
            return {key(k): sub(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [sub(v) for v in obj]
        if not json_mode:
            return obj  # a set, a datetime, ...: str() of it, as Letta's script writes it (_jsonable)
        if isinstance(obj, (set, frozenset)):
            return [sub(v) for v in obj]
        if isinstance(obj, datetime.datetime):
            text = obj.isoformat()
            return text[:-6] + "Z" if text.endswith("+00:00") else text
        if isinstance(obj, (datetime.date, datetime.time)):
            return obj.isoformat()
        if isinstance(obj, (bytes, bytearray)):
            return bytes(obj).decode("utf-8", "replace")
        if isinstance(obj, (decimal.Decimal, complex, datetime.timedelta, uuid.UUID)):
            return str(obj)
        return _safe_str(obj)
    finally:
        active.discard(id(obj))


def _decode_pickle(b64, err_fd):
    import _compat_pickle
    import base64
    import binascii
    import io
    import pickle

    values = _values()
    stubs = {}

    class _PlainUnpickler(pickle.Unpickler):
        def find_class(self, module, name):
            # Python 2 names, which protocols 0 to 2 write (as pickle's own find_class).
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            elif module in _compat_pickle.IMPORT_MAPPING:
                module = _compat_pickle.IMPORT_MAPPING[module]
            if (module, name) in values:
                return values[(module, name)]()
            if (module, name) not in stubs:
                stubs[(module, name)] = _stub_class(module, name)
            return stubs[(module, name)]

    def failed(exc):
        _error_line(err_fd, type(exc).__name__, _safe_str(exc))
        return _error_payload("tool", type(exc).__name__, _safe_str(exc))

    try:
        data = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as e:
        return failed(e)
    try:
        with _ExactIntegers():
            value = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # UnpicklingError, EOFError, RecursionError, MemoryError, ...
        return failed(e)
    del data
    try:
        # What letta-server read from it.
        results, agent_state = value["results"], value["agent_state"]
    except Exception as e:
        return failed(e)
    budget = [_MAX_DECODED_VALUES]
    try:
        state = _plain(agent_state, True, 0, set(), budget) if agent_state is not None else None
        if state is not None and not isinstance(state, dict):
            raise TypeError("agent_state is a %s, not an object" % type(agent_state).__name__)
        try:
            plain = _plain(results, False, 0, set(), budget)
        except (ValueError, TypeError, RecursionError):
            plain = results  # a cycle, extreme depth: str() of it, with the warning
    except (_TooLarge, ValueError, TypeError, RecursionError) as e:
        return failed(ValueError(str(e)) if isinstance(e, _TooLarge) else e)
    # An empty agent_state is none, as the JSON framings read it.
    return {"results": _serialize_result(plain, err_fd), "agent_state": state or None}


def _empty_stdin():
    """fd 0 becomes an empty pipe: the tool (and its subprocesses) read EOF
    from stdin, never the request stream."""
    r, w = os.pipe()
    os.close(w)
    os.dup2(r, 0)
    os.close(r)


_site_packages_set_up = False


def _tool_process_setup():
    """What the tool's process does before it runs the tool: the venv's
    site-packages, exactly as a normal start without -S would have set them
    up (once: a warm runner may have done it before its hand-over), and the
    modules _run_tool needs."""
    global _site_packages_set_up
    if sys.flags.no_site and not _site_packages_set_up:
        import site

        site.main()
        _site_packages_set_up = True
    _tool_process_setup_imports()


def _tool_process_setup_imports():
    import linecache  # noqa: F401  (used by _run_tool)
    import types  # noqa: F401
    import typing  # noqa: F401


def _run_request(req, err_fd):
    """The tool's message for a validated request: a decoded pickle or the
    tool's own result."""
    return _decode_pickle(req["unpickle"], err_fd) if "unpickle" in req else _run_tool(req, err_fd)


def _child_main(from_parent, to_parent):
    # Before anything else: the tool must never read the request stream.
    _empty_stdin()
    # Dumpable again, as a tool's process is (the parent stays not).
    try:
        _set_dumpable(1)
    except OSError:
        pass  # only less usual for the tool (no core dump), never weaker
    # This needs no request, so it overlaps with the parent's work.
    _tool_process_setup()

    data = _read_all(from_parent)
    os.close(from_parent)
    if not data:
        os._exit(0)  # the parent rejected the request
    req = _loads_request(data)
    del data

    # The tool may rebind fd 2 or sys.stderr; tracebacks still go to the real one.
    err_fd = os.dup(2)
    msg = _run_request(req, err_fd)
    try:
        body, _ = _encode_result(msg, err_fd)
        _write_all(to_parent, _MSG_HEADER.pack(len(body)) + body)
    except (OSError, ValueError) as e:
        _error_line(err_fd, "RuntimeError", "cannot send the result to the runner: %s" % _safe_str(e))
        _flush_std()
        os._exit(EXIT_TOOL_ERROR)  # never a clean exit without a result
    _flush_std()
    # A normal interpreter exit, as at the end of Letta's script: atexit
    # handlers run and non-daemon threads are joined.
    sys.exit(0)


# ---------------------------------------------------------------------------
# Channel mode: one process, the result on its own descriptor
# ---------------------------------------------------------------------------


def _read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("the request ended early")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read_part(fd):
    """One part of a channel request: a 4-byte big-endian length, then that
    many bytes of one JSON object."""
    (n,) = _PART_HEADER.unpack(_read_exact(fd, _PART_HEADER.size))
    if n > _MAX_PART_BYTES:
        raise ValueError("a request part of %d bytes (at most %d)" % (n, _MAX_PART_BYTES))
    part = _loads_request(_read_exact(fd, n))
    if not isinstance(part, dict):
        raise ValueError("a request part is not a JSON object")
    return part


def _first_part_params(first):
    """The parameters the request's function declares, from its first part
    alone (_declared_params); none for a first part that is not a usable
    tool request, whose error is reported once the second part is in."""
    tool_name, source = first.get("tool_name"), first.get("source_code")
    if "unpickle" in first or not isinstance(tool_name, str) or not isinstance(source, str):
        return set()
    return _declared_params(source, tool_name)


def _channel_request(first, second, params):
    """The whole request from its two parts: (what the tool process runs,
    whether agent_state comes back), or RequestError."""
    if "unpickle" in first:
        if second:
            raise RequestError("ValueError", "an unpickle request has no second part")
        return _validate_unpickle_request(first), True
    unknown = sorted(set(first) - _FIRST_PART_FIELDS) + sorted(set(second) - _SECOND_PART_FIELDS)
    if unknown:
        raise RequestError("ValueError", "unknown request field(s): " + ", ".join(map(repr, unknown)))
    req = dict(first)
    req.update(second)
    return _validate_request(req, params)


def _watch_written_files():
    """A flag set once the tool opens a file object for writing (the "open"
    audit event of io.open, the only kind with a buffer of its own): then,
    and only then, _lean_exit looks for open file objects to flush."""
    opened = [False]

    def hook(event, args):
        if event == "open" and not opened[0] and len(args) > 1 and isinstance(args[1], str) and any(
            c in args[1] for c in "wax+"
        ):
            opened[0] = True

    sys.addaudithook(hook)
    return opened


def _flush_files():
    """Flush every open file object, as the interpreter's teardown would
    have when it finalized them: data a tool wrote to a file it never
    closed (a module-level log in a writable bind) is not lost."""
    import gc
    import io

    for obj in gc.get_objects():
        if isinstance(obj, io.IOBase):
            try:
                if not obj.closed:
                    obj.flush()
            except Exception:
                pass


def _lean_exit(code, source_file, files_opened):
    """The end of the tool's process, as the end of Letta's script without
    the interpreter's teardown: non-daemon threads joined, atexit handlers
    run, stdio and (when the tool opened any for writing) every open file
    object flushed; then the source file removed and _exit. What the
    teardown also did and this does not: run __del__ of objects still alive
    (which Python does not promise at exit either). A tool that ends the
    process itself, with os._exit, leaves its source file in the run's
    working directory, a tmpfs of its own that ends with the run."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        pass
    if files_opened[0]:
        _flush_files()
    _flush_std()
    if source_file is not None:
        try:
            os.unlink(source_file)
        except OSError:
            pass
    os._exit(code)


def _stdin_mode():
    """What both modes check first; stdin's st_mode."""
    if not sys.flags.isolated or not sys.flags.no_site:
        raise Fatal("the runner must be started with python3 -I -S")
    try:
        return os.fstat(0).st_mode
    except OSError:
        raise Fatal("stdin is closed") from None


def _as_program(body):
    """Run body() as the whole program: its exit status, or 3 with one
    error line when it cannot start. Never returns."""
    try:
        code = body()
    except Fatal as e:
        _error_line(2, "ToolsandboxRunnerError", str(e))
        code = EXIT_NO_FRAME
    _flush_std()
    os._exit(code)


def _take_channel():
    """The result channel, moved off fd 0 (close-on-exec: no program the
    tool runs inherits it); the tool reads EOF from stdin, as in the nonce
    mode."""
    chan = os.dup(0)
    _empty_stdin()
    return chan


def _channel_main(chan=None):
    if chan is None:
        if not stat.S_ISSOCK(_stdin_mode()):
            raise Fatal("stdin must be the result channel, a stream socket")
        chan = _take_channel()
    try:
        first = _read_part(chan)
        params = _first_part_params(first)
        # An unpickle request's agent_state comes back as decoded. Written
        # before any code but the runner's and the standard library's has
        # run in this process: the daemon trusts it.
        declared = "unpickle" in first or "agent_state" in params
        _write_all(chan, CHANNEL_DECLARATION % int(declared))
        second = _read_part(chan)
    except (OSError, EOFError, ValueError, RecursionError, MemoryError) as e:
        raise Fatal("cannot read the request: %s" % e) from None

    try:
        req, inject_agent_state = _channel_request(first, second, params)
    except RequestError as e:
        _error_line(2, e.name, e.message)
        _write_all(chan, _payload_bytes(_error_payload("request", e.name, e.message)))
        return EXIT_REQUEST_ERROR
    del first, second

    source_file = req["source_file"] = None if "unpickle" in req else _source_path()
    _tool_process_setup()
    files_opened = _watch_written_files()
    # The tool may rebind fd 2 or sys.stderr; tracebacks still go to the real one.
    err_fd = os.dup(2)
    msg = _run_request(req, err_fd)
    del req
    if not inject_agent_state:
        msg["agent_state"] = None
    body, msg = _encode_result(msg, err_fd)
    err = msg.get("error")
    code = EXIT_OK if err is None else EXIT_REQUEST_ERROR if err["kind"] == "request" else EXIT_TOOL_ERROR
    try:
        _write_all(chan, body)
        os.close(chan)
    except (OSError, ValueError) as e:
        _error_line(err_fd, "RuntimeError", "cannot send the result: %s" % _safe_str(e))
        code = EXIT_TOOL_ERROR  # never a clean exit without a result
    del msg
    _lean_exit(code, source_file, files_opened)


def run_channel():
    """The runner as the daemon starts it in a local sandbox (kRunnerBoot):
    the request and the result on the stream socket that is its stdin (see
    "Channel mode" above). Never returns."""
    _as_program(_channel_main)


# ---------------------------------------------------------------------------
# Pooled mode: a sandbox made before its request
# ---------------------------------------------------------------------------

# Written on the channel once a pooled runner is ready for its request.
CHANNEL_READY = b"TSB1 ready\n"
_PR_SET_MM = 35
_PR_SET_MM_MAP = 14
_environ_block = None  # the environment /proc/self/environ shows after a hand-over


class _Environ:
    """The process environment a request brings, made what a cold start's
    execve would have made it. A pooled process starts with the policy's
    fixed variables only; the request's (the daemon checked them against
    the policy) arrive at hand-over. They go into os.environ (and so, by
    putenv, into the C environment every program the tool starts inherits)
    and into the block /proc/self/environ shows, moved there with
    prctl(PR_SET_MM, PR_SET_MM_MAP), which needs no capability (Linux 3.18+
    with CONFIG_CHECKPOINT_RESTORE). Set up, and tried once with the block
    the process started with, before the runner says it is ready: where the
    kernel refuses it, the pooled sandbox ends before any request reaches
    it."""

    # struct prctl_mm_map (linux/prctl.h)
    _FIELDS = ("start_code", "end_code", "start_data", "end_data", "start_brk", "brk", "start_stack",
               "arg_start", "arg_end", "env_start", "env_end", "auxv")

    def __init__(self):
        import ctypes

        self._ct = ctypes
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.sbrk.restype = ctypes.c_void_p
        self._libc.sbrk.argtypes = [ctypes.c_ssize_t]
        self._libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]

        class MmMap(ctypes.Structure):
            _fields_ = [(n, ctypes.c_uint64) for n in self._FIELDS] + [
                ("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]

        self._map = m = MmMap()
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        # The block execve made, as it was (not os.environ, which the
        # interpreter's start may have added to: LC_CTYPE, by PEP 538).
        with open("/proc/self/environ", "rb") as f:
            self._started_with = f.read()

        def field(n):  # proc(5) numbers them from 1; `fields` starts at 3 (state)
            return int(fields[n - 3])

        m.start_code, m.end_code, m.start_stack = field(26), field(27), field(28)
        (m.start_data, m.end_data, m.start_brk, m.arg_start, m.arg_end, m.env_start,
         m.env_end) = (field(n) for n in range(45, 52))
        m.exe_fd = 0xFFFFFFFF  # -1: /proc/self/exe unchanged (that one needs a capability)
        self._set(m.env_start, m.env_end)

    def _set(self, start, end):
        m = self._map
        m.env_start, m.env_end = start, end
        m.brk = self._libc.sbrk(0)  # the current break, read last: nothing allocates between
        if self._libc.prctl(_PR_SET_MM, _PR_SET_MM_MAP, self._ct.addressof(m), self._ct.sizeof(m), 0) != 0:
            raise Fatal("cannot set the process environment (prctl PR_SET_MM_MAP): %s"
                        % os.strerror(self._ct.get_errno()))

    def adopt(self, part):
        """The environ part of a hand-over: {"environ": {"NAME": "value"}},
        names the process does not have yet (the policy's fixed ones stay)."""
        environ = part.get("environ") if isinstance(part, dict) and set(part) == {"environ"} else None
        if not isinstance(environ, dict):
            raise Fatal("the hand-over's first part is not {\"environ\": {...}}")
        for k, v in environ.items():
            if (not isinstance(v, str) or not k or "=" in k or "\0" in k or "\0" in v or k in os.environ):
                raise Fatal("the hand-over's environment holds a name or value a start could not have")
            os.environ[k] = v
        # What execve would have made of the policy's variables, then the
        # request's: the block the process started with, and the new ones.
        block = self._started_with + b"".join(
            os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in environ.items())
        buf = self._ct.create_string_buffer(block, max(1, len(block)))
        start = self._ct.addressof(buf)
        self._set(start, start + len(block))
        global _environ_block
        _environ_block = buf  # the kernel reads it from here on, for the life of the process


def _await_hand_over(tool=False):
    """A pooled runner's wait: the channel taken off fd 0, what the run
    needs loaded, "ready" written, then the request's environment adopted.
    Returns the channel. For a tool also the standard library's modules the
    runner uses, and the venv's site-packages set up now, which the cold
    runner's tool process does after its declaration: warm sandboxes have
    the policy's own venv only (the operator's, root's), never a per-tool
    one, whose code never runs before the declaration."""
    chan = _take_channel()
    environ = _Environ()
    # The standard library modules Letta's namespace (_run_tool) and Letta's
    # generated scripts import: loaded now, they cost the run nothing.
    import base64, hashlib, pickle, typing  # noqa: F401,E401

    # An interpreter's first compile sets up the parser (most of a
    # millisecond): done now, for the declaration's parse and the tool's
    # or the script's compile.
    compile("pass\n", "<warm-up>", "exec")
    compile(b"pass\n", "<warm-up>", "exec")
    if tool:
        import _ast  # noqa: F401  (_declared_params)
        import atexit  # noqa: F401  (_lean_exit)
        import keyword  # noqa: F401  (_validate_request)

        _tool_process_setup()
    _write_all(chan, CHANNEL_READY)
    try:
        environ.adopt(_read_part(chan))
    except (OSError, EOFError, ValueError, RecursionError, MemoryError) as e:
        raise Fatal("cannot read the hand-over: %s" % e) from None
    return chan


def _watch_script():
    """From here on the script's: the file objects it opens for writing are
    watched (_watch_written_files). Returns the script's end."""
    files_opened = _watch_written_files()
    return lambda: _script_end(files_opened)


def _script_end(files_opened):
    """A warm script that ran to its end: the end of a Python program (what
    Py_FinalizeEx does that a program can see: non-daemon threads joined,
    atexit handlers run, stdio and every file object left open for writing
    flushed), then _exit(0) without the interpreter's teardown (the
    modules the hand-over loaded made it the longest part of a short
    script's run). What it skips: __del__ of objects still alive, which
    Python does not promise at exit either, and flushing what C code left
    in C stdio's buffers of files it opened (stdout and stderr are
    unbuffered under -u or PYTHONUNBUFFERED, which the shipped policies
    set). A script that raises, or calls
    sys.exit, never gets here: the interpreter ends it as a cold one, with
    the same traceback and status; so does one whose stdio cannot be
    flushed (the interpreter then reports that, with status 120)."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            pass  # as the interpreter's teardown, which ignores it
    import atexit

    atexit._run_exitfuncs()
    if files_opened[0]:
        _flush_files()
    for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if f is not None:
                f.flush()
        except BaseException:
            return  # the interpreter's own exit reports it
    os._exit(0)


def run_pooled():
    """The runner in a pooled sandbox (kRunnerPooledBoot): started before
    any request exists, it waits on its channel for the hand-over, then is
    the channel mode's runner. Never returns."""

    def body():
        if not stat.S_ISSOCK(_stdin_mode()):
            raise Fatal("stdin must be the result channel, a stream socket")
        return _channel_main(_await_hand_over(tool=True))

    _as_program(body)


def await_script():
    """Script mode in a pooled sandbox (the launcher of
    daemon/policy/policy.h, script_launcher(true)): the hand-over as for a
    tool, then the script, read to EOF. Returns its bytes and _watch_script,
    which the launcher calls just before it runs the script (as a cold
    start's launcher would), for the function it calls when the script has
    run to its end without raising (_script_end).
    The interpreter was started as for a cold script (not -I -S: the venv's
    site-packages are set up before the request, as they would be before
    the script is read)."""
    try:
        if not stat.S_ISSOCK(os.fstat(0).st_mode):
            raise Fatal("stdin must be the hand-over channel, a stream socket")
        chan = _await_hand_over(tool=False)
        source = _read_all(chan)
        os.close(chan)
        return source, _watch_script

    except (Fatal, OSError) as e:
        _error_line(2, "ToolsandboxRunnerError", str(e))
        _flush_std()
        os._exit(EXIT_NO_FRAME)


# ---------------------------------------------------------------------------


def main():
    mode = _stdin_mode()
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        raise Fatal("stdin must be a pipe or a socket")

    # Non-dumpable before the fork: the child's first venv code (a .pth
    # file in its site.main()) runs while the parent still reads stdin.
    try:
        _set_dumpable(0)
    except (OSError, ImportError, AttributeError) as e:
        raise Fatal("cannot make the runner non-dumpable: %s" % e) from None
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    try:
        pid = os.fork()
    except OSError as e:
        raise Fatal("cannot fork the tool process: %s" % e) from None
    if pid == 0:
        os.close(to_child_w)
        os.close(from_child_r)
        _child_main(to_child_r, from_child_w)  # exits
        os._exit(EXIT_NO_FRAME)  # not reached
    os.close(to_child_r)
    os.close(from_child_w)
    return _parent_main(pid, to_child_w, from_child_r)


def run():
    """The runner in the nonce mode, as a program (an E2B cell runs this file
    as a script). Never returns."""
    # Only the parent returns from main(): the child leaves through sys.exit()
    # inside _child_main, with a normal interpreter shutdown. The parent
    # wrote everything with os.write and runs no user code; it skips
    # interpreter finalization (a few ms on every run).
    _as_program(main)


if __name__ == "__main__":
    run()

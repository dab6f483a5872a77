"""toolsandbox runner: call one Letta-style Python tool function inside a sandbox.

This file is trusted code. It is the fixed program the engine runs in place of
the script letta-server generates: the tool's source, arguments and agent state
travel as JSON data, never as spliced source text. Standard library only.

This file is the program: its entry points, and this description of what it
reads and writes. Its code is the package _toolsandbox_runner beside it
(whose __init__.py names each part); each mode imports only the parts it
runs.

Invocation
==========

Two ways, one per place the runner runs:

    /venv/bin/python3 -I -S -B -u -X utf8 -c "<import and run_channel()>" <&result-channel
    python3 -I -S -B -u -X utf8 toolsandbox_runner.py < request-pipe      (run())

In a local sandbox, the -c line (kRunnerBoot in daemon/compile/spawn_policy.h)
appends /opt/toolsandbox/runner to the end of sys.path (after the standard
library), imports this module and calls run_channel(): the "channel mode",
one process, request and result on the stream socket that is its stdin
(see "Channel mode" below). In an E2B cell, which has no such socket, the
cell writes this file and the package into a directory of its own, and the
file runs as a script and calls run(): the "nonce mode" described first
below, two processes, the result in a frame on stdout. Imported rather than
run as a script, every module's bytecode comes from the __pycache__ beside
it (__pycache__/toolsandbox_runner.<tag>.pyc,
_toolsandbox_runner/__pycache__/<part>.<tag>.pyc), compiled at build time
as "checked-hash" .pyc files (PEP 552): each used only while it matches its
source, else that source is compiled in memory as a script would be.
Running this file as a script (python3 -I -S ... toolsandbox_runner.py) is
the same program: it puts its own directory on sys.path (after the
standard library) for the package's import only.

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
payload's choosing (_PlainUnpickler, in the package's unpickler.py) and answers as for a tool:
{"results", "agent_state"} as plain JSON, or an error named as pickle.loads
or the server's result["results"] would have raised it.

Unknown fields are rejected. The environment is set by the engine when it
starts this process, except the request's variables that change how a
program starts (LD_*, MALLOC_*, PYTHON*, GLIBC_TUNABLES and the others glibc
ignores for setuid programs): the engine leaves those out, so that no
request can change how this trusted program starts, and sends them as
"env", which the tool process sets before the tool's module runs
(_apply_tool_env, in tool.py).

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
letta's schemas import in the venv, else the stand-in of letta_models.py, which
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
   alive, see _lean_exit in lean_exit.py); in a warm sandbox, first every
   other descriptor closed and the status written on the end note, fd 3
   at the start (_exit in lean_exit.py).

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

# Nothing but the package at the top: each entry point imports the parts
# its mode runs (_toolsandbox_runner/__init__.py).
import sys

if __name__ == "__main__":
    # Run as a script: -I leaves this file's directory off sys.path. It is
    # there for the package's import only (its parts are then found through
    # the package), after the standard library as kRunnerBoot puts it.
    import os

    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    import _toolsandbox_runner

    del sys.path[-1]
else:
    import _toolsandbox_runner

# The name the classes a tool can meet show (_toolsandbox_runner.ENTRY).
_toolsandbox_runner.ENTRY = __name__

# The parts, in the order __getattr__ looks names up in them.
_PARTS = ("base", "request", "tool", "channel", "lean_exit", "letta_models", "unpickler", "warm", "nonce")


def __getattr__(name):
    """The runner's names, as when it was one module: toolsandbox_runner.X is
    X of the part that defines it (imported then if it was not). So a tool
    that pickles a stand-in AgentState by reference finds its class here."""
    if not name.startswith("__"):
        for part in _PARTS:
            names = __import__("_toolsandbox_runner." + part, fromlist=["_"]).__dict__
            if name in names:
                return names[name]
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def run_channel():
    """The runner as the daemon starts it in a local sandbox (kRunnerBoot):
    the request and the result on the stream socket that is its stdin (see
    "Channel mode" above). Never returns."""
    from _toolsandbox_runner import channel

    channel.run_channel()


def run_pooled():
    """The runner in a pooled sandbox (kRunnerPooledBoot): started before
    any request exists, it waits on its channel for the hand-over, then is
    the channel mode's runner. Never returns."""
    from _toolsandbox_runner import warm

    warm.run_pooled()


def await_script():
    """Script mode in a pooled sandbox (the launcher of
    daemon/compile/spawn_policy.h, script_launcher(true)): the hand-over as for a
    tool, then the script. Returns its bytes and the function the launcher
    calls just before it runs the script (_toolsandbox_runner.warm)."""
    from _toolsandbox_runner import warm

    return warm.await_script()


def run():
    """The runner in the nonce mode, as a program (an E2B cell runs this file
    as a script). Never returns."""
    from _toolsandbox_runner import nonce

    nonce.run()


if __name__ == "__main__":
    run()

"""The trusted tool runner's parts; toolsandbox_runner.py beside this package
is the program, its docstring the protocol. Standard library only.

    base         exit statuses, the two errors, raw descriptor I/O, the
                 channel's framed parts, integers of any size in the
                 request, how a mode starts and ends
    request      a request's checks, and the parameters its function declares
    tool         the tool's process: its module, namespace and environment,
                 the call, its result as JSON
    channel      channel mode (run_channel): the request in two parts and the
                 declaration between them, the result on the socket
    lean_exit    the end of a process without the interpreter's teardown (it
                 imports nothing: a cold script's launcher imports it alone)
    letta_models the stand-ins for Letta's AgentState, Memory and Block
    unpickler    the restricted unpickler of a legacy pickle payload
    warm         a pooled runner's hand-over (run_pooled, await_script)
    nonce        nonce mode (run): two processes, the result in a nonce frame

Each mode imports what it runs: channel mode neither the Letta stand-ins
(until a tool declares agent_state) nor the unpickler (until a pickle
comes), the nonce mode nothing of the channel or the warm hand-over. A
warm runner has all that a tool run may need loaded before its hand-over.
"""

# The module name the classes a tool can meet show (the Letta stand-ins, a
# lazily imported module's type), as when the runner was one module: the
# entry's, "toolsandbox_runner", or "__main__" when it runs as a script.
# toolsandbox_runner.py sets it before anything is imported from here.
ENTRY = "toolsandbox_runner"

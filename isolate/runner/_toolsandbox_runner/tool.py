"""The tool's process: the tool's module (as Letta's generated script makes
it), its namespace and environment, the call, and its result as JSON.
The Letta stand-ins (letta_models) and the unpickler are imported only by
a run that needs them."""

import json
import os
import struct
import sys

from . import ENTRY
from .base import _error_line, _error_payload, _flush_std, _safe_str, _write_all


_MAX_RESULT_DEPTH = 200  # nesting depth kept as JSON; deeper values fall back to str()


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

    __module__ = ENTRY  # what type() of it shows (ENTRY in __init__.py)

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
            from .letta_models import _agent_state_for_tool

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
    agent_state = None
    if req["inject_agent_state"]:
        from .letta_models import _agent_state_back

        agent_state = _agent_state_back(module.__dict__.get("agent_state"))
    return {"results": results, "agent_state": agent_state}


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
    if "unpickle" in req:
        from .unpickler import _decode_pickle

        return _decode_pickle(req["unpickle"], err_fd)
    return _run_tool(req, err_fd)

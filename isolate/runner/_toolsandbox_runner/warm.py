"""A pooled runner (run_pooled, await_script): started before its request,
it loads what a run needs, says it is ready, and takes the hand-over."""

import os
import stat
import struct
import sys

from .base import (EXIT_NO_FRAME, Fatal, _as_program, _error_line, _flush_std, _read_all, _read_part, _stdin_mode,
                   _take_channel, _write_all)
from .lean_exit import _take_end_note, _watch_script

# A warm script imports no more of the runner than this (what its hand-over
# reads with); a warm tool also the channel mode and the tool's process,
# before its hand-over (run_pooled).

# Written on the channel once a pooled runner is ready for its request.
CHANNEL_READY = b"TSB1 ready\n"
_PR_SET_MM = 35
_PR_SET_MM_MAP = 14
# struct prctl_mm_map (linux/prctl.h): twelve u64 (start_code, end_code,
# start_data, end_data, start_brk, brk, start_stack, arg_start, arg_end,
# env_start, env_end, auxv), then auxv_size and exe_fd, u32 each.
_MM_MAP = struct.Struct("=12QII")


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

    def __init__(self):
        self._c = _c_calls()
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        # The block execve made, as it was (not os.environ, which the
        # interpreter's start may have added to: LC_CTYPE, by PEP 538).
        with open("/proc/self/environ", "rb") as f:
            self._started_with = f.read()

        def field(n):  # proc(5) numbers them from 1; `fields` starts at 3 (state)
            return int(fields[n - 3])

        # The layout as the kernel has it, but for the break (read at each
        # call) and the environment's bounds.
        self._code = (field(26), field(27))  # start_code, end_code
        self._data = (field(45), field(46), field(47))  # start_data, end_data, start_brk
        self._stack = field(28)  # start_stack
        self._args = (field(48), field(49))  # arg_start, arg_end
        self._mm = self._c.buffer(bytes(_MM_MAP.size))  # made once: _set allocates nothing on the C heap
        self._set(field(50), field(51))  # env_start, env_end

    def _set(self, start, end):
        c, mm = self._c, self._mm
        # brk: the current break, read last (written in place into the
        # buffer made before: nothing extends the heap between the read and
        # the call); auxv left as it is (size 0); exe_fd -1: the executable
        # link unchanged (that one needs a capability).
        _MM_MAP.pack_into(mm, 0, *self._code, *self._data, c.sbrk(0), self._stack, *self._args, start, end, 0, 0,
                          0xFFFFFFFF)
        if c.prctl(_PR_SET_MM, _PR_SET_MM_MAP, c.addressof(mm), _MM_MAP.size, 0) != 0:
            raise Fatal("cannot set the process environment (prctl PR_SET_MM_MAP): %s" % os.strerror(c.get_errno()))

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
        if not environ:
            return  # the block the process started with is what execve would have made
        # What execve would have made of the policy's variables, then the
        # request's: the block the process started with, and the new ones.
        block = self._started_with + b"".join(
            os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in environ.items())
        buf = self._c.buffer(block)
        # The kernel reads it from here on, for the life of the process: a
        # reference no one drops (a module global would not do: a warm
        # script's launcher forgets the runner's modules, and a collection
        # would free the block under /proc/self/environ).
        self._c.keep(buf)
        start = self._c.addressof(buf)
        self._set(start, start + len(block))


class _CCalls:
    """prctl and sbrk of the C library, and what they need: addressof,
    get_errno, a buffer of given bytes that stays where it is, and keep(),
    which makes an object live as long as the process."""


def _c_calls():
    """The C calls _Environ makes, bound through _ctypes, the C module
    under ctypes: the ctypes package itself (its classes, struct,
    ctypes._endian) takes about a millisecond of CPU to import, on every
    warm sandbox's start, where a cold run imports none of it. An
    interpreter whose _ctypes lacks what this uses gets ctypes'."""
    c = _CCalls()
    try:
        import _ctypes as ct

        class Int(ct._SimpleCData):
            _type_ = "i"

        class ULong(ct._SimpleCData):
            _type_ = "L"

        class SSize(ct._SimpleCData):  # ssize_t: a long on Linux
            _type_ = "l"

        class VoidP(ct._SimpleCData):
            _type_ = "P"

        class Char(ct._SimpleCData):
            _type_ = "c"

        class Prctl(ct.CFuncPtr):
            _flags_ = ct.FUNCFLAG_CDECL | ct.FUNCFLAG_USE_ERRNO
            _restype_ = Int

        class Sbrk(ct.CFuncPtr):
            _flags_ = ct.FUNCFLAG_CDECL
            _restype_ = VoidP

        libc = ct.dlopen(None, os.RTLD_NOW)
        c.prctl = Prctl(ct.dlsym(libc, "prctl"))
        c.prctl.argtypes = (Int, ULong, VoidP, ULong, ULong)
        c.sbrk = Sbrk(ct.dlsym(libc, "sbrk"))
        c.sbrk.argtypes = (SSize,)
        c.addressof, c.get_errno, c.keep = ct.addressof, ct.get_errno, ct.Py_INCREF
        c.buffer = lambda data: (Char * max(1, len(data))).from_buffer_copy(data.ljust(1, b"\0"))
    except (ImportError, AttributeError, TypeError, OSError):
        import ctypes as ct

        libc = ct.CDLL(None, use_errno=True)
        c.prctl, c.sbrk = libc.prctl, libc.sbrk
        c.prctl.argtypes = [ct.c_int, ct.c_ulong, ct.c_void_p, ct.c_ulong, ct.c_ulong]
        c.sbrk.restype, c.sbrk.argtypes = ct.c_void_p, [ct.c_ssize_t]
        c.addressof, c.get_errno = ct.addressof, ct.get_errno
        c.buffer = lambda data: ct.create_string_buffer(data, max(1, len(data)))
        try:
            c.keep = ct.pythonapi.Py_IncRef
            c.keep.argtypes, c.keep.restype = [ct.py_object], None
        except AttributeError:  # no C API to call (not CPython): held here, for as long as this module
            c.keep = _kept.append
    return c


_kept = []


def _preload(modules):
    """Imports each module, as a tool's `import` would; one that cannot be
    imported ends the sandbox before it is ready (the pool counts it lost):
    a module half imported is not what a cold run would find."""
    for name in modules:
        try:
            __import__(name)
        except BaseException as e:  # noqa: B036  (its import may raise anything, SystemExit included)
            raise Fatal("cannot preload module %s: %s: %s" % (name, type(e).__name__, e)) from None


def _await_hand_over(tool=False):
    """A pooled runner's wait: the channel taken off fd 0, what the run
    needs loaded, "ready" written, then the request's environment adopted.
    Returns the channel. For a tool also the standard library's modules the
    runner uses (not its parts for agent_state and pickles, which a run
    that needs them imports, as a cold one does), and the venv's
    site-packages set up now, which the cold
    runner's tool process does after its declaration: warm sandboxes have
    the policy's own venv only (the operator's, root's), never a per-tool
    one, whose code never runs before the declaration."""
    chan = _take_channel()
    _take_end_note()
    environ = _Environ()
    # The policy's warm_pool.preload (by default what Letta's generated
    # scripts import) follows the program in argv: emptied, as a cold
    # start's is, then imported after the venv's site-packages are set up.
    preload = sys.argv[1:]
    del sys.argv[1:]

    # An interpreter's first compile sets up the parser (most of a
    # millisecond): done now, for the declaration's parse and the tool's
    # or the script's compile.
    compile("pass\n", "<warm-up>", "exec")
    compile(b"pass\n", "<warm-up>", "exec")
    if tool:
        import _ast  # noqa: F401  (_declared_params)
        import atexit  # noqa: F401  (_lean_exit)
        import keyword  # noqa: F401  (_validate_request)

        from .tool import _tool_process_setup

        _tool_process_setup()
    _preload(preload)
    _write_all(chan, CHANNEL_READY)
    try:
        environ.adopt(_read_part(chan))
    except (OSError, EOFError, ValueError, RecursionError, MemoryError) as e:
        raise Fatal("cannot read the hand-over: %s" % e) from None
    return chan


def run_pooled():
    """The runner in a pooled sandbox (kRunnerPooledBoot): started before
    any request exists, it waits on its channel for the hand-over, then is
    the channel mode's runner. Never returns."""

    from .channel import _channel_main

    def body():
        if not stat.S_ISSOCK(_stdin_mode()):
            raise Fatal("stdin must be the result channel, a stream socket")
        return _channel_main(_await_hand_over(tool=True))

    _as_program(body)


def await_script():
    """Script mode in a pooled sandbox (the launcher of
    daemon/compile/spawn_policy.h, script_launcher(true)): the hand-over as for a
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
        # The script finds no runner module, as a cold one (whose launcher
        # imports none): the launcher drops toolsandbox_runner and the
        # runner's directory on sys.path, this the package's modules.
        for name in [n for n in sys.modules if n == __package__ or n.startswith(__package__ + ".")]:
            del sys.modules[name]
        return source, _watch_script

    except (Fatal, OSError) as e:
        _error_line(2, "ToolsandboxRunnerError", str(e))
        _flush_std()
        os._exit(EXIT_NO_FRAME)

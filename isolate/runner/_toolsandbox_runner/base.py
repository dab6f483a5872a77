"""What every mode of the runner shares: exit statuses, the two errors, raw
descriptor I/O (it keeps working whatever sys.stdout has become), the
channel's framed parts (channel mode's request, a pooled runner's
hand-over), integers of any size while a request is read, and how a mode
starts and ends as a program."""

# Only cheap modules at the top of any part of the runner: imports before
# the tool runs sit on every run's critical path. The rest is imported
# where needed, in the one process that needs it.
import json
import os
import struct
import sys

from .lean_exit import _flush_std  # noqa: F401 (the modes' flush, from the module with no import of its own)


EXIT_OK = 0
EXIT_TOOL_ERROR = 1
EXIT_REQUEST_ERROR = 2
EXIT_NO_FRAME = 3


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


def _safe_str(value):
    try:
        return str(value)
    except Exception:
        try:
            return "<unprintable %s object>" % type(value).__name__
        except Exception:
            return "<unprintable object>"


# A channel's request parts, and a pooled runner's hand-over (warm): a
# 4-byte big-endian length, then that many bytes of one JSON object.
_PART_HEADER = struct.Struct(">I")
_MAX_PART_BYTES = 1 << 30  # the daemon sends far less (its request limit)


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


def _take_channel():
    """The result channel, moved off fd 0 (close-on-exec: no program the
    tool runs inherits it); the tool reads EOF from stdin, as in the nonce
    mode."""
    chan = os.dup(0)
    _empty_stdin()
    return chan


def _empty_stdin():
    """fd 0 becomes an empty pipe: the tool (and its subprocesses) read EOF
    from stdin, never the request stream."""
    r, w = os.pipe()
    os.close(w)
    os.dup2(r, 0)
    os.close(r)


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

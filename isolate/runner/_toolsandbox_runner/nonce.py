"""Nonce mode (run): the runner as an E2B cell starts it. Two processes: the
parent holds the nonce and never runs tool code, the child runs the tool;
the result goes to stdout in a frame only the parent can write
(toolsandbox_runner.py, "Nonce mode" and "Threat model (nonce mode)").
Everything the parent runs is imported before the fork."""

import json
import os
import stat
import struct
import sys

from .base import (EXIT_NO_FRAME, EXIT_OK, EXIT_REQUEST_ERROR, EXIT_TOOL_ERROR, Fatal, RequestError, _as_program,
                   _empty_stdin, _error_line, _error_payload, _ExactIntegers, _flush_std, _loads_request, _read_all,
                   _safe_str, _stdin_mode, _write_all)
from .request import _validate_request, _validate_unpickle_request
from .tool import _encode_result, _run_request, _source_path, _tool_process_setup


FRAME_START = b"<<TSB-RESULT-"
FRAME_END = b"<<TSB-END-"
FRAME_CLOSE = b">>"
_MSG_HEADER = struct.Struct(">Q")  # child -> parent: length, then JSON
# Bounds the parent's memory only: the engine's stdout cap (1 MiB by default)
# stops far smaller results from reaching the engine anyway.
_MAX_RESULT_BYTES = 64 << 20


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
    payload = {"results": msg["results"], "agent_state": agent_state}
    # A decoded pickle's types (unpickler._types); the daemon checks their shape.
    for key in ("types", "types_omitted"):
        if key in msg:
            payload[key] = msg[key]
    return payload, EXIT_OK


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
# Child: the tool's process (tool.py runs the tool)
# ---------------------------------------------------------------------------


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

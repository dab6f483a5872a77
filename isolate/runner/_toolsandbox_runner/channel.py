"""Channel mode (run_channel): one process, the request and the result on
the stream socket that is its stdin (toolsandbox_runner.py, "Channel
mode")."""

import os
import stat

from .base import (EXIT_OK, EXIT_REQUEST_ERROR, EXIT_TOOL_ERROR, Fatal, RequestError, _as_program, _error_line,
                   _error_payload, _read_part, _safe_str, _stdin_mode, _take_channel, _write_all)
from .lean_exit import _lean_exit, _watch_written_files
from .request import _declared_params, _validate_request, _validate_unpickle_request
from .tool import _encode_result, _payload_bytes, _run_request, _source_path, _tool_process_setup

# The request in two parts, the declaration between them.
_FIRST_PART_FIELDS = frozenset(["tool_name", "source_code"])
_SECOND_PART_FIELDS = frozenset(["args", "json_schema", "agent_state", "agent_id", "env"])
CHANNEL_DECLARATION = b"TSB1 agent_state=%d\n"


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
    the request and the result on the stream socket that is its stdin
    (toolsandbox_runner.py, "Channel mode"). Never returns."""
    _as_program(_channel_main)

"""Synchronous client for toolsandboxd (standard library only)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from . import protocol as P
from .errors import ClientTimeoutError, DaemonConnectionError, ResponseError, TooLargeError
from .session import Session

__all__ = ["Client"]

log = logging.getLogger("toolsandbox_client")

# Extra time the client waits beyond a run's own timeout: the daemon needs a
# moment to kill the tree, collect the output and answer.
DEFAULT_RUN_TIMEOUT_MARGIN = 30.0
# And for a run that asks for pip requirements: its venv may be built first
# (a policy's packages.build.wall_timeout, 300 s by default), which does not
# count toward the run's timeout.
DEFAULT_VENV_BUILD_ALLOWANCE = 330.0


class _Retry(Exception):
    """A reused connection turned out to be closed before our request was read."""


class Client:
    """A client for toolsandboxd's Unix socket.

    socket_path   the daemon's socket.
    timeout       seconds for connecting and for each answer; None waits for
                  ever. For a run the client waits at least the run's own
                  `timeout` plus `run_timeout_margin` (plus
                  `venv_build_allowance` when it asks for pip requirements:
                  its venv may be built first). When the client gives up
                  it closes the connection, which makes the daemon kill the
                  run, and raises ClientTimeoutError.
    persistent    keep one connection open and send every request on it
                  (requests are serialized by a lock). The default opens one
                  connection per request: simple, robust, and safe to share
                  between threads, which then run concurrently.
    max_response_bytes   the largest answer accepted (ResponseError beyond).
    max_request_bytes    when set, larger requests raise TooLargeError
                  locally instead of being sent (the daemon's default cap is
                  32 MiB; the daemon is authoritative either way).

    Methods raise a ToolSandboxError subclass when the daemon refuses a
    request (BusyError, PolicyDeniedError, ...) or the exchange fails
    (DaemonConnectionError, ClientTimeoutError, ResponseError). A tool that
    fails is not an exception: it is a ToolResult with status "error".
    """

    def __init__(
        self,
        socket_path: str = P.DEFAULT_SOCKET_PATH,
        timeout: Optional[float] = None,
        *,
        persistent: bool = False,
        max_response_bytes: int = P.DEFAULT_MAX_RESPONSE_BYTES,
        max_request_bytes: Optional[int] = None,
        run_timeout_margin: float = DEFAULT_RUN_TIMEOUT_MARGIN,
        venv_build_allowance: float = DEFAULT_VENV_BUILD_ALLOWANCE,
    ):
        self.socket_path = socket_path
        self.timeout = timeout
        self.persistent = persistent
        self.max_response_bytes = max_response_bytes
        self.max_request_bytes = max_request_bytes
        self.run_timeout_margin = run_timeout_margin
        self.venv_build_allowance = venv_build_allowance
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = None

    def __repr__(self) -> str:
        return "Client(socket_path=%r, timeout=%r, persistent=%r)" % (self.socket_path, self.timeout, self.persistent)

    # --- public API -----------------------------------------------------------

    def status(self) -> Dict[str, Any]:
        """The daemon's status object (version, runs_in_flight, totals, ...)."""
        req = P.status_request()
        out = self.request(req, "status", self.timeout)
        if not isinstance(out, dict):
            raise ResponseError("\"status\" is not an object", request_id=req["id"])
        return out

    def execute(
        self,
        script: str,
        *,
        tool_name: str,
        organization_id: str,
        env: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        policy: Optional[str] = None,
        sandbox_config: Any = None,
        agent_id: Optional[str] = None,
        project_id: Optional[str] = None,
        e2b: Optional[Mapping[str, Any]] = None,
        source_type: Optional[str] = None,
        npm_requirements: Optional[Iterable[Any]] = None,
    ) -> P.ToolResult:
        """Run a complete Python script (as letta-server generates it) and
        parse its Letta result frame."""
        req = P.execute_request(script, tool_name=tool_name, organization_id=organization_id, env=env,
                                timeout=timeout, policy=policy, sandbox_config=sandbox_config,
                                agent_id=agent_id, project_id=project_id, e2b=e2b,
                                source_type=source_type, npm_requirements=npm_requirements)
        return P.ToolResult.from_json(self.request(req, "result", self._run_wait(timeout, req)), req["id"])

    def run_tool(
        self,
        source_code: str,
        *,
        tool_name: str,
        args: Optional[Mapping[str, Any]],
        organization_id: str,
        json_schema: Optional[Mapping[str, Any]] = None,
        agent_state: Any = None,
        env: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        policy: Optional[str] = None,
        sandbox_config: Any = None,
        agent_id: Optional[str] = None,
        project_id: Optional[str] = None,
        pip_requirements: Optional[Iterable[Any]] = None,
        e2b: Optional[Mapping[str, Any]] = None,
        source_type: Optional[str] = None,
        npm_requirements: Optional[Iterable[Any]] = None,
    ) -> P.ToolResult:
        """Call function `tool_name` of `source_code` with `args` (JSON data,
        never spliced into code). agent_state (a dict or a pydantic model) is
        given to the tool, and returned, only if the function declares it."""
        req = P.run_tool_request(source_code, tool_name=tool_name, args=args, organization_id=organization_id,
                                 json_schema=json_schema, agent_state=agent_state, env=env, timeout=timeout,
                                 policy=policy, sandbox_config=sandbox_config, agent_id=agent_id,
                                 project_id=project_id, pip_requirements=pip_requirements, e2b=e2b,
                                 source_type=source_type, npm_requirements=npm_requirements)
        return P.ToolResult.from_json(self.request(req, "result", self._run_wait(timeout, req)), req["id"])

    def open_session(
        self,
        command: Iterable[str],
        *,
        organization_id: str,
        policy: Optional[str] = None,
        env: Optional[Mapping[str, Any]] = None,
        agent_id: Optional[str] = None,
        workspace: Optional[str] = None,
        request_id: Optional[str] = None,
    ) -> Session:
        """Opens a session (PROTOCOL.md, section 6.8) on a connection of its
        own: `command` runs in a long-lived sandbox of the organization's
        policy, with the returned Session as its stdio. `workspace` names the
        organization's workspace to run in (kept between its sessions, one at
        a time: PROTOCOL.md, section 6.8, "Workspaces"). Raises the error of a
        refusal (PolicyDeniedError, BusyError, ...)."""
        req = P.session_request(command, organization_id=organization_id, policy=policy, env=env,
                                agent_id=agent_id, workspace=workspace, request_id=request_id)
        sock = self._connect()
        try:
            answer, rest = self._exchange_raw(sock, P.encode_request(req), self.timeout)
            payload = P.decode_session_answer(answer, req["id"])
        except BaseException:
            sock.close()
            raise
        session = Session(sock, payload, rest)
        session._signaller = lambda name: self.signal_session(session.session_id, name)
        return session

    def signal_session(self, session_id: str, signal: str) -> None:
        """Sends the command of open session `session_id` a signal ("TERM",
        "INT", "HUP", "QUIT", "USR1", "USR2", "WINCH"): this client's own
        sessions, or any as the operator. Raises BadRequestError when no such
        session runs a command now."""
        req = P.session_signal_request(session_id, signal)
        self.request(req, "killed", self.timeout)

    def close(self) -> None:
        """Close the persistent connection, if any."""
        with self._lock:
            self._drop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- low level ------------------------------------------------------------

    def request(self, req: Mapping[str, Any], expect: str, wait: Optional[float] = None) -> Any:
        """Send one request object (with its "v" and "id") and return the
        payload under `expect` ("result" or "status")."""
        line = P.encode_request(req)
        if self.max_request_bytes is not None and len(line) - 1 > self.max_request_bytes:
            raise TooLargeError("the request is %d bytes, above the limit of %d" % (len(line) - 1, self.max_request_bytes),
                                request_id=req["id"])
        log.debug("toolsandboxd request %s (%d bytes)", P.describe_request(req), len(line))
        if self.persistent:
            with self._lock:
                try:
                    answer = self._exchange_persistent(line, req["id"], wait)
                except _Retry:
                    log.debug("toolsandboxd: the kept connection was closed by the daemon; reconnecting")
                    answer = self._exchange_persistent(line, req["id"], wait, allow_retry=False)
        else:
            sock = self._connect()
            try:
                answer = self._exchange(sock, line, wait)
            finally:
                sock.close()
        try:
            return P.decode_response(answer, req["id"], expect)
        except Exception as e:
            log.debug("toolsandboxd request %s failed: %s", req["id"], getattr(e, "code", type(e).__name__))
            raise

    def _run_wait(self, run_timeout: Optional[float], req: Optional[Mapping[str, Any]] = None) -> Optional[float]:
        if self.timeout is None:
            return None
        # A run that asks for packages may first wait for its venv's build,
        # which is not part of its own timeout.
        build = self.venv_build_allowance if req is not None and P.asks_for_packages(req) else 0.0
        return max(self.timeout, (run_timeout or 0.0) + self.run_timeout_margin + build)

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except socket.timeout:
            sock.close()
            raise ClientTimeoutError("connecting to %s timed out" % self.socket_path) from None
        except OSError as e:
            sock.close()
            raise DaemonConnectionError("cannot connect to toolsandboxd at %s: %s" % (self.socket_path, e.strerror or e)) from e
        return sock

    def _exchange(self, sock: socket.socket, line: bytes, wait: Optional[float]) -> bytes:
        answer, _ = self._exchange_raw(sock, line, wait)
        return answer

    def _exchange_raw(self, sock: socket.socket, line: bytes, wait: Optional[float]) -> Tuple[bytes, bytes]:
        deadline = None if wait is None else time.monotonic() + wait
        try:
            sock.settimeout(wait)
            sock.sendall(line)
        except socket.timeout:
            raise ClientTimeoutError("sending the request to toolsandboxd timed out") from None
        except (BrokenPipeError, ConnectionResetError) as e:
            # The daemon stopped reading (a refused peer, a frame over its
            # limit): its answer may already be waiting.
            try:
                return self._read_line(sock, deadline)
            except DaemonConnectionError:
                raise DaemonConnectionError("toolsandboxd closed the connection: %s" % (e.strerror or e)) from e
        except OSError as e:
            raise DaemonConnectionError("writing to toolsandboxd failed: %s" % (e.strerror or e)) from e
        return self._read_line(sock, deadline)

    def _read_line(self, sock: socket.socket, deadline: Optional[float]) -> Tuple[bytes, bytes]:
        buf = bytearray()
        scanned = 0
        while True:
            nl = buf.find(b"\n", scanned)
            if nl >= 0:
                return bytes(buf[:nl]), bytes(buf[nl + 1:])
            scanned = len(buf)
            if scanned > self.max_response_bytes:
                raise ResponseError("the daemon's answer is larger than %d bytes" % self.max_response_bytes)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ClientTimeoutError("no answer from toolsandboxd in time")
                sock.settimeout(left)
            else:
                sock.settimeout(None)
            try:
                chunk = sock.recv(1 << 18)
            except socket.timeout:
                raise ClientTimeoutError("no answer from toolsandboxd in time") from None
            except OSError as e:
                raise DaemonConnectionError("reading from toolsandboxd failed: %s" % (e.strerror or e)) from e
            if not chunk:
                raise DaemonConnectionError(
                    "toolsandboxd closed the connection without answering" if not buf
                    else "toolsandboxd closed the connection in the middle of an answer")
            buf += chunk

    # --- persistent connection -----------------------------------------------

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def _kept_connection(self) -> Tuple[socket.socket, bool]:
        """The kept connection (connecting if needed) and whether it is reused."""
        if self._sock is not None:
            # Anything readable on an idle connection (EOF, or the daemon's
            # idle-timeout notice) means the daemon is done with it.
            stale = True
            try:
                self._sock.settimeout(0.0)
                self._sock.recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                stale = False
            except OSError:
                pass
            if not stale:
                return self._sock, True
            self._drop()
        self._sock = self._connect()
        return self._sock, False

    def _exchange_persistent(self, line: bytes, request_id: str, wait: Optional[float], allow_retry: bool = True) -> bytes:
        sock, reused = self._kept_connection()
        try:
            answer, rest = self._exchange_raw(sock, line, wait)
        except BaseException:
            self._drop()
            raise
        # The daemon's idle timeout fired just as the request went out: it
        # answered the connection (null id) and never read the request.
        if reused and allow_retry and P.is_idle_close(answer):
            self._drop()
            raise _Retry()
        # Keep the connection only while the daemon keeps it: it answers a
        # request it read with that request's id, and closes after errors
        # about the connection itself (null id).
        if rest or P.response_id(answer) != request_id:
            self._drop()
        return answer

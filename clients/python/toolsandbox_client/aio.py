"""asyncio client for toolsandboxd (standard library only).

The connection is a non-blocking Unix socket driven by the event loop's
sock_* methods rather than asyncio streams: when the daemon refuses a
connection (unauthorized peer, frame over its limit) it answers and closes
at once, and a stream transport that meets the resulting EPIPE/ECONNRESET
throws away the answer it already received. Here the answer is still read.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from . import protocol as P
from .client import DEFAULT_RUN_TIMEOUT_MARGIN, DEFAULT_VENV_BUILD_ALLOWANCE
from .errors import ClientTimeoutError, DaemonConnectionError, ResponseError, TooLargeError
from .session import AsyncSession

__all__ = ["AsyncClient"]

log = logging.getLogger("toolsandbox_client")

_CHUNK = 1 << 18


class _Retry(Exception):
    pass


class AsyncClient:
    """The asyncio twin of Client, with the same methods as coroutines.

    By default every request opens its own connection, so one AsyncClient can
    serve any number of concurrent tasks. With persistent=True requests share
    one connection and are serialized by an asyncio.Lock.

    Cancelling a task that waits for a run closes its connection, which makes
    the daemon kill the run.
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
        self._sock: Optional[socket.socket] = None
        self._lock: Optional[asyncio.Lock] = None  # created in the running loop

    def __repr__(self) -> str:
        return "AsyncClient(socket_path=%r, timeout=%r, persistent=%r)" % (self.socket_path, self.timeout, self.persistent)

    # --- public API -----------------------------------------------------------

    async def status(self) -> Dict[str, Any]:
        req = P.status_request()
        out = await self.request(req, "status", self.timeout)
        if not isinstance(out, dict):
            raise ResponseError("\"status\" is not an object", request_id=req["id"])
        return out

    async def execute(
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
        req = P.execute_request(script, tool_name=tool_name, organization_id=organization_id, env=env,
                                timeout=timeout, policy=policy, sandbox_config=sandbox_config,
                                agent_id=agent_id, project_id=project_id, e2b=e2b,
                                source_type=source_type, npm_requirements=npm_requirements)
        return P.ToolResult.from_json(await self.request(req, "result", self._run_wait(timeout, req)), req["id"])

    async def run_tool(
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
        req = P.run_tool_request(source_code, tool_name=tool_name, args=args, organization_id=organization_id,
                                 json_schema=json_schema, agent_state=agent_state, env=env, timeout=timeout,
                                 policy=policy, sandbox_config=sandbox_config, agent_id=agent_id,
                                 project_id=project_id, pip_requirements=pip_requirements, e2b=e2b,
                                 source_type=source_type, npm_requirements=npm_requirements)
        return P.ToolResult.from_json(await self.request(req, "result", self._run_wait(timeout, req)), req["id"])

    async def open_session(
        self,
        command: Iterable[str],
        *,
        organization_id: str,
        policy: Optional[str] = None,
        env: Optional[Mapping[str, Any]] = None,
        agent_id: Optional[str] = None,
        workspace: Optional[str] = None,
        request_id: Optional[str] = None,
    ) -> AsyncSession:
        """Client.open_session, on the running event loop."""
        req = P.session_request(command, organization_id=organization_id, policy=policy, env=env,
                                agent_id=agent_id, workspace=workspace, request_id=request_id)
        sock = await self._connect()
        try:
            answer, rest = await self._exchange(sock, P.encode_request(req), self.timeout)
            payload = P.decode_session_answer(answer, req["id"])
        except BaseException:
            sock.close()
            raise
        session = AsyncSession(sock, payload, rest)
        session._signaller = lambda name: self.signal_session(session.session_id, name)
        return session

    async def signal_session(self, session_id: str, signal: str) -> None:
        """Client.signal_session's twin."""
        req = P.session_signal_request(session_id, signal)
        await self.request(req, "killed", self.timeout)

    async def close(self) -> None:
        """Close the persistent connection, if any."""
        self._drop()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # --- low level ------------------------------------------------------------

    async def request(self, req: Mapping[str, Any], expect: str, wait: Optional[float] = None) -> Any:
        """Send one request object (with its "v" and "id") and return the
        payload under `expect` ("result" or "status")."""
        line = P.encode_request(req)
        if self.max_request_bytes is not None and len(line) - 1 > self.max_request_bytes:
            raise TooLargeError("the request is %d bytes, above the limit of %d" % (len(line) - 1, self.max_request_bytes),
                                request_id=req["id"])
        log.debug("toolsandboxd request %s (%d bytes)", P.describe_request(req), len(line))
        if self.persistent:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                try:
                    answer = await self._exchange_persistent(line, req["id"], wait)
                except _Retry:
                    log.debug("toolsandboxd: the kept connection was closed by the daemon; reconnecting")
                    answer = await self._exchange_persistent(line, req["id"], wait, allow_retry=False)
        else:
            sock = await self._connect()
            try:
                answer, _ = await self._exchange(sock, line, wait)
            finally:
                sock.close()  # also on cancellation: closing the connection kills the run
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

    async def _connect(self) -> socket.socket:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, self.socket_path), self.timeout)
        except asyncio.TimeoutError:
            sock.close()
            raise ClientTimeoutError("connecting to %s timed out" % self.socket_path) from None
        except OSError as e:
            sock.close()
            raise DaemonConnectionError("cannot connect to toolsandboxd at %s: %s" % (self.socket_path, e.strerror or e)) from e
        except BaseException:
            sock.close()
            raise
        return sock

    async def _exchange(self, sock: socket.socket, line: bytes, wait: Optional[float]) -> Tuple[bytes, bytes]:
        """(answer line, bytes that followed it)."""
        loop = asyncio.get_running_loop()
        deadline = None if wait is None else loop.time() + wait
        try:
            await asyncio.wait_for(loop.sock_sendall(sock, line), wait)
        except asyncio.TimeoutError:
            raise ClientTimeoutError("sending the request to toolsandboxd timed out") from None
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon stopped reading (a refused peer, a frame over its limit): its answer may be waiting
        except OSError as e:
            raise DaemonConnectionError("writing to toolsandboxd failed: %s" % (e.strerror or e)) from e
        left = None if deadline is None else max(0.0, deadline - loop.time())
        try:
            return await asyncio.wait_for(self._read_line(sock), left)
        except asyncio.TimeoutError:
            raise ClientTimeoutError("no answer from toolsandboxd in time") from None

    async def _read_line(self, sock: socket.socket) -> Tuple[bytes, bytes]:
        loop = asyncio.get_running_loop()
        buf = bytearray()
        scanned = 0
        while True:
            nl = buf.find(b"\n", scanned)
            if nl >= 0:
                return bytes(buf[:nl]), bytes(buf[nl + 1:])
            scanned = len(buf)
            if scanned > self.max_response_bytes:
                raise ResponseError("the daemon's answer is larger than %d bytes" % self.max_response_bytes)
            try:
                chunk = await loop.sock_recv(sock, _CHUNK)
            except OSError as e:
                raise DaemonConnectionError("reading from toolsandboxd failed: %s" % (e.strerror or e)) from e
            if not chunk:
                raise DaemonConnectionError(
                    "toolsandboxd closed the connection without answering" if not buf
                    else "toolsandboxd closed the connection in the middle of an answer")
            buf += chunk

    # --- persistent connection -----------------------------------------------

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    async def _exchange_persistent(self, line: bytes, request_id: str, wait: Optional[float],
                                   allow_retry: bool = True) -> bytes:
        reused = False
        if self._sock is not None:
            # Anything readable on an idle connection (EOF, or the daemon's
            # idle-timeout notice) means the daemon is done with it.
            try:
                self._sock.recv(1, socket.MSG_PEEK)
                self._drop()
            except BlockingIOError:
                reused = True
            except OSError:
                self._drop()
        if self._sock is None:
            self._sock = await self._connect()
        sock = self._sock
        try:
            answer, rest = await self._exchange(sock, line, wait)
        except BaseException:
            # Also on cancellation: closing the connection kills the run.
            self._drop()
            raise
        # The daemon's idle timeout fired just as the request went out: it
        # answered the connection (null id) and never read the request.
        if reused and allow_retry and P.is_idle_close(answer):
            self._drop()
            raise _Retry()
        # Keep the connection only while the daemon keeps it.
        if rest or P.response_id(answer) != request_id:
            self._drop()
        return answer

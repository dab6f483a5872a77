"""Sessions: one long-lived sandbox running one command (an MCP server over
stdio) with the connection as its stdio (PROTOCOL.md, section 6.8).

    with Client(path).open_session(["node", "/opt/mcp/server.js"], organization_id="org-1") as s:
        s.write(b'{"jsonrpc": "2.0", ...}\\n')
        kind, data = s.read()          # ("stdout", b"..."), ("stderr", ...), or None at the end
    s.record                           # the end record: ended_by, exit_code, ...

Session is the blocking one (Client.open_session), AsyncSession its asyncio
twin (AsyncClient.open_session). Closing a session's connection ends it,
with the whole process tree of its sandbox.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
from typing import Any, Dict, List, Optional, Tuple

from . import protocol as P
from .errors import DaemonConnectionError, ResponseError

__all__ = ["Session", "AsyncSession"]

_CHUNK = 1 << 16


class _Opened:
    """What the two kinds share: the answer, the frames not yet taken, the record."""

    def __init__(self, sock: socket.socket, answer: Dict[str, Any], rest: bytes):
        self._sock = sock
        self._buf = bytearray(rest)
        self.session_id: str = answer.get("session_id", "")
        self.command: List[str] = list(answer.get("command", []))
        self.policy: str = answer.get("policy", "")
        self.policy_fingerprint: str = answer.get("policy_fingerprint", "")
        # The end record (PROTOCOL.md, section 6.8) once read: ended_by,
        # end_reason, exit_code, wall_ms, bytes_in, ...
        self.record: Optional[Dict[str, Any]] = None
        self._signaller: Any = None  # the client's signal_session, for this session

    def _take(self) -> Optional[Tuple[str, bytes]]:
        f = P.take_session_frame(self._buf)
        if f is not None and f[0] == "end":
            try:
                rec = json.loads(f[1].decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                rec = None
            if not isinstance(rec, dict):
                raise ResponseError("the daemon sent an invalid session end record")
            self.record = rec
        return f

    def close_stdin(self) -> None:
        """The command's stdin ends (an MCP server then exits); reading goes on."""
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def send_signal(self, signal: str) -> Any:
        """Sends the command a signal ("TERM", "INT", "HUP", "QUIT", "USR1",
        "USR2", "WINCH") on a connection of its own; the session goes on
        until the command ends. (AsyncSession's is a coroutine.)"""
        if self._signaller is None:
            raise ValueError("this session was not opened by a client")
        return self._signaller(signal)

    def close(self) -> None:
        """Ends the session now (the daemon kills its tree) unless it ended."""
        self._sock.close()

    def _closed_early(self) -> DaemonConnectionError:
        return DaemonConnectionError("toolsandboxd closed the session without its end record (the daemon stopped?)")


class Session(_Opened):
    """A session on a blocking socket. Not thread-safe for concurrent reads;
    one thread may write while another reads (the socket stays blocking:
    a read's timeout is a select(), never the socket's own)."""

    def __init__(self, sock: socket.socket, answer: Dict[str, Any], rest: bytes):
        super().__init__(sock, answer, rest)
        sock.settimeout(None)

    def read(self, timeout: Optional[float] = None) -> Optional[Tuple[str, bytes]]:
        """The next ("stdout" | "stderr", bytes), or None once the session
        ended (`record` is then set). Raises DaemonConnectionError when the
        connection ends without a record, socket.timeout after `timeout`."""
        while True:
            f = self._take()
            if f is not None:
                if f[0] == "end":
                    return None
                return f
            if self.record is not None:
                return None
            if timeout is not None and not select.select([self._sock], [], [], timeout)[0]:
                raise socket.timeout("no output from the session within %s s" % timeout)
            try:
                chunk = self._sock.recv(_CHUNK)
            except OSError as e:
                raise DaemonConnectionError("reading the session failed: %s" % (e.strerror or e)) from e
            if not chunk:
                raise self._closed_early()
            self._buf += chunk

    def write(self, data: bytes) -> None:
        """Bytes to the command's stdin (blocks while the daemon has no room)."""
        try:
            self._sock.sendall(data)
        except OSError as e:
            raise DaemonConnectionError("writing to the session failed: %s" % (e.strerror or e)) from e

    def wait(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Reads (and drops) output until the end; the end record."""
        while self.read(timeout) is not None:
            pass
        assert self.record is not None
        return self.record

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncSession(_Opened):
    """A session on the running event loop."""

    async def read(self) -> Optional[Tuple[str, bytes]]:
        loop = asyncio.get_running_loop()
        while True:
            f = self._take()
            if f is not None:
                return None if f[0] == "end" else f
            if self.record is not None:
                return None
            try:
                chunk = await loop.sock_recv(self._sock, _CHUNK)
            except OSError as e:
                raise DaemonConnectionError("reading the session failed: %s" % (e.strerror or e)) from e
            if not chunk:
                raise self._closed_early()
            self._buf += chunk

    async def write(self, data: bytes) -> None:
        try:
            await asyncio.get_running_loop().sock_sendall(self._sock, data)
        except OSError as e:
            raise DaemonConnectionError("writing to the session failed: %s" % (e.strerror or e)) from e

    async def wait(self) -> Dict[str, Any]:
        while await self.read() is not None:
            pass
        assert self.record is not None
        return self.record

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

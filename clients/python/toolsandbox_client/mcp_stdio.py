"""letta-server's stdio MCP servers in toolsandboxd sessions.

letta-server 0.16.8 starts a stdio MCP server a user registered as a plain
child process (letta/services/mcp/stdio_client.py, AsyncStdioMCPClient,
through the MCP SDK's mcp.client.stdio.stdio_client). Here the same server
runs in a session of toolsandboxd (PROTOCOL.md, section 6.8): a sandbox of
the organization's policy, which lists the programs a session may start.

    # letta/services/mcp_manager.py (and mcp_server_manager.py), get_mcp_client:
    from toolsandbox_client.mcp_stdio import ToolSandboxStdioMCPClient
    return ToolSandboxStdioMCPClient(server_config=server_config, oauth_provider=None, agent_id=agent_id,
                                     organization_id=actor.organization_id)

sandboxed_stdio_client(server, organization_id=...) is the drop-in for
stdio_client(server): the same (read_stream, write_stream) pair of the MCP
SDK's SessionMessage streams, for any Python MCP client. session_lines() is
the part of it that needs neither the MCP SDK nor anyio: the server's
stdout as lines, its stderr to a log, escaped.

The MCP SDK (and anyio, its dependency) and Letta are imported only when
these are used; the rest of toolsandbox_client needs neither.
"""

from __future__ import annotations

import codecs
import os
import sys
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Iterable, List, Optional, TextIO

from . import protocol as P
from .aio import AsyncClient
from .errors import DaemonConnectionError
from .session import AsyncSession

__all__ = ["sandboxed_stdio_client", "session_lines", "session_command", "ToolSandboxStdioMCPClient",
           "escaped_for_log"]

# After its stdin ends, how long a server has to exit before the session is
# closed (the daemon then kills its tree), as the SDK's stdio_client waits
# before it terminates its process.
SERVER_EXIT_WAIT = 2.0
# The environment variable an organization id may come from when the caller
# gives none (one organization per letta-server).
ORGANIZATION_ENV = "TOOLSANDBOX_ORGANIZATION_ID"


def session_command(command: str, args: Iterable[str]) -> List[str]:
    """A server's command as a session takes it: the program (a name or path
    the policy's sessions.commands allows), then its arguments."""
    return [command, *args]


def escaped_for_log(data: bytes) -> str:
    """A server's stderr as text for a log: UTF-8 (invalid bytes replaced),
    every control character but newline and tab as an escape, so a server
    cannot move a terminal's cursor or forge log lines' colours."""
    out = []
    for ch in data.decode("utf-8", "replace"):
        o = ord(ch)
        if ch in "\n\t" or (0x20 <= o < 0x7F) or (o >= 0xA0 and ch.isprintable()):
            out.append(ch)
        elif o < 0x100:
            out.append("\\x%02x" % o)
        else:
            out.append("\\u%04x" % o)
    return "".join(out)


async def session_lines(session: AsyncSession, errlog: Optional[TextIO] = None,
                        encoding: str = "utf-8", errors: str = "strict") -> AsyncIterator[str]:
    """The session's stdout as lines (without their newline), as the MCP SDK's
    stdio transport splits them; its stderr goes to `errlog`, escaped. Ends
    when the session does (its record is then on `session.record`); a last
    line without a newline is dropped, as the SDK drops it."""
    buffer = ""
    decoder = codecs.getincrementaldecoder(encoding)(errors)
    while True:
        frame = await session.read()
        if frame is None:
            return
        kind, data = frame
        if kind == "stderr":
            if errlog is not None:
                errlog.write(escaped_for_log(data))
                errlog.flush()
            continue
        lines = (buffer + decoder.decode(data)).split("\n")
        buffer = lines.pop()
        for line in lines:
            yield line


def _organization(organization_id: Optional[str]) -> str:
    org = organization_id if organization_id is not None else os.environ.get(ORGANIZATION_ENV)
    if not org:
        raise ValueError("a sandboxed MCP server needs an organization id (the organization_id argument, or $%s)"
                         % ORGANIZATION_ENV)
    return org


@asynccontextmanager
async def sandboxed_stdio_client(server: Any, *, organization_id: Optional[str] = None,
                                 socket_path: str = P.DEFAULT_SOCKET_PATH, policy: Optional[str] = None,
                                 agent_id: Optional[str] = None, workspace: Optional[str] = None,
                                 errlog: TextIO = sys.stderr, client: Optional[AsyncClient] = None):
    """mcp.client.stdio.stdio_client(server), in a toolsandboxd session.

    `server` is the SDK's StdioServerParameters (command, args, env,
    encoding, encoding_error_handler are read; cwd is the sandbox's working
    directory, whatever it says). Its env is sent as the session's
    variables, which the policy's environment rules check (the daemon's own
    environment never reaches the server). A refusal raises the client's
    error (PolicyDeniedError, BusyError, ...), as the SDK raises OSError for
    a program it cannot start. `workspace`: the organization's workspace to
    run in (its /work kept between sessions, one at a time), by name."""
    import anyio
    import anyio.lowlevel
    from mcp import types
    from mcp.shared.message import SessionMessage

    encoding = getattr(server, "encoding", "utf-8") or "utf-8"
    errors = getattr(server, "encoding_error_handler", "strict") or "strict"
    c = client or AsyncClient(socket_path)
    session = await c.open_session(session_command(server.command, server.args),
                                   organization_id=_organization(organization_id), policy=policy,
                                   env=getattr(server, "env", None), agent_id=agent_id, workspace=workspace)
    read_stream_writer, read_stream = anyio.create_memory_object_stream(0)
    write_stream, write_stream_reader = anyio.create_memory_object_stream(0)
    reader_done = anyio.Event()

    async def stdout_reader() -> None:
        try:
            async with read_stream_writer:
                async for line in session_lines(session, errlog, encoding, errors):
                    try:
                        message = types.JSONRPCMessage.model_validate_json(line)
                    except Exception as exc:
                        await read_stream_writer.send(exc)
                        continue
                    await read_stream_writer.send(SessionMessage(message))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            await anyio.lowlevel.checkpoint()
        except Exception as exc:  # the connection ended without a record
            try:
                await read_stream_writer.send(exc)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass
        finally:
            reader_done.set()

    async def stdin_writer() -> None:
        try:
            async with write_stream_reader:
                async for session_message in write_stream_reader:
                    text = session_message.message.model_dump_json(by_alias=True, exclude_none=True)
                    await session.write((text + "\n").encode(encoding, errors))
        except (anyio.ClosedResourceError, DaemonConnectionError):
            # The session ended (its reader says how); what is left unsent
            # has no server to go to.
            await anyio.lowlevel.checkpoint()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(stdout_reader)
            tg.start_soon(stdin_writer)
            try:
                yield read_stream, write_stream
            finally:
                # The MCP shutdown: the server's stdin ends; it has a moment
                # to exit; then the session's connection closes, which kills
                # its sandbox.
                session.close_stdin()
                with anyio.move_on_after(SERVER_EXIT_WAIT):
                    await reader_done.wait()
                tg.cancel_scope.cancel()
    finally:
        session.close()
        for s in (read_stream, write_stream, read_stream_writer, write_stream_reader):
            await s.aclose()


def _letta_client_class() -> Any:
    from letta.services.mcp.stdio_client import AsyncStdioMCPClient
    from mcp import ClientSession, StdioServerParameters

    class _ToolSandboxStdioMCPClient(AsyncStdioMCPClient):
        """AsyncStdioMCPClient with its server in a toolsandboxd session."""

        def __init__(self, server_config: Any, oauth_provider: Any = None, agent_id: Optional[str] = None, *,
                     organization_id: Optional[str] = None, socket_path: str = P.DEFAULT_SOCKET_PATH,
                     policy: Optional[str] = None, workspace: Optional[str] = None):
            super().__init__(server_config, oauth_provider, agent_id)
            self.organization_id = organization_id
            self.socket_path = socket_path
            self.policy = policy
            self.workspace = workspace

        async def _initialize_connection(self, server_config: Any) -> None:
            # Letta splits each argument on whitespace; so does this.
            args = [part for arg in server_config.args for part in arg.split()]
            params = StdioServerParameters(command=server_config.command, args=args, env=server_config.env)
            self.stdio, self.write = await self.exit_stack.enter_async_context(
                sandboxed_stdio_client(params, organization_id=self.organization_id, socket_path=self.socket_path,
                                       policy=self.policy, agent_id=self.agent_id, workspace=self.workspace))
            self.session = await self.exit_stack.enter_async_context(ClientSession(self.stdio, self.write))

    return _ToolSandboxStdioMCPClient


def __getattr__(name: str) -> Any:
    # The Letta class is made on first use: importing this module needs
    # neither Letta nor the MCP SDK.
    if name == "ToolSandboxStdioMCPClient":
        cls = _letta_client_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)

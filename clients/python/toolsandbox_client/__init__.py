"""Client for toolsandboxd, the daemon that runs Letta tool code in Linux sandboxes.

    from toolsandbox_client import Client

    client = Client("/run/toolsandboxd/toolsandboxd.sock")
    result = client.run_tool(
        "def add(a: int, b: int) -> int:\n    return a + b\n",
        tool_name="add", args={"a": 1, "b": 2}, organization_id="org-123")
    assert result.status == "success" and result.func_return == 3

Standard library only, Python 3.9+. AsyncClient has the same methods as
coroutines; toolsandbox_client.letta adapts the daemon to letta-server.
"""

from .aio import AsyncClient
from .client import Client
from .errors import (
    ERROR_CLASSES,
    BadRequestError,
    BusyError,
    ClientTimeoutError,
    DaemonConnectionError,
    InternalError,
    PolicyDeniedError,
    ProtocolTimeoutError,
    ResponseError,
    TooLargeError,
    ToolSandboxError,
    UnauthorizedError,
    UnavailableError,
)
from .protocol import DEFAULT_SOCKET_PATH, PROTOCOL_VERSION, ToolResult
from .session import AsyncSession, Session

__version__ = "0.1.0"

__all__ = [
    "Client",
    "AsyncClient",
    "ToolResult",
    "Session",
    "AsyncSession",
    "DEFAULT_SOCKET_PATH",
    "PROTOCOL_VERSION",
    "ToolSandboxError",
    "BadRequestError",
    "TooLargeError",
    "UnauthorizedError",
    "BusyError",
    "PolicyDeniedError",
    "ProtocolTimeoutError",
    "UnavailableError",
    "InternalError",
    "DaemonConnectionError",
    "ClientTimeoutError",
    "ResponseError",
    "ERROR_CLASSES",
    "__version__",
]

"""Exceptions raised by the toolsandboxd clients.

Every error the daemon reports carries a stable code (protocol v1); each code
maps to one subclass of ToolSandboxError. Problems that happen on this side of
the socket (cannot connect, connection lost, no answer in time, an answer that
is not protocol v1) have their own subclasses with client-side codes.

Callers switch on the class or on ``.code``, never on ``.message``.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

__all__ = [
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
    "error_from_code",
]


class ToolSandboxError(Exception):
    """Base class. ``code`` is the protocol error code, ``message`` the text."""

    code = "error"

    def __init__(self, message: str, *, code: Optional[str] = None, request_id: Optional[str] = None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.request_id = request_id

    def __str__(self) -> str:
        return "%s: %s" % (self.code, self.message)

    def __repr__(self) -> str:
        return "%s(code=%r, message=%r, request_id=%r)" % (
            type(self).__name__,
            self.code,
            self.message,
            self.request_id,
        )


# --- codes the daemon sends -------------------------------------------------


class BadRequestError(ToolSandboxError):
    """Malformed JSON, wrong types, unknown fields or type, bad version."""

    code = "bad_request"


class TooLargeError(ToolSandboxError):
    """The request line is above the daemon's max_frame_bytes."""

    code = "too_large"


class UnauthorizedError(ToolSandboxError):
    """This process's uid/gid is not allowed to use the daemon."""

    code = "unauthorized"


class BusyError(ToolSandboxError):
    """Every run slot and queue place is taken: retry later."""

    code = "busy"


class PolicyDeniedError(ToolSandboxError):
    """The organization's policy does not allow this request."""

    code = "policy_denied"


class ProtocolTimeoutError(ToolSandboxError):
    """The daemon received no complete request line in time."""

    code = "timeout"


class UnavailableError(ToolSandboxError):
    """The daemon is shutting down, or the selected backend is unreachable."""

    code = "unavailable"


class InternalError(ToolSandboxError):
    """A bug or an unexpected system failure in the daemon."""

    code = "internal"


# --- client-side codes -------------------------------------------------------


class DaemonConnectionError(ToolSandboxError):
    """The socket could not be reached, or the connection was lost before an answer."""

    code = "connection"


class ClientTimeoutError(DaemonConnectionError):
    """No answer within the client's own timeout (the connection is closed,
    which makes the daemon kill the run)."""

    code = "client_timeout"


class ResponseError(ToolSandboxError):
    """The daemon's answer is not a valid protocol v1 response for this request."""

    code = "bad_response"


ERROR_CLASSES: Dict[str, Type[ToolSandboxError]] = {
    cls.code: cls
    for cls in (
        BadRequestError,
        TooLargeError,
        UnauthorizedError,
        BusyError,
        PolicyDeniedError,
        ProtocolTimeoutError,
        UnavailableError,
        InternalError,
    )
}


def error_from_code(code: str, message: str, request_id: Optional[str] = None) -> ToolSandboxError:
    """The exception for an error response. A code this client does not know
    is treated like "internal" (protocol v1, section 10): an InternalError
    whose .code is the code the daemon sent."""
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        return InternalError(message, code=code, request_id=request_id)
    return cls(message, request_id=request_id)

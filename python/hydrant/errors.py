"""hydrant's exceptions: one class per status of the protocol, and the client's own failures.

Every exception is a :class:`HydrantError`; those a server answered carry ``status`` (the
protocol's status byte) and ``message`` (the server's reason). Some are also the built-in
exception a Python caller already catches: :class:`NotFound` is a ``FileNotFoundError``,
:class:`ConnectionFailed` a ``ConnectionError``, :class:`UsageError` and
:class:`BufferTooSmall` are ``ValueError``.
"""

from typing import Dict, Optional, Type

from ._hydrant import PROTOCOL_STATUSES


class HydrantError(Exception):
    """A call to hydrant failed."""

    status: Optional[int] = None

    def __init__(self, message: str, status: Optional[int] = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        # Pickled across processes (DataLoader workers) with the arguments it was made from.
        return (_rebuild, (type(self), self.__dict__.copy(), str(self)))


class StatusError(HydrantError):
    """The server answered with a status other than OK."""

    def __init__(self, status: int, message: str):
        name = STATUS_NAMES.get(status, f"status {status:#x}")
        super().__init__(f"{name}: {message}", status)
        self.reason = message


class Retriable(StatusError):
    """A status worth retrying later (the client already retried it)."""


class NotFound(StatusError, FileNotFoundError):
    """No such object (at the node or its origin)."""


class InvalidKey(StatusError, ValueError):
    """The bucket or key is not a valid name."""


class InvalidRange(StatusError, ValueError):
    """The range is outside the object."""


class TooLarge(StatusError):
    """The request or object is larger than the server accepts."""


class Unauthenticated(StatusError, PermissionError):
    """The server wants a token (HYDRANT_TOKEN) and did not get the right one."""


class ReadOnly(StatusError, PermissionError):
    """The bucket or server does not take writes."""


class OriginRefused(StatusError, PermissionError):
    """The origin refused the request for good (permission, a name it cannot hold)."""


class PreconditionFailed(StatusError):
    """A conditional write found its key otherwise than it requires; nothing was written."""


class Unsupported(StatusError):
    """The server does not do what was asked (say, read a same-host writer's memory)."""


class ChecksumMismatch(StatusError):
    """Bytes arrived damaged; nothing was stored."""


class Busy(Retriable):
    """The server is at one of its bounds (the dirty budget, a queue): slow down."""


class OriginUnavailable(Retriable):
    """The origin is down or slow; the object is not on this node."""


class NoSpace(Retriable):
    """The node's drives are full."""


class ServerTimeout(Retriable, TimeoutError):
    """The server gave up waiting (for the origin, for a flush)."""


class ProtocolError(HydrantError):
    """The server sent bytes that are not a valid answer; the connection was closed."""


class ConnectionFailed(HydrantError, ConnectionError):
    """No connection to the server, or it broke, or no answer within the request timeout."""


class UsageError(HydrantError, ValueError):
    """Bad input, caught before anything was sent."""


class BufferTooSmall(HydrantError, ValueError):
    """``get_into``'s buffer cannot hold the answer; nothing was written to it."""

    def __init__(self, message: str, needed: int, capacity: int):
        super().__init__(message)
        self.needed = needed
        self.capacity = capacity


class CudaUnavailable(HydrantError):
    """A region could not be registered with CUDA (no runtime library, no driver, no device);
    it works as before, unpinned."""


class LocalError(HydrantError, OSError):
    """The caller's file or reader failed, or a stream broke off part-way."""


def _rebuild(kind: type, state: dict, text: str) -> "HydrantError":
    error = kind.__new__(kind, text)
    error.args = (text,)
    error.__dict__.update(state)
    return error


#: The protocol's statuses by code, as the server names them.
STATUS_NAMES: Dict[int, str] = {code: name for code, name in PROTOCOL_STATUSES}

_BY_NAME: Dict[str, Type[StatusError]] = {
    "NotFound": NotFound,
    "InvalidKey": InvalidKey,
    "InvalidRange": InvalidRange,
    "TooLarge": TooLarge,
    "Unauthenticated": Unauthenticated,
    "ReadOnly": ReadOnly,
    "OriginRefused": OriginRefused,
    "PreconditionFailed": PreconditionFailed,
    "ChecksumMismatch": ChecksumMismatch,
    "Unsupported": Unsupported,
    "Busy": Busy,
    "OriginUnavailable": OriginUnavailable,
    "NoSpace": NoSpace,
    "Timeout": ServerTimeout,
}


def status_error(status: int, message: str) -> StatusError:
    """The exception for an answer with `status` (a class of its own, or its class's)."""
    name = STATUS_NAMES.get(status)
    if name in _BY_NAME:
        return _BY_NAME[name](status, message)
    if 0x40 <= status <= 0x7F:
        return Retriable(status, message)
    return StatusError(status, message)

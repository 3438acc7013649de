"""Leash's errors as Python exceptions. Every failure of a Leash call raises a LeashError
subclass carrying Leash's status code (`code`, a StatusCode) and its message; the classes
also derive from the built-in exception a Python caller would expect (ValueError for bad
arguments, TypeError for a wrong dtype, LookupError for an unknown table, ConnectionError
for unreachable shards). Plain values; thread-safe."""
from __future__ import annotations

import enum
from typing import Optional, Union


class StatusCode(enum.IntEnum):
    """The codes of leash::Status (common/include/leash/common/status.h)."""

    OK = 0
    INVALID_ARGUMENT = 1
    NOT_FOUND = 2
    ALREADY_EXISTS = 3
    FAILED_PRECONDITION = 4
    RESOURCE_EXHAUSTED = 5
    UNAVAILABLE = 6
    INTERNAL = 7
    VERSION_MISMATCH = 8
    DATA_LOSS = 9
    ABORTED = 10
    DEADLINE_EXCEEDED = 11
    CANCELLED = 12
    IO_ERROR = 13
    NOT_REGISTERED = 14


class LeashError(Exception):
    """A Leash call failed. `code` is Leash's status code, `message` says what was wrong
    and what to do."""

    default_code = StatusCode.INTERNAL

    def __init__(self, message: str, code: Optional[Union[StatusCode, int]] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = StatusCode(code if code is not None else self.default_code)

    def __str__(self) -> str:
        return f"{_CODE_NAMES.get(self.code, self.code.name)}: {self.message}"


class InvalidArgumentError(LeashError, ValueError):
    """A bad argument: a shape, name, optimizer, staleness or key Leash cannot use."""

    default_code = StatusCode.INVALID_ARGUMENT


class WrongShapeError(InvalidArgumentError):
    """An array whose number of values (or layout: it must be C-contiguous) does not fit
    the table."""


class WrongDTypeError(InvalidArgumentError, TypeError):
    """An array that is not float32 (or keys that are not integers), or not an array."""


class UnknownTableError(LeashError, LookupError):
    """A table the shards do not know (NotFound)."""

    default_code = StatusCode.NOT_FOUND


class TableExistsError(LeashError):
    """create_table() of a name that exists with another spec (AlreadyExists)."""

    default_code = StatusCode.ALREADY_EXISTS


class FailedPreconditionError(LeashError):
    """The call does not fit the job's state (e.g. another data plan than the job's)."""

    default_code = StatusCode.FAILED_PRECONDITION


class ClientClosedError(FailedPreconditionError):
    """The client has left the job or was closed."""


class ResourceExhaustedError(LeashError):
    """A request larger than a shard accepts, or a shard out of room."""

    default_code = StatusCode.RESOURCE_EXHAUSTED


class UnavailableError(LeashError, ConnectionError):
    """A shard cannot be reached (not running, wrong address, refused CURVE key)."""

    default_code = StatusCode.UNAVAILABLE


class VersionMismatchError(LeashError):
    """A shard speaks another protocol version."""

    default_code = StatusCode.VERSION_MISMATCH


class DeadlineExceededError(LeashError, TimeoutError):
    """Something did not happen in time."""

    default_code = StatusCode.DEADLINE_EXCEEDED


class CancelledError(LeashError):
    """The request was cancelled (the client shut down)."""

    default_code = StatusCode.CANCELLED


class NotRegisteredError(LeashError):
    """A shard no longer knows this worker (it was evicted, or the shard restarted);
    Client.rejoin() registers it again."""

    default_code = StatusCode.NOT_REGISTERED


_CODE_NAMES = {
    StatusCode.OK: "OK",
    StatusCode.INVALID_ARGUMENT: "InvalidArgument",
    StatusCode.NOT_FOUND: "NotFound",
    StatusCode.ALREADY_EXISTS: "AlreadyExists",
    StatusCode.FAILED_PRECONDITION: "FailedPrecondition",
    StatusCode.RESOURCE_EXHAUSTED: "ResourceExhausted",
    StatusCode.UNAVAILABLE: "Unavailable",
    StatusCode.INTERNAL: "Internal",
    StatusCode.VERSION_MISMATCH: "VersionMismatch",
    StatusCode.DATA_LOSS: "DataLoss",
    StatusCode.ABORTED: "Aborted",
    StatusCode.DEADLINE_EXCEEDED: "DeadlineExceeded",
    StatusCode.CANCELLED: "Cancelled",
    StatusCode.IO_ERROR: "IOError",
    StatusCode.NOT_REGISTERED: "NotRegistered",
}

_BY_CODE = {
    StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    StatusCode.NOT_FOUND: UnknownTableError,
    StatusCode.ALREADY_EXISTS: TableExistsError,
    StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    StatusCode.UNAVAILABLE: UnavailableError,
    StatusCode.VERSION_MISMATCH: VersionMismatchError,
    StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    StatusCode.CANCELLED: CancelledError,
    StatusCode.NOT_REGISTERED: NotRegisteredError,
}


def _class_for(code: int) -> type:
    """The exception class for a leash::Status code (the extension raises through this)."""
    try:
        return _BY_CODE.get(StatusCode(code), LeashError)
    except ValueError:
        return LeashError

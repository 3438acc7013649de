"""Leash for Python: train any model against a Leash cluster.

    import leash
    with leash.Client(["tcp://127.0.0.1:7000"], staleness=1) as client:
        w = client.create_table("w", (784, 10), optimizer="adam", lr=1e-3)
        values = client.pull(w)          # numpy float32, shape (784, 10)
        client.push(w, grad)             # float32 array or CPU/CUDA torch tensor
        client.clock()

Replicated shards are found (and followed across failovers) in etcd instead:
leash.Client(etcd="http://127.0.0.1:2379", job="NAME", staleness=1).
leash.torch wraps a torch.nn.Module (see docs/python.md). Errors are leash.LeashError
subclasses carrying Leash's status code. Logging: LEASH_LOG_LEVEL (default warn).
"""
import os as _os

from . import _leash
from .client import (INITIALIZERS, OPTIMIZERS, WIRE_DTYPES, Chunk, Client, DataPlan,
                     PendingPull, Table)
from .errors import (CancelledError, ClientClosedError, DeadlineExceededError,
                     FailedPreconditionError, InvalidArgumentError, LeashError,
                     NotRegisteredError, ResourceExhaustedError, StatusCode, TableExistsError,
                     UnavailableError, UnknownTableError, VersionMismatchError, WrongDTypeError,
                     WrongShapeError)

__all__ = [
    "Client", "Table", "DataPlan", "Chunk", "PendingPull", "OPTIMIZERS", "INITIALIZERS",
    "WIRE_DTYPES", "StatusCode", "LeashError", "InvalidArgumentError", "WrongShapeError",
    "WrongDTypeError", "UnknownTableError", "TableExistsError", "FailedPreconditionError",
    "ClientClosedError", "ResourceExhaustedError", "UnavailableError", "VersionMismatchError",
    "DeadlineExceededError", "CancelledError", "NotRegisteredError", "set_log_level",
]
__version__ = "0.1.0"

_leash.init_logging(_os.environ.get("LEASH_LOG_LEVEL", "warn"))


def set_log_level(level: str) -> None:
    """Level of Leash's own log lines on stderr: trace, debug, info, warn, error or off."""
    _leash.set_log_level(level)

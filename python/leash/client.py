"""leash.Client: a worker's connection to a Leash cluster (tables, pull, push, clock,
data-chunk leases), over the C++ leash::Client in leash._leash. Meant to be driven by one
training thread; other threads may call it too (the GIL guards the binding's state, and
every wait releases the GIL). Not fork-safe: make the Client in the process that uses it."""
from __future__ import annotations

import atexit
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import _leash
from .errors import (InvalidArgumentError, NotRegisteredError,
                     UnknownTableError, WrongDTypeError)

_log = logging.getLogger("leash")

Table = _leash.Table
DataPlan = _leash.DataPlan
PendingPull = _leash.PullBatch

OPTIMIZERS = ("sgd", "momentum", "adam", "adagrad", "ftrl")
INITIALIZERS = ("zeros", "uniform", "normal", "constant")
WIRE_DTYPES = ("fp32", "fp16", "bf16")

Servers = Union[str, Sequence[str]]
Shape = Union[int, Sequence[int]]


@dataclass(frozen=True)
class Chunk:
    """A chunk of the job's training set leased to this worker: samples [begin, end) of
    epoch `epoch`. It is reported trained when the loop asks for the next one."""

    epoch: int
    index: int
    begin: int
    end: int
    epochs_done: int
    chunks_done: int
    num_chunks: int

    def indices(self) -> range:
        return range(self.begin, self.end)

    def __len__(self) -> int:
        return self.end - self.begin


def _bad(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message)


def _check_int(name: str, value: Any, minimum: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise _bad(f"{name} must be an integer, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise _bad(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_stripes(value: Any) -> int:
    n = _check_int("stripes", value, 1)
    if n > 16:
        raise _bad(f"stripes must be 1 to 16 connections per shard, got {n}")
    return n


def _check_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise _bad(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(float(value)):
        raise _bad(f"{name} must be finite, got {value}")
    return float(value)


def _check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value.lower() not in choices:
        raise _bad(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value.lower()


def _shape_tuple(shape: Shape) -> tuple:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    if not isinstance(shape, (tuple, list)) or not shape:
        raise _bad(f"shape must be an int or a non-empty sequence of ints, got {shape!r}")
    out = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d <= 0:
            raise _bad(f"every dimension of a shape must be an int > 0, got {tuple(shape)!r}")
        out.append(int(d))
    return tuple(out)


def _torch():
    return sys.modules.get("torch")


def _is_tensor(x: Any) -> bool:
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def _cpu_view(x: Any, what: str) -> Any:
    """A numpy view of a CPU torch tensor (no copy); anything else as it is."""
    if not _is_tensor(x):
        return x
    if x.device.type != "cpu":
        raise AssertionError("a device tensor reached _cpu_view")
    try:
        return x.detach().numpy()
    except (TypeError, RuntimeError) as e:
        raise WrongDTypeError(f"{what} must be a float32 tensor, got {x.dtype}: {e}") from None


DEFAULT_JOB = "leash"  # leash-server's and leash-worker's default --job


def _endpoints(servers: Optional[Servers], etcd: Optional[Servers],
               job: Optional[str]) -> "tuple[List[str], List[str], Optional[str]]":
    """(servers, etcd URLs, job): exactly one of the lists is non-empty. Arguments win over
    the environment (LEASH_SERVERS, or LEASH_ETCD and LEASH_JOB)."""
    if servers is not None and etcd is not None:
        raise _bad("servers and etcd are exclusive: servers names unreplicated shards, etcd "
                   "finds replicated ones (and follows their failovers); give one")
    if servers is None and etcd is None:
        env_servers = os.environ.get("LEASH_SERVERS", "")
        env_etcd = os.environ.get("LEASH_ETCD", "")
        if env_servers and env_etcd:
            raise _bad("LEASH_SERVERS and LEASH_ETCD are both set; they are exclusive: unset "
                       "one, or pass servers= or etcd=")
        if not env_servers and not env_etcd:
            raise _bad("no shards given: pass servers=[...] (or set LEASH_SERVERS) for "
                       "unreplicated shards, or etcd=URL and job=NAME (or set LEASH_ETCD and "
                       "LEASH_JOB) for replicated ones")
        servers = env_servers or None
        etcd = env_etcd or None
    if etcd is None:
        if job is not None:
            raise _bad(f"job={job!r} names a job in etcd; it needs etcd=URL (with servers= "
                       "the shards are given directly)")
        return _normalize_servers(servers), [], None
    if job is None:
        job = os.environ.get("LEASH_JOB", "") or DEFAULT_JOB
    if not isinstance(job, str) or not job:
        raise _bad(f"job must be a non-empty string (the replicas' --job), got {job!r}")
    return [], _normalize_urls(etcd), job


def _endpoint_list(value: Servers, what: str, empty: str) -> List[str]:
    """A list of strings from a list or a comma-separated string; `what` names the
    argument and its accepted forms in the type error, `empty` is the error when none."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise _bad(f"{what}, got {value!r}")
    if not value:
        raise _bad(empty)
    return list(value)


def _normalize_urls(etcd: Servers) -> List[str]:
    return _endpoint_list(etcd, "etcd must be a URL, a list of URLs or a comma-separated string",
                          "etcd is empty: give etcd's client URL, e.g. 'http://127.0.0.1:2379'")


def _normalize_servers(servers: Servers) -> List[str]:
    return _endpoint_list(servers,
                          "servers must be a list of endpoints or a comma-separated string",
                          "servers is empty: give the shards' endpoints in order")


# Clients still open at interpreter exit leave the job then; SIGTERM raises SystemExit so
# that `with` blocks and atexit run (the shards drop the worker at once, not after its lease).
_open_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()
_sigterm_installed = False


def _leave_all_at_exit() -> None:
    for c in list(_open_clients):
        if c._pid != os.getpid():
            continue  # a forked child (a data loader's worker) must not leave for its parent
        try:
            c.leave()
        except Exception:  # noqa: BLE001 (exiting: nothing left to report to)
            pass


atexit.register(_leave_all_at_exit)


def _on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _install_sigterm_handler() -> None:
    global _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _on_sigterm)
        _sigterm_installed = True


class Client:
    """A worker of a Leash job.

    Args:
        servers: the shards' endpoints in shard order, as a list or a comma-separated
            string ("tcp://10.0.0.1:7000,tcp://10.0.0.2:7000"), for unreplicated shards.
        etcd: instead of servers, for replicated shards (leash-server --replicas R --etcd):
            etcd's client URL(s), a list or a comma-separated string
            ("http://127.0.0.1:2379"). The client waits up to connect_timeout until every
            shard of `job` has a primary, connects to the primaries, and follows failovers
            by watching etcd: requests not yet answered go again to the new primary
            (exactly once), without an error reaching the caller.
        job: with etcd, the job's name in etcd (the replicas' --job); None reads LEASH_JOB,
            else "leash".
        With neither servers nor etcd, LEASH_SERVERS or LEASH_ETCD (with LEASH_JOB) is read.
        name: this worker's name in logs and status (default: py-HOST-PID).
        staleness: the bound s: a pull for iteration c waits until every worker has
            finished iteration c - s - 1. 0 is synchronous; >= 1 lets pulls overlap steps.
        curve_keys: a keys directory (leashctl keygen) to talk CURVE-encrypted to the
            shards, using the pair `curve_client` from it.
        wire_dtype: "fp32", "fp16" or "bf16": the encoding of pushes and pull replies.
        connect_timeout: seconds to wait for every shard to answer.
        shared_memory: exchange every message with shards on this host through /dev/shm.
        shm_ring_mb: the most each shared-memory ring to a shard on this host grows to, in
            MiB (1 to 4096); it reserves /dev/shm only as the requests in flight need it
            (a memory-backed /dev/shm counts toward a container's memory). Frames that find
            no room go through the socket.
        stripes: connections per shard (1 to 16), each with a ZeroMQ I/O thread of its own;
            pushes and pulls of 1 MiB and more are split over them and put back together in
            order (leash-worker --stripes; give the shards --io-threads as many).
        register: False for an observer that only reads stats (it never trains).
        handle_sigterm: install a SIGTERM handler raising SystemExit (so the worker leaves
            the job) when the process has none.

    Use it as a context manager: leaving the block (normally, by an exception, Ctrl-C or
    SIGTERM) leaves the job, so the other workers do not wait for this one's lease to
    expire. Raises UnavailableError if a shard does not answer in time, or (with etcd) if
    etcd cannot be reached or some shard has no primary within connect_timeout (the
    message names `leashctl --etcd URL --job NAME status` to see why), and
    InvalidArgumentError if both servers and etcd are given, or neither.
    """

    def __init__(self, servers: Optional[Servers] = None, name: Optional[str] = None,
                 staleness: int = 0, curve_keys: Optional[str] = None, *,
                 etcd: Optional[Servers] = None, job: Optional[str] = None,
                 curve_client: str = "client", wire_dtype: str = "fp32",
                 connect_timeout: float = 30.0, shared_memory: bool = True, stripes: int = 1,
                 shm_ring_mb: int = 64, register: bool = True, worker_id: int = 0,
                 heartbeat_ms: int = 0,
                 handle_sigterm: bool = True) -> None:
        endpoints, etcd_urls, job = _endpoints(servers, etcd, job)
        if name is None:
            name = f"py-{socket.gethostname()}-{os.getpid()}"
        if not isinstance(name, str):
            raise _bad(f"name must be a string, got {type(name).__name__}")
        staleness = _check_int("staleness", staleness, 0)
        wire = _check_choice("wire_dtype", wire_dtype, WIRE_DTYPES)
        timeout_ms = int(_check_float("connect_timeout", connect_timeout) * 1000)
        if timeout_ms <= 0:
            raise _bad("connect_timeout must be > 0 seconds")
        if curve_keys is not None and not isinstance(curve_keys, (str, os.PathLike)):
            raise _bad("curve_keys must be a directory path")
        self._rejoins = 0
        self._pid = os.getpid()
        self._staging: Dict[str, Any] = {}  # pinned host buffers for CUDA tensors, per table
        self._c = _leash.Client(
            servers=endpoints, etcd=etcd_urls, job=job or "", name=name, staleness=staleness,
            wire_dtype=wire, connect_timeout_ms=timeout_ms,
            curve_keys=os.fspath(curve_keys) if curve_keys is not None else None,
            curve_client=curve_client, shared_memory=bool(shared_memory),
            shm_ring_mb=_check_int("shm_ring_mb", shm_ring_mb, 1), stripes=_check_stripes(stripes),
            register_worker=bool(register),
            worker_id=_check_int("worker_id", worker_id, 0),
            heartbeat_ms=_check_int("heartbeat_ms", heartbeat_ms, 0))
        self.name = name
        # Static shards' endpoints; None with etcd (the primaries change on a failover).
        self.servers: Optional[List[str]] = endpoints or None
        self.etcd: Optional[List[str]] = etcd_urls or None
        self.job = job
        self._num_shards = self._c.num_shards
        self.wire_dtype = wire
        if register:
            _open_clients.add(self)
            if handle_sigterm:
                _install_sigterm_handler()

    # ---- lifetime ----------------------------------------------------------------------

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # Leaving at the end of the block must not turn a finished job (or the exception on
        # its way out) into another error: a shard that does not acknowledge evicts this
        # worker when its lease expires anyway.
        try:
            self.leave()
        except Exception as e:  # noqa: BLE001
            _log.warning("leaving the job failed (%s); the shards will evict this worker", e)
            self._c.close()

    def leave(self) -> None:
        """Sends what is held, leaves the job (every shard drops this worker at once) and
        closes the connections. Idempotent. UnavailableError if a shard did not
        acknowledge within 5 s (it evicts the worker when its lease expires)."""
        _open_clients.discard(self)
        self._c.leave()

    def close(self) -> None:
        """Closes the connections without leaving: the shards evict this worker when its
        lease expires. leave() is what a finishing worker wants."""
        _open_clients.discard(self)
        self._c.close()

    @property
    def closed(self) -> bool:
        return self._c.closed

    # ---- tables ------------------------------------------------------------------------

    def create_table(self, name: str, shape: Optional[Shape] = None, optimizer: str = "sgd",
                     lr: float = 0.01, *, momentum: float = 0.9, beta1: float = 0.9,
                     beta2: float = 0.999, epsilon: float = 1e-8, weight_decay: float = 0.0,
                     init: str = "zeros", init_scale: float = 0.0, seed: int = 0,
                     sparse: bool = False, dim: Optional[int] = None, l1: float = 0.0,
                     ftrl_beta: float = 1.0, clip_value: float = 0.0, admit_after: int = 0,
                     expire_after_clocks: int = 0) -> Table:
        """Creates table `name` on every shard, or finds it if it exists with the same spec.

        A dense table of `shape` holds shape[0] rows of prod(shape[1:]) float32 values,
        split over the shards by rows; pulls return arrays of `shape`. A sparse table
        (sparse=True) holds rows of `dim` values under any 64-bit keys (hashed feature
        ids), each created on its first pull and kept on the shard a hash of its key names;
        use pull_sparse / push_sparse. admit_after: a key gets a row only after that many
        pulls (until then it reads as the initializer); expire_after_clocks: a row unseen
        for that many clocks is dropped.

        The shards apply pushed gradients with `optimizer` ("sgd", "momentum", "adam",
        "adagrad", or "ftrl" for sparse tables) at rate `lr` (momentum for "momentum";
        beta1, beta2, epsilon for "adam"; epsilon for "adagrad"; l1 and ftrl_beta for
        "ftrl"; weight_decay for all; clip_value > 0 clips every updated value). Values
        start as `init`: "zeros", "uniform" in [-init_scale, init_scale], "normal" with
        stddev init_scale, or "constant" init_scale, seeded by `seed` (the same row gets
        the same value on any shard).

        Raises InvalidArgumentError for a bad argument, TableExistsError if the name
        exists with another spec.
        """
        if not isinstance(name, str) or not name:
            raise _bad("a table needs a non-empty string name")
        if sparse:
            if dim is None and shape is not None:
                dims = _shape_tuple(shape)
                if len(dims) != 1:
                    raise _bad(f"sparse table '{name}' takes dim=, the width of a row; "
                               f"got shape {dims}")
                dim = dims[0]
            dims = (_check_int("dim", dim, 1),)
        else:
            if dim is not None:
                raise _bad("dim= is for sparse tables (sparse=True); a dense table takes shape=")
            if shape is None:
                raise _bad(f"dense table '{name}' needs a shape, e.g. (rows, cols)")
            dims = _shape_tuple(shape)
        return self._c.create_table(
            name=name, shape=list(dims),
            optimizer=_check_choice("optimizer", optimizer, OPTIMIZERS),
            lr=_check_float("lr", lr), momentum=_check_float("momentum", momentum),
            beta1=_check_float("beta1", beta1), beta2=_check_float("beta2", beta2),
            epsilon=_check_float("epsilon", epsilon),
            weight_decay=_check_float("weight_decay", weight_decay),
            init=_check_choice("init", init, INITIALIZERS),
            init_scale=_check_float("init_scale", init_scale), seed=_check_int("seed", seed, 0),
            sparse=bool(sparse), l1=_check_float("l1", l1),
            ftrl_beta=_check_float("ftrl_beta", ftrl_beta),
            clip_value=_check_float("clip_value", clip_value),
            admit_after=_check_int("admit_after", admit_after, 0),
            expire_after_clocks=_check_int("expire_after_clocks", expire_after_clocks, 0))

    def open_table(self, name: str, shape: Optional[Shape] = None, timeout: float = 0.0) -> Table:
        """The table `name` that another worker created, as the shards hold it (shape
        `shape`, or (rows, cols)). With timeout > 0, waits that many seconds for it to
        appear. UnknownTableError if it does not exist; WrongShapeError if `shape` holds
        another number of values."""
        if not isinstance(name, str) or not name:
            raise _bad("open_table needs a table name")
        dims = list(_shape_tuple(shape)) if shape is not None else None
        deadline = time.monotonic() + _check_float("timeout", timeout)
        while True:
            try:
                return self._c.open_table(name=name, shape=dims)
            except UnknownTableError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    # ---- pull / push / clock -----------------------------------------------------------

    def pull(self, table: Table, out: Any = None) -> Any:
        """The table's values, as the staleness bound allows for this worker's clock.

        Without `out`, returns a float32 numpy array of the table's shape that is the pull's
        own: the reply itself where one shard holds the table (no copy). With `out`
        (a C-contiguous float32 numpy array or torch tensor of the table's size), the
        values are written straight into it, and `out` is returned; a CUDA tensor is
        filled through a pinned host buffer. Waits with the GIL released; Ctrl-C raises
        KeyboardInterrupt. Raises WrongShapeError / WrongDTypeError for a bad `out`,
        UnknownTableError for a table the shards do not know.
        """
        if out is None:
            return self._c.pull(table, None)
        if _is_tensor(out) and out.device.type != "cpu":
            staging = self._staging_for(table, out)
            self._c.pull(table, staging.numpy())
            out.copy_(staging.view(out.shape))
            return out
        self._c.pull(table, _cpu_view(out, "out"))
        return out

    def pull_all(self, tables: Sequence[Table], outs: Optional[Sequence[Any]] = None) -> List[Any]:
        """Pulls several tables at once (one message per shard); returns their arrays."""
        return self.start_pulls(tables, outs).wait()

    def start_pulls(self, tables: Sequence[Table], outs: Optional[Sequence[Any]] = None,
                    for_clock: Optional[int] = None) -> PendingPull:
        """Starts pulling `tables` (into `outs`: CPU arrays or tensors, or None for
        arrays of the pull's own: the replies themselves where a table lies on one shard, no
        copy) for iteration `for_clock` (default: this worker's clock) and returns at
        once; .wait() returns the arrays (numpy views of tensors given), .ready() says if
        they came. Pulling for clock() + 1 during a step prefetches the next step's
        values when staleness >= 1. The arrays must stay untouched until then."""
        tables = list(tables)
        if outs is None:
            views: List[Any] = [None] * len(tables)
        else:
            views = [_cpu_view(o, "out") for o in outs]
        clock = -1 if for_clock is None else _check_int("for_clock", for_clock, 0)
        return self._c.start_pulls(tables, views, clock)

    def push(self, table: Table, grad: Any, wait: bool = False) -> None:
        """Sends a gradient of the whole table (a float32 numpy array or torch tensor of
        its size; a CUDA tensor goes through a pinned host buffer). It is copied before
        this returns, so `grad` may change right after. The iteration's pushes travel with
        its clock(); errors of a push are raised by a later clock() or wait(), or here with
        wait=True."""
        if _is_tensor(grad) and grad.device.type != "cpu":
            staging = self._staging_for(table, grad)
            staging.view(grad.shape).copy_(grad)
            grad = staging
        self._c.push(table, _cpu_view(grad, "grad"), bool(wait))

    def clock(self) -> int:
        """Ends this worker's iteration (its pushes first) and returns the new clock.
        Raises the first error of the previous iteration's pushes."""
        return self._c.clock()

    def wait(self) -> None:
        """Sends what is held and waits until every push and clock so far is acknowledged;
        raises the first error among them."""
        self._c.wait()

    def pull_rows(self, table: Table, keys: Any, out: Any = None) -> np.ndarray:
        """Rows `keys` of a table (any integer array), as a (len(keys), cols) array."""
        return self._c.pull_rows(table, keys, _cpu_view(out, "out"))

    def push_rows(self, table: Table, keys: Any, grads: Any, wait: bool = False) -> None:
        """Gradients of rows `keys` (a (len(keys), cols) float32 array)."""
        self._c.push_rows(table, keys, _cpu_view(grads, "grads"), bool(wait))

    def pull_sparse(self, table: Table, keys: Any, out: Any = None,
                    for_clock: Optional[int] = None) -> Any:
        """Rows `keys` of a sparse table (any integers; int64 keys are taken as their 64
        bits) as a (len(keys), dim) float32 array, or written into `out`; a row is created
        by the table's initializer on its first pull. Under the staleness bound like
        pull(); for_clock = current_clock + 1 prefetches the next step's rows."""
        clock = -1 if for_clock is None else _check_int("for_clock", for_clock, 0)
        view = _cpu_view(out, "out")
        got = self._c.pull_sparse(table, _cpu_view(keys, "keys"), view, clock)
        return out if out is not None else got

    def push_sparse(self, table: Table, keys: Any, grads: Any, wait: bool = False) -> None:
        """Gradient rows for `keys` of a sparse table ((len(keys), dim) float32; rows of
        a key named twice are summed). Held and sent like push()."""
        if _is_tensor(grads) and grads.device.type != "cpu":
            grads = grads.detach().to("cpu")
        self._c.push_sparse(table, _cpu_view(keys, "keys"), _cpu_view(grads, "grads"),
                            bool(wait))

    @property
    def current_clock(self) -> int:
        """This worker's clock: the iteration it is computing."""
        return self._c.current_clock

    @property
    def staleness(self) -> int:
        return self._c.staleness

    @property
    def worker_id(self) -> int:
        return self._c.worker_id

    @property
    def num_shards(self) -> int:
        return self._c.num_shards

    # ---- data chunks -------------------------------------------------------------------

    def chunks(self, plan: Union[DataPlan, Mapping[str, int]],
               on_idle: Optional[Callable[[], Any]] = None,
               idle_sleep: float = 0.05) -> Iterator[Chunk]:
        """Leases the job's data chunk by chunk from shard 0: every chunk of every epoch
        is trained by exactly one live worker, and a chunk leased to a worker that dies
        goes to another. Each chunk is reported trained when the loop asks for the next.
        While the rest of an epoch is leased to others, `on_idle` runs (default: clock(),
        so that a tight staleness bound never makes the others wait for this worker).
        Every worker of a job must use the same plan (FailedPreconditionError otherwise).

        plan: a DataPlan or a mapping with num_samples, chunk_size, epochs, seed.
        """
        if isinstance(plan, Mapping):
            plan = DataPlan(**plan)
        if not isinstance(plan, DataPlan):
            raise _bad("plan must be a leash.DataPlan or a mapping of its fields")
        done = None
        while True:
            if self._c.needs_rejoin:
                self.rejoin()
                done = None
            try:
                g = self._c.next_chunk(plan, done)
            except NotRegisteredError:
                self.rejoin()  # the chunk just trained goes back to the queue
                done = None
                continue
            done = None
            if g["kind"] == "finished":
                return
            if g["kind"] == "wait":
                try:
                    (on_idle or self.clock)()
                except NotRegisteredError:
                    self.rejoin()
                time.sleep(idle_sleep)
                continue
            yield Chunk(epoch=g["epoch"], index=g["chunk"], begin=g["begin"], end=g["end"],
                        epochs_done=g["epochs_done"], chunks_done=g["chunks_done"],
                        num_chunks=g["num_chunks"])
            done = _leash.ChunkDone(g["epoch"], g["chunk"])

    # ---- membership and status ---------------------------------------------------------

    @property
    def needs_rejoin(self) -> bool:
        """True once a shard has said it does not know this worker (it was evicted)."""
        return self._c.needs_rejoin

    @property
    def rejoins(self) -> int:
        """How many times this client has rejoined (leash.torch drops prefetches then)."""
        return self._rejoins

    def rejoin(self) -> None:
        """Drops this worker's requests in flight and registers again under a new
        incarnation, at the shards' minimum clock."""
        self._rejoins += 1
        self._c.rejoin()

    def stats(self) -> List[Dict[str, Any]]:
        """Every shard's statistics (as `leashctl status` shows them), one dict per shard."""
        return self._c.stats()

    def status(self) -> Dict[str, Any]:
        """The job's status: its minimum clock, the workers (from shard 0), the tables, the
        data coverage and per-shard counters."""
        shards = self._c.stats()
        return {
            "min_clock": min(s["min_clock"] for s in shards),
            "workers": shards[0]["workers"],
            "tables": [{"name": t["name"], "rows": t["rows"], "cols": t["cols"]}
                       for t in shards[0]["tables"]],
            "coverage": shards[0]["coverage"],
            "shards": shards,
        }

    def checkpoint(self) -> List[int]:
        """Makes every shard write a snapshot now; returns the clock each one holds."""
        return self._c.checkpoint()

    def counters(self) -> Dict[str, int]:
        """The C++ client's traffic counters."""
        return self._c.counters()

    def binding_times(self) -> Dict[str, int]:
        """Time spent in the binding (ns): total, waiting with the GIL released, taking
        the GIL back, inside the C++ client's calls, inside push_tensor (leash.torch's
        gradient hooks), and the sender thread's time encoding and sending handed-over
        gradients (off the calling thread); call counts, pushes_handed_over,
        tensors_held (handed-over arrays the binding still keeps alive), values_pulled and
        values_pulled_in_place (of those, returned in the reply's own memory)."""
        return self._c.binding_times()

    def reset_binding_times(self) -> None:
        self._c.reset_binding_times()

    # ---- internals ---------------------------------------------------------------------

    def _staging_for(self, table: Table, tensor: Any) -> Any:
        torch = _torch()
        buf = self._staging.get(table.name)
        if buf is None or buf.numel() != tensor.numel():
            buf = torch.empty(tensor.numel(), dtype=torch.float32, pin_memory=True)
            self._staging[table.name] = buf
        if tensor.dtype != torch.float32:
            raise WrongDTypeError(
                f"tensor for table '{table.name}' must be float32, got {tensor.dtype}")
        return buf

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"clock {self.current_clock}"
        where = f", job '{self.job}' in etcd" if self.etcd else ""
        return f"<leash.Client '{self.name}' {self._num_shards} shard(s){where}, {state}>"


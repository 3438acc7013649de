"""leash.torch: a torch.nn.Module's parameters trained on a Leash cluster. Parameters
registers every trainable parameter as a table (the optimizer runs on the shards), pulls
the values into the module before a step and pushes the gradients after backward(); under
a staleness bound >= 1 the next step's pull is in flight while this step computes, as in
leash-worker. One training thread per Parameters; not thread-safe.

    model = Net()                                        # on its device already
    with leash.Client(servers, staleness=1) as client:
        params = leash.torch.Parameters(client, model, optimizer="adam", lr=1e-3)
        for chunk in params.chunks(plan):                # this worker's share of the data
            for x, y in batches(chunk):
                params.pull()                            # values into model (prefetched)
                F.cross_entropy(model(x), y).backward()
                params.push()                            # gradients out, clock
"""
from __future__ import annotations

import ctypes
import math
import os
import warnings
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import torch

from . import _leash
from .client import Chunk, Client, DataPlan, Table
from .errors import InvalidArgumentError, NotRegisteredError, WrongDTypeError


def openblas_fallback() -> Optional[Tuple[str, str]]:
    """(kernels, better) when an OpenBLAS loaded in this process (Debian's PyTorch and numpy
    compute through it) took its pre-AVX kernels on a CPU with AVX or more, as Debian
    bookworm's OpenBLAS 0.3.21 does on CPUs newer than itself: CPU training then runs ~2.5x
    slower. `better` is the OPENBLAS_CORETYPE to start Python with. None otherwise, and when
    OPENBLAS_CORETYPE is set (the user's choice)."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return None
    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split()[-1] for ln in f if "openblas" in ln and ln.split()[-1].startswith("/")}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            name = ctypes.CDLL(path).openblas_get_corename
        except (OSError, AttributeError):
            continue
        name.restype = ctypes.c_char_p
        core = (name() or b"").decode(errors="replace")
        better = _leash.better_openblas_core(core)
        if better:
            return core, better
    return None


_fallback = openblas_fallback()
if _fallback:
    warnings.warn(f"OpenBLAS, which this PyTorch computes through on the CPU, did not know this CPU and took its "
                  f"{_fallback[0]} kernels (no AVX): CPU training runs about 2.5x slower. Start Python with "
                  f"OPENBLAS_CORETYPE={_fallback[1]} in the environment (docs/running.md)", RuntimeWarning,
                  stacklevel=2)

InitFn = Callable[[str, torch.nn.Parameter], Tuple[str, float]]


def he_init(name: str, param: torch.nn.Parameter) -> Tuple[str, float]:
    """The default server-side initializer: He-normal (stddev sqrt(2 / fan_in)) for
    weights (2 or more dimensions), zeros for biases and other vectors."""
    if param.dim() >= 2:
        fan_in = param[0].numel()
        return "normal", math.sqrt(2.0 / fan_in)
    return "zeros", 0.0


def table_shape(param: torch.Tensor) -> Tuple[int, int]:
    """How a parameter is stored: its first dimension as rows (split over the shards) and
    the rest as columns; a vector is one row, so a bias lives on one shard."""
    if param.dim() <= 1:
        return (1, max(1, param.numel()))
    return (param.shape[0], param[0].numel())


class SparseEmbedding(torch.nn.Module):
    """An embedding lookup backed by a sparse Leash table: forward(ids) pulls the
    rows of the batch's distinct ids (any 64-bit ids, e.g. hashed features; a row is made
    by the shards' initializer on its first pull) and returns them gathered to
    ids.shape + (dim,); push() (called by Parameters.push(), or by hand) sends the
    gradient rows of what forward pulled since the last push. The table's optimizer runs
    on the shards ("adagrad", "adam" (lazy), "ftrl", ...). Rows are pulled synchronously in
    forward, not prefetched; the gradient rows go to the client's sender thread behind the
    dense gradients, without waiting for those. Extra keyword arguments go to
    Client.create_table."""

    def __init__(self, client: Client, name: str, dim: int, optimizer: str = "adagrad",
                 lr: float = 0.01, *, init: str = "normal", init_scale: float = 0.01,
                 seed: int = 0, **table_kw: Any) -> None:
        super().__init__()
        if not isinstance(client, Client):
            raise InvalidArgumentError("client must be a leash.Client")
        self.client = client
        self.table = client.create_table(name, sparse=True, dim=dim, optimizer=optimizer, lr=lr,
                                         init=init, init_scale=init_scale, seed=seed,
                                         **table_kw)
        self.dim = self.table.dim
        self._looked_up: List[Tuple[Any, torch.Tensor]] = []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dtype not in (torch.int64, torch.int32):
            raise WrongDTypeError(f"SparseEmbedding ids must be int64 or int32, got {ids.dtype}")
        flat = ids.reshape(-1).to("cpu", torch.int64)
        unique, inverse = torch.unique(flat, return_inverse=True)
        keys = unique.numpy()
        rows = torch.from_numpy(self.client.pull_sparse(self.table, keys)).to(ids.device)
        if torch.is_grad_enabled() and self.training:
            rows.requires_grad_(True)
            self._looked_up.append((keys, rows))
        return rows[inverse.to(ids.device)].reshape(*ids.shape, self.dim)

    def push(self, scale: float = 1.0) -> None:
        """Sends the gradient rows of the ids looked up since the last push (times
        `scale`); rows of an id seen in several lookups are summed by the client."""
        for keys, rows in self._looked_up:
            if rows.grad is None:
                continue
            g = rows.grad.detach().to("cpu")
            if scale != 1.0:
                g = g * scale
            # Handed over (nothing writes these rows any more): queued behind the dense
            # gradients the sender holds instead of waiting for them.
            self.client._c.push_sparse_tensor(self.table, keys, g.contiguous().numpy())
        self._looked_up.clear()


# Parameters pulled in place (Parameters' pull_in_place) from this size on; smaller ones are
# copied into buffers, cheaper than making an array and a tensor of each reply.
_IN_PLACE_MIN_BYTES = 64 << 10


class Parameters:
    """The trainable parameters of `module` as Leash tables.

    Args:
        client: a registered leash.Client; its staleness bound decides prefetching.
        module: the model, already on its device (CPU, or CUDA through pinned buffers).
        optimizer, lr, momentum, beta1, beta2, epsilon, weight_decay: the server-side
            optimizer of every table (see Client.create_table).
        accumulate: micro-batches per iteration: pull() fetches on the first of them,
            push() sends the averaged gradients and clocks on the last.
        prefix: prepended to each parameter's name to name its table; or `names`, a
            mapping or function from parameter name to table name.
        init: (name, param) -> (initializer, scale) for the shards' first values
            (default he_init); `seed` seeds them (table i gets seed * 1000003 + i, as
            leash-worker does).
        create: False opens tables another worker created (waiting up to open_timeout s).
        prefetch: overlap the next pull with the step (default: when staleness >= 1).
        push_in_backward: send each parameter's gradient as soon as backward() has made it
            (a hook per parameter), handed to the client's sender thread and sent while
            backward goes on; push() then only ends the iteration. Default: True for a CPU
            module. The gradients are read as backward() leaves them: a loop that changes
            .grad between backward() and push() (gradient clipping, a second backward()
            per micro-batch) needs push_in_backward=False.
        pull_in_place: make each parameter of 64 KiB or more (p.data) the pulled reply itself
            where its table lies on one shard, instead of copying the reply into buffers of
            the module's. Default: True for a CPU module (a CUDA module copies through
            pinned buffers).

    Raises InvalidArgumentError for bad arguments, WrongDTypeError for a parameter that is
    not float32, TableExistsError if a table exists with another spec.
    """

    def __init__(self, client: Client, module: torch.nn.Module, optimizer: str = "sgd",
                 lr: float = 0.01, *, momentum: float = 0.9, beta1: float = 0.9,
                 beta2: float = 0.999, epsilon: float = 1e-8, weight_decay: float = 0.0,
                 accumulate: int = 1, prefix: str = "",
                 names: Union[None, Mapping[str, str], Callable[[str], str]] = None,
                 init: Optional[InitFn] = None, seed: int = 1, create: bool = True,
                 open_timeout: float = 30.0, prefetch: Optional[bool] = None,
                 push_in_backward: Optional[bool] = None,
                 pull_in_place: Optional[bool] = None) -> None:
        if not isinstance(client, Client):
            raise InvalidArgumentError("client must be a leash.Client")
        if not isinstance(module, torch.nn.Module):
            raise InvalidArgumentError("module must be a torch.nn.Module")
        if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
            raise InvalidArgumentError(f"accumulate must be an integer >= 1, got {accumulate!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise InvalidArgumentError(f"seed must be an integer >= 0, got {seed!r}")
        self.client = client
        self.module = module
        self.accumulate = accumulate
        self.prefetch = client.staleness >= 1 if prefetch is None else bool(prefetch)
        init = init or he_init
        self.names: List[str] = []
        self.params: List[torch.nn.Parameter] = []
        self.tables: List[Table] = []
        trainable = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        for i, (name, p) in enumerate(trainable):
            if p.dtype != torch.float32:
                raise WrongDTypeError(f"parameter '{name}' is {p.dtype}; Leash tables hold float32")
            tname = self._table_name(name, prefix, names)
            shape = table_shape(p)
            if create:
                kind, scale = init(name, p)
                t = client.create_table(tname, shape, optimizer, lr, momentum=momentum,
                                        beta1=beta1, beta2=beta2, epsilon=epsilon,
                                        weight_decay=weight_decay, init=kind,
                                        init_scale=float(scale), seed=seed * 1000003 + i)
            else:
                t = client.open_table(tname, shape, timeout=open_timeout)
            self.names.append(name)
            self.params.append(p)
            self.tables.append(t)
        self._sparse = [m for m in module.modules() if isinstance(m, SparseEmbedding)]
        if not self.params and not self._sparse:
            raise InvalidArgumentError("the module has no trainable parameters")
        self._cuda = any(p.device.type != "cpu" for p in self.params)
        # On the CPU (by default) each pull's arrays are the replies themselves where a table
        # lies on one shard (the binding's in-place pull), and p.data is pointed at them: no
        # copy, and nothing the next pull writes into (through a same-host shard's shared
        # memory, its ring's bytes). A table whose replies are copied anyway (a 16-bit wire,
        # rows on several shards, more than the client's share of a ring held) gets the two
        # buffers below from its first such pull on: a copy into memory used before costs
        # less than one into new memory every pull.
        self.pull_in_place = (not self._cuda if pull_in_place is None else bool(pull_in_place))
        if self.pull_in_place and self._cuda:
            raise InvalidArgumentError("pull_in_place is for CPU modules")
        self._got: List[Optional[List[Any]]] = [None, None]  # pulled, not installed yet
        self._buffers: List[List[Optional[torch.Tensor]]]
        self._views: List[List[Any]]
        if self.pull_in_place:  # buffers only for the tables whose pulls are copied
            self._buffers = [[None] * len(self.params) for _ in range(2)]
            self._views = [[None] * len(self.params) for _ in range(2)]
            # Small tables too: installing a reply costs a few µs of Python per parameter
            # (its array and tensor made), more than copying a small one into a buffer.
            for i, p in enumerate(self.params):
                if p.numel() * 4 < _IN_PLACE_MIN_BYTES:
                    for w in (0, 1):
                        self._give_buffer(w, i)
        else:
            # Two host buffers per parameter: the step reads one while the next step's pull
            # fills the other. On the CPU the module's parameters are these buffers (p.data is
            # pointed at the one just pulled: no copy); on CUDA they are pinned and copied in.
            self._buffers = [[], []]
            for p in self.params:
                if self._cuda:
                    a = torch.empty(p.shape, dtype=torch.float32, pin_memory=True)
                    b = torch.empty(p.shape, dtype=torch.float32, pin_memory=True)
                else:
                    a = p.data if p.data.is_contiguous() else p.data.contiguous()
                    b = torch.empty_like(a)
                self._buffers[0].append(a)
                self._buffers[1].append(b)
            self._views = [[t.numpy() for t in bufs] for bufs in self._buffers]
        self._grad_staging = ([torch.empty(p.shape, dtype=torch.float32, pin_memory=True)
                               for p in self.params] if self._cuda else None)
        self._current = 0  # the buffer set the module reads now
        self._pending: Optional[Any] = None  # a prefetch into the other set
        self._pending_clock = -1
        self._pending_rejoins = 0
        self._micro = 0
        self.steps = 0
        self.rejoins = 0
        # Gradients pushed from a hook on each parameter's gradient accumulator, which runs
        # once backward() has stored p.grad (the accumulators are kept: a parameter holds
        # its own only weakly).
        self.push_in_backward = (not self._cuda if push_in_backward is None
                                 else bool(push_in_backward))
        if self.push_in_backward and self._cuda:
            raise InvalidArgumentError("push_in_backward is for CPU modules")
        self._armed = False  # between pull() and push(): hooks push
        self._sent = [False] * len(self.params)
        # What each hook sent: the gradient tensor and its version, so that push() can tell
        # a gradient changed after its hook (clipping, scaling: those need
        # push_in_backward=False) from one left alone.
        self._sent_grad: List[Any] = [None] * len(self.params)
        self._accumulators = []
        if self.push_in_backward:
            with torch.enable_grad():
                for i, p in enumerate(self.params):
                    acc = p.expand_as(p).grad_fn.next_functions[0][0]
                    acc.register_hook(self._grad_hook(i))
                    self._accumulators.append(acc)

    @staticmethod
    def _table_name(name: str, prefix: str, names: Any) -> str:
        if names is None:
            return prefix + name
        if callable(names):
            return names(name)
        if isinstance(names, Mapping):
            return names.get(name, prefix + name)
        raise InvalidArgumentError("names must be a mapping or a function of the parameter name")

    def _grad_hook(self, i: int) -> Callable[..., None]:
        p, table, sent = self.params[i], self.tables[i], self._sent
        push_tensor = self.client._c.push_tensor

        def hook(*_: Any) -> None:
            # The last micro-batch of an iteration, after pull(): p.grad is final.
            if not self._armed or sent[i] or (self._micro + 1) % self.accumulate != 0:
                return
            g = p.grad
            if g is None:
                return
            if self.accumulate > 1:
                g.mul_(1.0 / self.accumulate)
            if not g.is_contiguous():
                return  # push() sends a contiguous copy
            push_tensor(table, g)
            sent[i] = True
            self._sent_grad[i] = (g, g._version)
        return hook

    # ---- the training loop -------------------------------------------------------------

    def pull(self) -> None:
        """Puts the values this step may use into the module: the prefetch started during
        the previous step if it was for this clock, else a pull now. Starts the next
        step's prefetch (staleness >= 1). Within an accumulation group only the first
        micro-batch pulls. A worker found evicted rejoins and pulls again."""
        if self._micro % self.accumulate != 0:
            return
        for attempt in range(3):
            if self.client._c.needs_rejoin:
                self._rejoin()
            try:
                self._pull_now()
                self._armed = self.push_in_backward
                return
            except NotRegisteredError:
                if attempt == 2:
                    raise
                self._rejoin()

    def _pull_now(self) -> None:
        c = self.client
        cc = c._c  # the extension's client: no Python property in between
        took = False
        if self._pending is not None:
            usable = self._pending_clock == cc.current_clock and self._pending_rejoins == c._rejoins
            try:
                got = self._took(self._pending)  # kept while it may still write (Ctrl-C)
            except NotRegisteredError:
                self._pending = None
                self._abandon(self._current ^ 1)
                raise
            self._pending = None
            if usable:
                took = True
                self._current ^= 1
                self._got[self._current] = got
        if not took:
            try:
                self._got[self._current] = self._took(
                    cc.start_pulls(self.tables, self._views[self._current], -1))
            except NotRegisteredError:
                self._abandon(self._current)
                raise
        self._install(self._current)
        if self.prefetch:
            nxt = self._current ^ 1
            self._pending_clock = cc.current_clock + 1
            self._pending_rejoins = c._rejoins
            self._pending = cc.start_pulls(self.tables, self._views[nxt], self._pending_clock)

    def push(self) -> bool:
        """After backward(): on the last micro-batch of an iteration, sends every
        parameter's gradient (averaged over the micro-batches), clears the gradients and
        ends the iteration (clock). True when it did; False while accumulating."""
        self._micro += 1
        if self._micro % self.accumulate != 0:
            return False
        scale = 1.0 / self.accumulate
        self._armed = False
        sent = self._sent
        try:
            for i, (t, p) in enumerate(zip(self.tables, self.params)):
                if sent[i]:  # sent by its hook during backward()
                    sent[i] = False
                    g, version = self._sent_grad[i]
                    self._sent_grad[i] = None
                    if p.grad is not g or g._version != version:
                        raise InvalidArgumentError(
                            f"the gradient of '{self.names[i]}' changed after backward() had pushed it "
                            "(clipped or scaled in place?): the shard may have got it as it was before or after. Pass "
                            "push_in_backward=False to leash.torch.Parameters to push "
                            "gradients as they are at push()")
                    p.grad = None
                    continue
                g = p.grad
                if g is None:
                    continue  # not used by this step: nothing to apply
                if self.accumulate > 1:
                    g.mul_(scale)
                if self._grad_staging is not None:
                    host = self._grad_staging[i]
                    host.copy_(g)
                    g = host
                elif not g.is_contiguous():
                    g = g.contiguous()
                self.client._c.push(t, g.detach().numpy(), False)
                p.grad = None
            for m in self._sparse:
                m.push(scale)
            self.client._c.clock()
        except NotRegisteredError:
            self._rejoin()  # this iteration's gradients are void; the data chunk is leased again
        self.steps += 1
        return True

    def idle(self) -> None:
        """An iteration without data (others hold the epoch's last chunks): clocks, so a
        tight staleness bound never makes the others wait for this worker."""
        try:
            self.client.clock()
        except NotRegisteredError:
            self._rejoin()

    def chunks(self, plan: Union[DataPlan, Mapping[str, int]]) -> Iterator[Chunk]:
        """client.chunks(plan) with idle() between chunks."""
        return self.client.chunks(plan, on_idle=self.idle)

    def sync(self) -> None:
        """Pulls the latest values into the module now (e.g. before evaluating), waiting
        for a prefetch in flight first."""
        if self._pending is not None:
            try:
                self._pending.wait()
            except NotRegisteredError:
                self._abandon(self._current ^ 1)
            self._pending = None
        for attempt in range(3):
            if self.client.needs_rejoin:
                self._rejoin()
            try:
                self._got[self._current] = self._took(
                    self.client._c.start_pulls(self.tables, self._views[self._current], -1))
                break
            except NotRegisteredError:
                self._abandon(self._current)
                if attempt == 2:
                    raise
        self._install(self._current)

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """The parameters' current values by parameter name (copies)."""
        return {n: p.detach().clone() for n, p in zip(self.names, self.params)}

    # ---- internals ---------------------------------------------------------------------

    def _took(self, batch: Any) -> List[Any]:
        """Waits for `batch` and returns its arrays; pulling in place, a table whose array
        was copied to make it is pulled into buffers of its own from now on."""
        got = batch.wait()
        # Only while some table is still pulled in place: once every table has its
        # buffers there is nothing left to find out (the binding's check costs GIL time).
        if self.pull_in_place and any(v is None for v in self._views[0]):
            for i, in_place in enumerate(batch.in_place()):
                if not in_place and self._views[0][i] is None:
                    for w in (0, 1):
                        self._give_buffer(w, i)
        return got

    def _give_buffer(self, which: int, i: int) -> None:
        """New host memory for parameter i's buffer in set `which` (pinned on CUDA, for
        the asynchronous copy to the device)."""
        t = torch.empty(self.params[i].shape, dtype=torch.float32, pin_memory=self._cuda)
        self._buffers[which][i] = t
        self._views[which][i] = t.numpy()

    def _install(self, which: int) -> None:
        got, self._got[which] = self._got[which], None
        if self.pull_in_place:  # the arrays pulled: replies, or the buffers of copied tables
            with torch.no_grad():
                views, bufs = self._views[which], self._buffers[which]
                for i, (p, a) in enumerate(zip(self.params, got)):  # type: ignore[arg-type]
                    if a is views[i]:  # pulled into this set's buffer
                        p.data = bufs[i]
                    else:
                        t = torch.from_numpy(a)
                        p.data = t if t.shape == p.shape else t.view(p.shape)
            return
        bufs = self._buffers[which]
        with torch.no_grad():
            for p, b in zip(self.params, bufs):
                if self._cuda:
                    p.data.copy_(b, non_blocking=True)
                else:
                    p.data = b
        if self._cuda:
            torch.cuda.synchronize()  # the host buffers are refilled by the next prefetch

    def _abandon(self, which: int) -> None:
        """Gives buffer set `which` new memory: a pull given up on may still write into
        the old (kept alive by the binding until its reply comes). Pulled in place, only
        the copied tables have buffers: a pull of the others writes only what it returns."""
        for i in range(len(self.params)):
            if self._views[which][i] is not None:
                self._give_buffer(which, i)

    def _rejoin(self) -> None:
        if self._pending is not None:
            # A prefetch sent after the eviction may stay parked for a clock nobody reaches:
            # not waited for.
            self._pending = None
            self._abandon(self._current ^ 1)
        for p in self.params:
            p.grad = None
        self._sent[:] = [False] * len(self.params)  # in place: the hooks hold this list
        self._armed = False
        for m in self._sparse:
            m._looked_up.clear()
        self._micro = 0
        self.rejoins += 1
        self.client.rejoin()

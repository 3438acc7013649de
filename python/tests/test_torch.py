"""leash.torch.Parameters against a real shard, exactly: plain SGD at learning rate 1 and
zero initial values, so after a push of g every value is exactly -g. Covers the tables it
makes, pull before / push after a step, the prefetch under staleness 1 (a step sees the
values from before the previous step's push), gradient accumulation (the mean is pushed
once per k micro-batches), a 16-bit wire, opening another worker's tables, the life of a
handed-over gradient, and its argument errors; and the warning leash.torch gives where OpenBLAS fell back to pre-AVX
kernels."""
import os
import signal
import subprocess
import sys
import time
import weakref

import numpy as np
import pytest

import leash

torch = pytest.importorskip("torch")
import leash.torch  # noqa: E402


def zeros(name, p):
    return "zeros", 0.0


def linear():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def step(model, x):
    model(x).sum().backward()


def expected_grads(x):
    """d(sum(W x + b))/dW = sum over the batch of x, per output row; d/db = batch size."""
    gw = np.tile(x.sum(0).numpy(), (2, 1))
    gb = np.full(2, float(x.shape[0]), np.float32)
    return gw, gb


X1 = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.25, -1.0]])
X2 = torch.tensor([[2.0, 0.0, -4.0]])


def test_tables_follow_the_parameters_and_a_step_is_exact(cluster2):
    with leash.Client(cluster2.servers, staleness=0) as c:
        model = linear()
        ps = leash.torch.Parameters(c, model, optimizer="sgd", lr=1.0, init=zeros, prefix="m/")
        assert [t.name for t in ps.tables] == ["m/weight", "m/bias"]
        assert [(t.rows, t.cols) for t in ps.tables] == [(2, 3), (1, 2)]
        assert not ps.prefetch
        ps.pull()
        assert torch.count_nonzero(model.weight) == 0 and torch.count_nonzero(model.bias) == 0
        step(model, X1)
        assert ps.push() is True
        assert model.weight.grad is None  # cleared for the next step
        assert c.current_clock == 1
        ps.pull()
        gw, gb = expected_grads(X1)
        np.testing.assert_array_equal(model.weight.detach().numpy(), -gw)
        np.testing.assert_array_equal(model.bias.detach().numpy(), -gb)


# In place (the CPU default, here for tables of any size) each pull's parameters are its
# replies: new memory every pull, which nothing writes afterwards (a tensor kept from an
# earlier pull keeps its values). Without, two buffers per parameter are swapped, each
# refilled two pulls later.
@pytest.mark.parametrize("in_place", [True, False])
def test_under_staleness_one_the_next_pull_is_prefetched_during_the_step(cluster, in_place,
                                                                        monkeypatch):
    monkeypatch.setattr(leash.torch, "_IN_PLACE_MIN_BYTES", 0)
    with leash.Client(cluster.servers, staleness=1) as c:
        model = linear()
        ps = leash.torch.Parameters(c, model, optimizer="sgd", lr=1.0, init=zeros,
                                    pull_in_place=in_place)
        assert ps.prefetch and ps.pull_in_place == in_place
        ps.pull()  # clock 0: values now, and the pull for clock 1 goes out at once
        buffers = [model.weight.data_ptr()]
        first = model.weight.data
        step(model, X1)
        ps.push()
        ps.pull()  # clock 1: the prefetch, sent before step 0's push: still zeros
        assert torch.count_nonzero(model.weight) == 0
        buffers.append(model.weight.data_ptr())
        step(model, X2)
        ps.push()
        ps.pull()  # clock 2: prefetched during step 1, after step 0's push
        gw1, gb1 = expected_grads(X1)
        np.testing.assert_array_equal(model.weight.detach().numpy(), -gw1)
        np.testing.assert_array_equal(model.bias.detach().numpy(), -gb1)
        buffers.append(model.weight.data_ptr())
        pulled_in_place = c.binding_times()["values_pulled_in_place"]
        if in_place:
            assert len(set(buffers)) == 3  # the replies themselves: no buffer refilled
            assert torch.count_nonzero(first) == 0  # clock 0's values, never written since
            assert pulled_in_place >= 3 * (6 + 2)  # every pull of both tables
        else:
            assert len(set(buffers)) == 2  # two buffers per parameter, swapped: no copies
            assert buffers[0] == buffers[2]
            np.testing.assert_array_equal(first.numpy(), -gw1)  # refilled by clock 2's pull
            assert pulled_in_place == 0
        ps.sync()  # everything pushed so far
        gw2, gb2 = expected_grads(X2)
        np.testing.assert_array_equal(model.weight.detach().numpy(), -(gw1 + gw2))
        np.testing.assert_array_equal(model.bias.detach().numpy(), -(gb1 + gb2))


def test_gradients_are_pushed_during_backward_before_push_is_called(cluster):
    with leash.Client(cluster.servers, staleness=0) as c:
        model = linear()
        ps = leash.torch.Parameters(c, model, optimizer="sgd", lr=1.0, init=zeros)
        assert ps.push_in_backward
        ps.pull()
        step(model, X1)  # the hooks hand both gradients to the sender
        c.wait()  # sent and applied, with no push() yet
        gw, gb = expected_grads(X1)
        np.testing.assert_array_equal(c.pull(ps.tables[0]), -gw)
        np.testing.assert_array_equal(c.pull(ps.tables[1]), -gb.reshape(1, 2))
        assert c.current_clock == 0
        ps.push()  # only the clock: nothing is sent twice
        assert c.current_clock == 1
        ps.pull()
        np.testing.assert_array_equal(model.weight.detach().numpy(), -gw)


def test_without_push_in_backward_push_sends_the_gradients_as_changed(cluster):
    with leash.Client(cluster.servers, staleness=0) as c:
        model = linear()
        ps = leash.torch.Parameters(c, model, optimizer="sgd", lr=1.0, init=zeros,
                                    push_in_backward=False)
        ps.pull()
        step(model, X1)
        c.wait()
        assert torch.count_nonzero(torch.from_numpy(c.pull(ps.tables[0]))) == 0  # not yet sent
        model.weight.grad.mul_(0.5)  # e.g. clipping, between backward() and push()
        ps.push()
        ps.pull()
        gw, gb = expected_grads(X1)
        np.testing.assert_array_equal(model.weight.detach().numpy(), -gw / 2)
        np.testing.assert_array_equal(model.bias.detach().numpy(), -gb)


def test_a_gradient_changed_after_its_hook_pushed_it_is_an_error_not_a_silent_push(cluster):
    with leash.Client(cluster.servers, staleness=0) as c:
        model = linear()
        ps = leash.torch.Parameters(c, model, optimizer="sgd", lr=1.0, init=zeros)
        ps.pull()
        step(model, X1)
        model.weight.grad.mul_(0.5)  # clipping after backward(), with pushes during backward
        with pytest.raises(leash.InvalidArgumentError, match="push_in_backward=False"):
            ps.push()


def test_push_tensor_refuses_what_it_cannot_send(cluster):
    with leash.Client(cluster.servers, staleness=0) as c:
        t = c.create_table("t", (2, 3), optimizer="sgd", lr=1.0)
        with pytest.raises(leash.WrongDTypeError):
            c._c.push_tensor(t, np.ones((2, 3), np.float32))  # not a tensor
        with pytest.raises(leash.WrongDTypeError):
            c._c.push_tensor(t, torch.ones(2, 3, dtype=torch.float64))
        with pytest.raises(leash.WrongShapeError):
            c._c.push_tensor(t, torch.ones(3, 3))
        with pytest.raises(leash.WrongShapeError):
            c._c.push_tensor(t, torch.ones(3, 2).t())  # not contiguous
        c._c.push_tensor(t, torch.ones(2, 3))
        c.clock()
        c.wait()
        np.testing.assert_array_equal(c.pull(t), -np.ones((2, 3), np.float32))


@pytest.mark.parametrize("shared_memory", [False, True], ids=["socket", "shm"])
def test_a_handed_over_tensor_is_kept_while_a_shard_may_still_read_it(cluster2, shared_memory):
    """Over the socket the frames to both shards are the tensor's own memory: the binding
    keeps it until the last shard has answered (here: shard 1, stopped, after shard 0).
    Through shared memory the client copies it into the ring and it is let go at once."""
    with leash.Client(cluster2.servers, staleness=0, shared_memory=shared_memory) as c:
        t = c.create_table("t", (64, 256), optimizer="sgd", lr=1.0, init="zeros")
        c.pull(t)  # both shards answered once: their shared-memory links are up
        assert c.counters()["shared_memory_shards"] == (2 if shared_memory else 0)
        g = torch.full((64, 256), 0.5)
        alive = weakref.ref(g)
        shard1 = cluster2.procs[1]
        os.kill(shard1.pid, signal.SIGSTOP)
        try:
            c._c.push_tensor(t, g)
            del g  # from here only the binding can keep it
            c.clock()  # queued behind the push: sends it to both shards
            time.sleep(0.3)  # the sender has run the push (shard 0 answers it)
            held = c.binding_times()["tensors_held"]
            if shared_memory:
                deadline = time.monotonic() + 10
                while alive() is not None and time.monotonic() < deadline:
                    time.sleep(0.01)
                    c.binding_times()
                assert alive() is None, "copied into both rings, the tensor is let go"
            else:
                assert held == 1 and alive() is not None, "shard 1 may still read it"
        finally:
            os.kill(shard1.pid, signal.SIGCONT)
        c.wait()
        deadline = time.monotonic() + 10
        while c.binding_times()["tensors_held"] > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.binding_times()["tensors_held"] == 0
        assert alive() is None, "both shards answered: nothing reads the tensor any more"
        assert c.binding_times()["pushes_handed_over"] == 1
        np.testing.assert_array_equal(c.pull(t), np.full((64, 256), -0.5, np.float32))


def test_pulled_in_place_through_shared_memory_the_replies_are_read_in_the_shards_ring(
        cluster, monkeypatch):
    """Through shared memory a large table's replies are read where they lie in the shard's
    ring (its room goes back to the shard when the parameters move on), the small bias where
    it came over the socket: nothing is copied, and the values are exact throughout."""
    monkeypatch.setattr(leash.torch, "_IN_PLACE_MIN_BYTES", 0)
    with leash.Client(cluster.servers, staleness=1, shared_memory=True, shm_ring_mb=16) as c:
        torch.manual_seed(0)
        model = torch.nn.Linear(256, 64)  # a 64 KiB weight: through the ring
        ps = leash.torch.Parameters(c, model, optimizer="sgd", lr=1.0, init=zeros)
        assert ps.pull_in_place
        x = torch.ones(1, 256)
        c.reset_binding_times()
        # 300 replies of 64 KiB held in turn, 18.75 MiB: more than the ring's 16 MiB, so
        # each one's room came back.
        for i in range(300):
            ps.pull()
            # Staleness 1: the values of the pushes up to two steps back.
            np.testing.assert_array_equal(model.bias.detach().numpy(),
                                          np.full(64, -max(0, i - 1), np.float32))
            np.testing.assert_array_equal(model.weight.detach().numpy(),
                                          np.full((64, 256), -max(0, i - 1), np.float32))
            step(model, x)
            ps.push()
        if c.counters()["shared_memory_shards"] != 1:
            pytest.skip("no shared-memory link to the shard here")
        assert ps._views[0] == [None, None], "no table needed buffers"
        assert c.binding_times()["values_pulled_in_place"] == 300 * (64 + 64 * 256)


def test_pulled_in_place_a_table_whose_replies_are_copied_anyway_gets_buffers(cluster,
                                                                               monkeypatch):
    """A 16-bit wire's replies are widened into memory of the pull's own: from the first
    such pull the table is pulled into two buffers of its own, swapped. Values exact."""
    monkeypatch.setattr(leash.torch, "_IN_PLACE_MIN_BYTES", 0)
    with leash.Client(cluster.servers, staleness=1, wire_dtype="fp16") as c:
        model = torch.nn.Linear(256, 64)
        ps = leash.torch.Parameters(c, model, optimizer="sgd", lr=1.0, init=zeros)
        assert ps.pull_in_place
        x = torch.ones(1, 256)
        c.reset_binding_times()
        weights = []
        for i in range(6):
            ps.pull()
            weights.append(model.weight.data_ptr())
            np.testing.assert_array_equal(model.weight.detach().numpy(),
                                          np.full((64, 256), -max(0, i - 1), np.float32))
            step(model, x)
            ps.push()
        assert ps._views[0][0] is not None and ps._views[0][1] is not None
        assert len(set(weights[-4:])) == 2, "two buffers, swapped"
        assert c.binding_times()["values_pulled_in_place"] == 0


def test_tables_under_64_kib_are_pulled_into_buffers_even_in_place(cluster):
    """Installing a reply costs more Python than copying a small table: only parameters of
    64 KiB and more are read in place."""
    with leash.Client(cluster.servers, staleness=0, shared_memory=False) as c:
        model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Linear(128, 2))
        ps = leash.torch.Parameters(c, model, optimizer="sgd", lr=1.0, init=zeros)
        assert ps.pull_in_place
        # 128 x 128 floats is exactly 64 KiB: in place; the biases and the 128 x 2 are not.
        assert [v is None for v in ps._views[0]] == [True, False, False, False]
        c.reset_binding_times()
        ps.pull()
        assert c.binding_times()["values_pulled_in_place"] == 128 * 128
        assert torch.count_nonzero(model[0].weight) == 0


def test_gradient_accumulation_pushes_the_mean_once_per_group(cluster):
    with leash.Client(cluster.servers, staleness=0) as c:
        model = linear()
        ps = leash.torch.Parameters(c, model, optimizer="sgd", lr=1.0, init=zeros, accumulate=2)
        ps.pull()
        step(model, X1)
        assert ps.push() is False  # the first micro-batch: nothing sent
        assert c.current_clock == 0
        ps.pull()  # within the group: no pull
        step(model, X2)
        assert ps.push() is True
        assert c.current_clock == 1
        ps.pull()
        gw1, gb1 = expected_grads(X1)
        gw2, gb2 = expected_grads(X2)
        np.testing.assert_array_equal(model.weight.detach().numpy(), -(gw1 + gw2) / 2)
        np.testing.assert_array_equal(model.bias.detach().numpy(), -(gb1 + gb2) / 2)


def test_sixteen_bit_wire_trains_exactly_on_representable_values(cluster):
    with leash.Client(cluster.servers, staleness=0, wire_dtype="fp16") as c:
        model = linear()
        ps = leash.torch.Parameters(c, model, optimizer="sgd", lr=1.0, init=zeros)
        ps.pull()
        step(model, X1)  # every gradient is a multiple of 1/4: exact in fp16
        ps.push()
        ps.pull()
        gw, gb = expected_grads(X1)
        np.testing.assert_array_equal(model.weight.detach().numpy(), -gw)
        np.testing.assert_array_equal(model.bias.detach().numpy(), -gb)


def test_a_second_worker_opens_the_tables_by_name(cluster):
    with leash.Client(cluster.servers, name="a") as a, leash.Client(cluster.servers, name="b") as b:
        ma, mb = linear(), linear()
        pa = leash.torch.Parameters(a, ma, optimizer="sgd", lr=1.0, init=zeros, prefix="net/")
        pb = leash.torch.Parameters(b, mb, create=False,
                                    names={"weight": "net/weight", "bias": "net/bias"})
        assert [t.name for t in pb.tables] == ["net/weight", "net/bias"]
        pa.pull()
        step(ma, X1)
        pa.push()
        a.wait()  # a's push is applied
        pb.pull()
        gw, _ = expected_grads(X1)
        np.testing.assert_array_equal(mb.weight.detach().numpy(), -gw)
        with pytest.raises(leash.UnknownTableError):
            leash.torch.Parameters(b, linear(), create=False, prefix="nope/", open_timeout=0.2)


def test_bad_arguments_raise_the_documented_exceptions(cluster):
    with leash.Client(cluster.servers) as c:
        with pytest.raises(leash.InvalidArgumentError):
            leash.torch.Parameters(c, linear(), accumulate=0)
        with pytest.raises(leash.InvalidArgumentError):
            leash.torch.Parameters(c, "not a module")
        with pytest.raises(leash.InvalidArgumentError):
            leash.torch.Parameters("not a client", linear())
        with pytest.raises(leash.InvalidArgumentError):
            leash.torch.Parameters(c, torch.nn.ReLU())  # no parameters
        with pytest.raises(leash.WrongDTypeError):
            leash.torch.Parameters(c, linear().double())
        with pytest.raises(leash.InvalidArgumentError):
            leash.torch.Parameters(c, linear(), optimizer="lamb")
        leash.torch.Parameters(c, linear(), prefix="a/")
        with pytest.raises(leash.TableExistsError):  # same names, another optimizer
            leash.torch.Parameters(c, linear(), prefix="a/", optimizer="adam")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for torch here")
def test_a_cuda_module_goes_through_pinned_buffers(cluster):
    with leash.Client(cluster.servers, staleness=1) as c:
        model = linear().cuda()
        ps = leash.torch.Parameters(c, model, optimizer="sgd", lr=1.0, init=zeros)
        for _ in range(2):
            ps.pull()
            step(model, X1.cuda())
            ps.push()
        ps.sync()
        gw, gb = expected_grads(X1)
        np.testing.assert_array_equal(model.weight.detach().cpu().numpy(), -2 * gw)
        np.testing.assert_array_equal(model.bias.detach().cpu().numpy(), -2 * gb)
        t = c.create_table("raw", (2, 3), optimizer="sgd", lr=1.0)
        c.push(t, torch.ones(2, 3, device="cuda"))
        c.clock()
        out = torch.empty(2, 3, device="cuda")
        c.pull(t, out=out)
        assert torch.equal(out.cpu(), -torch.ones(2, 3))


def _cpu_flags():
    with open("/proc/cpuinfo") as f:
        return next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])


def test_better_openblas_core_replaces_only_a_pre_avx_fallback():
    flags = _cpu_flags()
    if all(x in flags for x in ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")):
        widest = "SkylakeX"
    elif "avx2" in flags and "fma" in flags:
        widest = "Haswell"
    elif "avx" in flags:
        widest = "Sandybridge"
    else:
        widest = ""
    better = leash._leash.better_openblas_core
    assert better("Prescott") == widest
    assert better("nehalem") == widest
    for kept in ("SkylakeX", "Haswell", "Zen", "ARMV8", ""):
        assert better(kept) == "", kept


def test_importing_leash_torch_warns_exactly_when_openblas_fell_back():
    """A child imports torch and leash.torch: with OPENBLAS_CORETYPE set nothing is probed or
    warned; without it the RuntimeWarning comes exactly when openblas_fallback() finds one."""
    code = "import torch, leash.torch as lt; print(repr(lt.openblas_fallback()))"
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(leash.__file__)))
    env.pop("OPENBLAS_CORETYPE", None)
    free = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert free.returncode == 0, free.stderr
    warned = "RuntimeWarning: OpenBLAS" in free.stderr
    assert warned == (free.stdout.strip() != "None"), (free.stdout, free.stderr)
    if warned:
        assert "OPENBLAS_CORETYPE=" in free.stderr
    chosen = subprocess.run([sys.executable, "-c", code], env=dict(env, OPENBLAS_CORETYPE="Prescott"),
                            capture_output=True, text=True, timeout=120)
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.strip() == "None"
    assert "RuntimeWarning" not in chosen.stderr

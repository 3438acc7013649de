"""leash.Client against real leash-server shards: exact pull/push round trips (SGD at
learning rate 1, so a push of g moves every value by exactly -g), batched and prefetched
pulls, rows by key, data-chunk leases, status, and the documented exception for every
bad argument."""
import numpy as np
import pytest

import leash
from leash import _leash


def sgd1(client, name, shape):
    return client.create_table(name, shape, optimizer="sgd", lr=1.0)


def test_status_codes_match_the_cpp_enum():
    names = _leash.status_code_names()
    assert len(names) == len(leash.StatusCode)
    for code, name in names.items():
        assert leash.errors._CODE_NAMES[leash.StatusCode(code)] == name


def test_pull_push_round_trip_is_exact(cluster2):
    with leash.Client(cluster2.servers, name="rt") as c:
        w = sgd1(c, "w", (7, 3))
        b = sgd1(c, "b", 5)
        assert w.shape == (7, 3) and w.rows == 7 and w.cols == 3 and w.size == 21
        assert b.shape == (5,) and b.rows == 5 and b.cols == 1
        np.testing.assert_array_equal(c.pull(w), np.zeros((7, 3), np.float32))
        g = np.arange(21, dtype=np.float32).reshape(7, 3) / 4
        c.push(w, g)
        c.push(b, np.full(5, 2.5, np.float32))
        assert c.clock() == 1
        v = c.pull(w)
        assert v.dtype == np.float32 and v.shape == (7, 3)
        np.testing.assert_array_equal(v, -g)
        np.testing.assert_array_equal(c.pull(b), np.full(5, -2.5, np.float32))
        # Into a given array: the same memory, no new array.
        out = np.empty((7, 3), np.float32)
        assert c.pull(w, out=out) is out
        np.testing.assert_array_equal(out, -g)
        flat = np.empty(21, np.float32)  # any shape of the table's size
        c.pull(w, out=flat)
        np.testing.assert_array_equal(flat, -g.ravel())


def test_torch_tensors_are_pulled_into_and_pushed_from_in_place(cluster):
    torch = pytest.importorskip("torch")
    with leash.Client(cluster.servers) as c:
        w = sgd1(c, "w", (4, 6))
        grad = torch.arange(24, dtype=torch.float32).reshape(4, 6).requires_grad_(False)
        c.push(w, grad)
        c.clock()
        p = torch.nn.Parameter(torch.zeros(4, 6))
        storage = p.data_ptr()
        assert c.pull(w, out=p) is p
        assert p.data_ptr() == storage
        assert torch.equal(p.detach(), -grad)
        with pytest.raises(leash.WrongDTypeError):
            c.pull(w, out=torch.zeros(4, 6, dtype=torch.float64))
        with pytest.raises(leash.WrongShapeError):
            c.push(w, torch.zeros(6, 4).t())  # not contiguous


def test_start_pulls_batches_and_prefetches_the_next_clock(cluster2):
    with leash.Client(cluster2.servers, staleness=1) as c:
        a = sgd1(c, "a", (10, 2))
        b = sgd1(c, "b", (3,))
        c.push(a, np.ones((10, 2), np.float32))
        c.clock()
        outs = [np.empty((10, 2), np.float32), None]
        pending = c.start_pulls([a, b], outs, for_clock=c.current_clock + 1)
        got = pending.wait()
        assert pending.ready()
        assert got[0] is outs[0]
        np.testing.assert_array_equal(got[0], -np.ones((10, 2), np.float32))
        np.testing.assert_array_equal(got[1], np.zeros(3, np.float32))
        both = c.pull_all([a, b])
        np.testing.assert_array_equal(both[0], got[0])


def test_rows_by_key_round_trip(cluster2):
    with leash.Client(cluster2.servers) as c:
        e = sgd1(c, "emb", (100, 4))
        keys = np.array([99, 0, 50, 7], np.int64)
        grads = np.arange(16, dtype=np.float32).reshape(4, 4)
        c.push_rows(e, keys, grads, wait=True)
        c.clock()
        rows = c.pull_rows(e, [7, 99])
        np.testing.assert_array_equal(rows, -grads[[3, 0]])
        full = c.pull(e)
        assert full[1:7].sum() == 0 and np.array_equal(full[50], -grads[2])
        with pytest.raises(leash.InvalidArgumentError, match="out of range"):
            c.pull_rows(e, [100])
        with pytest.raises(leash.InvalidArgumentError, match="negative"):
            c.pull_rows(e, [-1])
        with pytest.raises(leash.WrongDTypeError):
            c.pull_rows(e, [0.5])


def test_a_second_worker_opens_a_table_by_name(cluster2):
    with leash.Client(cluster2.servers, name="a") as a, leash.Client(cluster2.servers, name="b") as b:
        t = a.create_table("shared", (6, 2), optimizer="sgd", lr=1.0, init="constant", init_scale=3.0)
        u = b.open_table("shared")
        assert u.shape == (6, 2)
        np.testing.assert_array_equal(b.pull(u), np.full((6, 2), 3.0, np.float32))
        assert b.open_table("shared", shape=12).shape == (12,)
        with pytest.raises(leash.WrongShapeError):
            b.open_table("shared", shape=(5, 2))
        with pytest.raises(leash.UnknownTableError):
            b.open_table("nope")
        # The same spec finds the table; another spec is refused.
        assert a.create_table("shared", (6, 2), optimizer="sgd", lr=1.0, init="constant",
                              init_scale=3.0).size == t.size
        with pytest.raises(leash.TableExistsError):
            a.create_table("shared", (6, 2), optimizer="adam", lr=1.0)


def test_chunks_cover_every_sample_once_per_epoch(cluster):
    with leash.Client(cluster.servers) as c:
        seen = {0: [], 1: []}
        for chunk in c.chunks({"num_samples": 1000, "chunk_size": 128, "epochs": 2, "seed": 3}):
            seen[chunk.epoch].extend(chunk.indices())
            c.clock()
        for e in (0, 1):
            assert sorted(seen[e]) == list(range(1000))
        cov = c.status()["coverage"]
        assert cov["epochs_done"] == 2 and cov["epochs"] == 2
        with pytest.raises(leash.FailedPreconditionError):
            next(iter(c.chunks(leash.DataPlan(num_samples=999, chunk_size=128, epochs=2))))


def test_status_names_workers_and_tables(cluster2):
    with leash.Client(cluster2.servers, name="status-worker") as c:
        sgd1(c, "t", (4, 4))
        st = c.status()
        assert [w["name"] for w in st["workers"]] == ["status-worker"]
        assert st["tables"] == [{"name": "t", "rows": 4, "cols": 4}]
        assert len(st["shards"]) == 2
    with leash.Client(cluster2.servers, register=False) as observer:
        assert observer.status()["workers"] == []  # the worker left on exit


def test_every_bad_argument_raises_the_documented_exception(cluster):
    with pytest.raises(leash.InvalidArgumentError):
        leash.Client([])
    with pytest.raises(leash.InvalidArgumentError):
        leash.Client(cluster.servers, staleness=-1)
    with pytest.raises(leash.InvalidArgumentError):
        leash.Client(cluster.servers, staleness="1")
    with pytest.raises(leash.InvalidArgumentError):
        leash.Client(cluster.servers, wire_dtype="fp8")
    with pytest.raises(leash.InvalidArgumentError):
        leash.Client(cluster.servers, curve_keys="/nonexistent/keys")
    with leash.Client(cluster.servers) as c:
        t = sgd1(c, "t", (3, 2))
        for bad in [dict(shape=()), dict(shape=(0, 2)), dict(shape=(2, -1)), dict(shape="3"),
                    dict(shape=(3, 2), optimizer="rmsprop"), dict(shape=(3, 2), lr="fast"),
                    dict(shape=(3, 2), lr=float("nan")), dict(shape=(3, 2), init="xavier"),
                    dict(shape=(3, 2), seed=-1), dict(shape=(2, 2 ** 33))]:
            with pytest.raises(leash.InvalidArgumentError):
                c.create_table("bad", **bad)
        with pytest.raises(leash.InvalidArgumentError):
            c.create_table("", (3, 2))
        with pytest.raises(leash.InvalidArgumentError):
            c.create_table("neg", (3, 2), lr=-1.0)  # refused by the shards' spec check
        with pytest.raises(leash.WrongShapeError):
            c.push(t, np.zeros(5, np.float32))
        with pytest.raises(leash.WrongShapeError):
            c.pull(t, out=np.zeros((2, 3, 2), np.float32))
        with pytest.raises(leash.WrongShapeError):
            c.pull(t, out=np.zeros((2, 3), np.float32).T)  # not C-contiguous
        with pytest.raises(leash.WrongDTypeError):
            c.push(t, np.zeros((3, 2), np.float64))
        with pytest.raises(leash.WrongDTypeError):
            c.push(t, [[0.0, 0.0]] * 3)
        with pytest.raises(leash.InvalidArgumentError):
            readonly = np.zeros((3, 2), np.float32)
            readonly.setflags(write=False)
            c.pull(t, out=readonly)
        with pytest.raises(TypeError):
            c.pull("t")  # not a Table
        with pytest.raises(leash.InvalidArgumentError):
            c.start_pulls([t], [None, None])
        with pytest.raises(leash.InvalidArgumentError):
            c.start_pulls(["t"])
        with pytest.raises(leash.InvalidArgumentError):
            next(iter(c.chunks({"num_samples": 0})))
        with pytest.raises(leash.InvalidArgumentError):
            c.open_table("t", timeout="soon")
        # Each is also the built-in a caller would catch.
        assert issubclass(leash.WrongDTypeError, TypeError)
        assert issubclass(leash.InvalidArgumentError, ValueError)
        assert issubclass(leash.UnknownTableError, LookupError)
        assert issubclass(leash.UnavailableError, ConnectionError)
        c.push(t, np.ones((3, 2), np.float32))  # nothing above broke the client
        c.clock()
        np.testing.assert_array_equal(c.pull(t), -np.ones((3, 2), np.float32))
    with pytest.raises(leash.ClientClosedError):
        c.pull(t)
    c.leave()  # idempotent


def test_striped_pushes_and_pulls_are_exact(cluster2):
    # 2 MB on each of the two shards: over the 1 MiB threshold, so every push and pull reply
    # is split over three connections per shard and put back together.
    with leash.Client(cluster2.servers, name="striped", stripes=3, shared_memory=False) as c:
        t = sgd1(c, "big", (8192, 128))
        g = (np.arange(8192 * 128, dtype=np.float32) % 97 + 1).reshape(8192, 128)
        for _ in range(3):
            c.push(t, g)
        c.clock()
        np.testing.assert_array_equal(c.pull(t), -3 * g)
    with pytest.raises(leash.InvalidArgumentError):
        leash.Client(cluster2.servers, stripes=0)
    with pytest.raises(leash.InvalidArgumentError) as e:
        leash.Client(cluster2.servers, stripes=17)
    assert "1 to 16" in e.value.message


def test_a_ring_smaller_than_the_pushes_sends_them_through_the_socket_exactly(cluster2):
    # 2 MB per shard per push, through rings that may grow to 1 MiB only: every large frame
    # finds no room in its ring and goes through the socket instead, applied all the same.
    with leash.Client(cluster2.servers, name="small-ring", shm_ring_mb=1) as c:
        t = sgd1(c, "ringed", (8192, 128))
        g = (np.arange(8192 * 128, dtype=np.float32) % 89 + 1).reshape(8192, 128)
        for _ in range(3):
            c.push(t, g)
        c.clock()
        np.testing.assert_array_equal(c.pull(t), -3 * g)
    with pytest.raises(leash.InvalidArgumentError) as e:
        leash.Client(cluster2.servers, shm_ring_mb=0)
    assert ">= 1" in e.value.message
    with pytest.raises(leash.InvalidArgumentError) as e:
        leash.Client(cluster2.servers, shm_ring_mb=4097)
    assert "1 to 4096" in e.value.message


def test_unreachable_shards_raise_unavailable_with_the_code(tmp_path):
    from conftest import free_port
    with pytest.raises(leash.UnavailableError) as e:
        leash.Client([f"tcp://127.0.0.1:{free_port()}"], connect_timeout=0.5)
    assert e.value.code == leash.StatusCode.UNAVAILABLE
    assert "did not answer" in e.value.message
    assert str(e.value).startswith("Unavailable: ")


def test_sixteen_bit_wire_rounds_as_bf16(cluster):
    with leash.Client(cluster.servers, wire_dtype="bf16") as c:
        t = sgd1(c, "t", (2, 2))
        c.push(t, np.array([[1.0, 0.5], [3.0, 1.0 + 2 ** -12]], np.float32))
        c.clock()
        np.testing.assert_array_equal(c.pull(t), -np.array([[1.0, 0.5], [3.0, 1.0]], np.float32))


def test_binding_times_count_calls(cluster):
    with leash.Client(cluster.servers) as c:
        t = sgd1(c, "t", (8, 8))
        c.reset_binding_times()
        for _ in range(3):
            c.pull(t)
            c.push(t, np.zeros((8, 8), np.float32))
            c.clock()
        bt = c.binding_times()
        assert bt["pulls"] == 3 and bt["pushes"] == 3 and bt["clocks"] == 3
        assert bt["values_pulled"] == 192 and bt["values_pushed"] == 192
        # A reply may be there before the binding looks (then nothing is waited for).
        assert bt["total_ns"] > 0 and bt["total_ns"] >= bt["wait_ns"] + bt["gil_ns"]
        assert bt["waits"] <= 9


def test_a_pull_without_out_returns_the_reply_itself_which_nothing_writes_later(cluster2):
    """Without `out` a pull hands out the reply's own memory where one shard holds the table
    (counted in values_pulled_in_place), writable, and untouched by later pushes and pulls;
    a table split over both shards comes back copied into one array, as exact."""
    with leash.Client(cluster2.servers, name="ip") as c:
        one = sgd1(c, "one", (1, 64))  # one row: one shard
        split = sgd1(c, "split", (8, 2))  # rows on both shards
        c.reset_binding_times()
        before = c.pull(one)
        assert before.flags.writeable and before.shape == (1, 64)
        assert c.binding_times()["values_pulled_in_place"] == 64
        c.push(one, np.ones((1, 64), np.float32))
        c.push(split, np.ones((8, 2), np.float32))
        c.clock()
        got = c.pull_all([one, split])
        np.testing.assert_array_equal(got[0], np.full((1, 64), -1, np.float32))
        np.testing.assert_array_equal(got[1], np.full((8, 2), -1, np.float32))
        np.testing.assert_array_equal(before, np.zeros((1, 64), np.float32))
        assert c.binding_times()["values_pulled_in_place"] == 128  # the split table copied
        before[0, 0] = 5.0  # its own memory: writing it changes nothing elsewhere
        np.testing.assert_array_equal(c.pull(one), np.full((1, 64), -1, np.float32))

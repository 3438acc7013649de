"""Sparse tables (issue 14) through leash.Client: pull_sparse / push_sparse by 64-bit keys,
exact under SGD at learning rate 1 (a row is created on its first pull by the initializer,
a push of g moves it by exactly -g, a key named twice has its gradients summed). The
shards' sparse implementation may not be on this branch yet: then these tests skip,
saying so; the argument checks that need no sparse table run always."""
import numpy as np
import pytest

import leash


def sparse_or_skip(client, name, dim, **kw):
    try:
        return client.create_table(name, sparse=True, dim=dim, optimizer="sgd", lr=1.0, **kw)
    except leash.InvalidArgumentError as e:
        if "rows > 0" in e.message:  # ps::ValidateSpec before sparse tables were served
            pytest.skip("this leash-server does not serve sparse tables yet (issue 14's "
                        f"shard side is not on this branch): {e.message}")
        raise


def test_sparse_round_trip_is_exact(cluster2):
    with leash.Client(cluster2.servers, staleness=0) as c:
        t = sparse_or_skip(c, "emb", 4, init="constant", init_scale=0.5)
        assert t.sparse and t.dim == 4 and t.shape == (4,)
        keys = np.array([2 ** 63 + 5, 7, 2 ** 64 - 3, 7], np.uint64)
        v = c.pull_sparse(t, keys)
        assert v.shape == (4, 4)
        np.testing.assert_array_equal(v, np.full((4, 4), 0.5, np.float32))
        g = np.arange(16, dtype=np.float32).reshape(4, 4)
        c.push_sparse(t, keys, g)
        c.clock()
        after = c.pull_sparse(t, keys)
        np.testing.assert_array_equal(after[0], 0.5 - g[0])
        np.testing.assert_array_equal(after[1], 0.5 - (g[1] + g[3]))  # key 7 twice: summed
        np.testing.assert_array_equal(after[1], after[3])
        np.testing.assert_array_equal(after[2], 0.5 - g[2])
        np.testing.assert_array_equal(c.pull_sparse(t, [123456789]), np.full((1, 4), 0.5))
        # int64 keys are their bits: -1 is 2^64 - 1.
        np.testing.assert_array_equal(c.pull_sparse(t, np.array([-1], np.int64)),
                                      c.pull_sparse(t, np.array([2 ** 64 - 1], np.uint64)))
        assert c.status()["tables"][0]["name"] == "emb"


def test_sparse_rows_handed_over_go_behind_the_dense_pushes_the_sender_holds(cluster):
    torch = pytest.importorskip("torch")
    with leash.Client(cluster.servers, staleness=0) as c:
        t = sparse_or_skip(c, "emb", 2, init="constant", init_scale=0.5)
        d = c.create_table("d", (2, 3), optimizer="sgd", lr=1.0)
        keys = np.array([9, 4, 9], np.int64)
        g = np.array([[1, 2], [3, 4], [5, 6]], np.float32)
        c.pull_sparse(t, [9, 4])  # the rows are made by their first pull
        # A small dense gradient does not wake the sender: it still holds it when the rows
        # come, so they are queued behind it (the arrays kept until sent), not pushed now.
        c._c.push_tensor(d, torch.ones(2, 3))
        c._c.push_sparse_tensor(t, keys, g)
        del g  # kept alive by the binding until sent
        c.clock()
        c.wait()
        np.testing.assert_array_equal(c.pull(d), -np.ones((2, 3), np.float32))
        np.testing.assert_array_equal(c.pull_sparse(t, [9, 4]),
                                      np.array([[0.5 - 6, 0.5 - 8], [0.5 - 3, 0.5 - 4]]))
        # With nothing held it is pushed at once; a dense table is refused either way.
        c._c.push_sparse_tensor(t, [4], np.ones((1, 2), np.float32))
        c.clock()
        c.wait()
        np.testing.assert_array_equal(c.pull_sparse(t, [4]), [[0.5 - 4, 0.5 - 5]])
        c._c.push_tensor(d, torch.ones(2, 3))
        with pytest.raises(leash.InvalidArgumentError, match="dense"):
            c._c.push_sparse_tensor(d, [1], np.zeros((1, 3), np.float32))
        with pytest.raises(leash.WrongShapeError):
            c._c.push_sparse_tensor(t, [1, 2], np.zeros((1, 2), np.float32))
        with pytest.raises(leash.InvalidArgumentError, match="leash.Table"):
            c._c.push_sparse_tensor("emb", [1], np.zeros((1, 2), np.float32))
        c.clock()
        c.wait()


def test_sparse_argument_errors(cluster):
    with leash.Client(cluster.servers) as c:
        dense = c.create_table("dense", (4, 2), optimizer="sgd", lr=1.0)
        with pytest.raises(leash.InvalidArgumentError, match="dense"):
            c.pull_sparse(dense, [1, 2])
        with pytest.raises(leash.InvalidArgumentError, match="dense"):
            c.push_sparse(dense, [1], np.zeros((1, 2), np.float32))
        with pytest.raises(leash.InvalidArgumentError):
            c.create_table("s", sparse=True)  # no dim
        with pytest.raises(leash.InvalidArgumentError):
            c.create_table("s", sparse=True, dim=0)
        with pytest.raises(leash.InvalidArgumentError):
            c.create_table("s", sparse=True, shape=(3, 4))
        with pytest.raises(leash.InvalidArgumentError):
            c.create_table("d", (3, 4), dim=4)  # dim without sparse
        with pytest.raises(leash.InvalidArgumentError):
            c.create_table("s", sparse=True, dim=4, admit_after=-1)


def test_dense_calls_on_a_sparse_table_raise(cluster):
    with leash.Client(cluster.servers) as c:
        t = sparse_or_skip(c, "emb", 3)
        with pytest.raises(leash.InvalidArgumentError, match="sparse"):
            c.pull(t)
        with pytest.raises(leash.InvalidArgumentError, match="sparse"):
            c.push(t, np.zeros(3, np.float32))
        with pytest.raises(leash.WrongShapeError):
            c.push_sparse(t, [1, 2], np.zeros((2, 4), np.float32))
        with pytest.raises(leash.WrongDTypeError):
            c.pull_sparse(t, [0.5])
        np.testing.assert_array_equal(c.pull_sparse(t, []), np.zeros((0, 3), np.float32))


def test_sparse_embedding_trains_the_rows_a_batch_looked_up(cluster):
    torch = pytest.importorskip("torch")
    import leash.torch

    with leash.Client(cluster.servers, staleness=0) as c:
        sparse_or_skip(c, "probe", 2)

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = leash.torch.SparseEmbedding(c, "ids", 3, optimizer="sgd", lr=1.0,
                                                       init="zeros")

            def forward(self, ids):
                return self.emb(ids).sum()

        model = Model()
        params = leash.torch.Parameters(c, model)
        ids = torch.tensor([[5, 9], [5, 2 ** 40]])
        params.pull()
        model(ids).backward()
        params.push()
        rows = c.pull_sparse(model.emb.table, [5, 9, 2 ** 40, 77])
        # d(sum)/d(row) is 1 per lookup: id 5 was looked up twice.
        np.testing.assert_array_equal(rows, -np.array([[2] * 3, [1] * 3, [1] * 3, [0] * 3],
                                                      np.float32))

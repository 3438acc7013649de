#!/usr/bin/python3
"""The click-through model of leash-worker --model ctr (worker/src/ctr.cc) in PyTorch,
trained on MovieLens-100k by any number of Python workers against a Leash cluster: the
8 categorical fields' values are hashed to 64-bit keys of one sparse table
(leash.torch.SparseEmbedding, rows made on the shards at their first pull), each field's
bag of rows is averaged, and an MLP on top gives one logit; every optimizer (Adagrad by
default) runs on the shards. Start the shards, then run this once per worker:

    build/server/leash-server --shard=0 --num-shards=1 --bind=tcp://127.0.0.1:7000 &
    python3 examples/torch_movielens.py --servers=tcp://127.0.0.1:7000 --name=w0 &
    python3 examples/torch_movielens.py --servers=tcp://127.0.0.1:7000 --name=w1

Against replicated shards (leash-server --replicas R --etcd URL --job NAME), give
--etcd URL --job NAME instead of --servers: the primaries are followed on a failover.
Data: ml-100k.{inter,user,item} as scripts/fetch-movielens.sh installs them (--data), the
split and fields of worker/src/movielens.cc and bench/torch_ctr.py: label rating >= 4; per
user the latest 20% of the ratings are the test set; fields user, item, age bucket, gender,
occupation, zip prefix, release decade, genres (a bag). Each worker prints the test AUC and
log loss when it has trained its share of an epoch (one JSON line per epoch) and writes a
summary with --metrics-out. Needs the leash package on the path
(scripts/install-python.sh, or PYTHONPATH=build/python). Ctrl-C or SIGTERM: the worker
leaves the job and exits.
"""
import argparse
import collections
import hashlib
import json
import os
import sys
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

DEFAULT_DIR = "/usr/local/share/leash/datasets/ml-100k"
FIELDS = 8
BAG = 6  # the longest bag (genres); shorter bags are padded, the padding masked out
AGES = [(18, "<18"), (25, "18-24"), (35, "25-34"), (45, "35-44"), (50, "45-49"),
        (56, "50-55")]


def age_bucket(age):
    for limit, name in AGES:
        if age < limit:
            return name
    return "56+"


def decade(year):
    return f"{int(year) // 10 * 10}s" if year.isdigit() and int(year) >= 1000 else "unknown"


def read(path, cols):
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\r\n").split("\t")
        idx = [header.index(c) for c in cols]
        for line in f:
            line = line.rstrip("\r\n")
            if line:
                parts = line.split("\t")
                yield [parts[i] for i in idx]


def feature_key(field, token):
    """The 64-bit key of a field's value (as int64): the same on every worker."""
    digest = hashlib.blake2b(f"{field}\x1f{token}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def load(data_dir):
    """(train, test), each (keys int64 [n, FIELDS, BAG], mask float32 [n, FIELDS, BAG],
    labels float32 [n])."""
    users = {}
    for uid, age, gender, occ, zipc in read(os.path.join(data_dir, "ml-100k.user"),
                                            ["user_id:token", "age:token", "gender:token",
                                             "occupation:token", "zip_code:token"]):
        users[uid] = [[(2, age_bucket(int(age)))], [(3, gender)], [(4, occ)], [(5, zipc[:2])]]
    items = {}
    for iid, year, genres in read(os.path.join(data_dir, "ml-100k.item"),
                                  ["item_id:token", "release_year:token", "class:token_seq"]):
        g = [t for t in genres.split(" ") if t][:BAG] or ["unknown"]
        items[iid] = [[(6, decade(year))], [(7, t) for t in g]]
    ratings = [(uid, iid, float(ts), 1.0 if float(rating) >= 4 else 0.0)
               for uid, iid, rating, ts in read(os.path.join(data_dir, "ml-100k.inter"),
                                                ["user_id:token", "item_id:token",
                                                 "rating:float", "timestamp:float"])]
    by_user = collections.defaultdict(list)
    for n, r in enumerate(ratings):
        by_user[r[0]].append(n)
    is_test = [False] * len(ratings)
    for lines in by_user.values():
        lines = sorted(lines, key=lambda n: ratings[n][2])  # stable: ties in file order
        for n in lines[len(lines) - len(lines) // 5:]:
            is_test[n] = True
    keys_of = {}
    sets = {False: ([], [], []), True: ([], [], [])}
    for n, (uid, iid, _, label) in enumerate(ratings):
        bags = [[(0, uid)], [(1, iid)]] + users[uid] + items[iid]
        k = np.zeros((FIELDS, BAG), np.int64)
        m = np.zeros((FIELDS, BAG), np.float32)
        for f, bag in enumerate(bags):
            for j, value in enumerate(bag):
                key = keys_of.get(value)
                if key is None:
                    key = keys_of[value] = feature_key(*value)
                k[f, j] = key
                m[f, j] = 1.0 / len(bag)  # the mean of the bag's rows
        out = sets[is_test[n]]
        out[0].append(k)
        out[1].append(m)
        out[2].append(label)
    return [(torch.from_numpy(np.stack(k)), torch.from_numpy(np.stack(m)),
             torch.tensor(y, dtype=torch.float32)) for k, m, y in (sets[False], sets[True])]


class Ctr(nn.Module):
    """Per-field mean of the bag's embedding rows, concatenated, Linear + ReLU layers to one
    logit. `embedding` maps int64 keys [...] to rows [..., dim]."""

    def __init__(self, embedding, dim, hidden):
        super().__init__()
        self.embedding = embedding
        widths = [FIELDS * dim] + hidden + [1]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, keys, mask):
        rows = self.embedding(keys)  # [n, FIELDS, BAG, dim]
        x = (rows * mask.unsqueeze(-1)).sum(2).flatten(1)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x.view(-1)


def auc(scores, labels):
    """Area under the ROC curve (ties count one half), as worker/src/ctr.cc computes it."""
    order = np.argsort(scores, kind="mergesort")
    s, y = scores[order], labels[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        ranks[i:j] = (i + j - 1) / 2.0 + 1
        i = j
    pos = y.sum()
    neg = len(y) - pos
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))


@torch.no_grad()
def evaluate(model, test, batch=4096):
    model.eval()
    keys, mask, labels = test
    logits = torch.cat([model(keys[i:i + batch], mask[i:i + batch])
                        for i in range(0, len(labels), batch)])
    model.train()
    return {"test_auc": auc(logits.numpy(), labels.numpy()),
            "test_loss": F.binary_cross_entropy_with_logits(logits, labels).item()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", default=os.environ.get("LEASH_SERVERS", ""))
    ap.add_argument("--etcd", default=os.environ.get("LEASH_ETCD", ""),
                    help="replicated shards, instead of --servers: etcd's client URL(s); the "
                    "primaries are found there and followed on a failover")
    ap.add_argument("--job", default=os.environ.get("LEASH_JOB") or "leash",
                    help="with --etcd: the job's name in etcd (the servers' --job)")
    ap.add_argument("--name", default=None)
    ap.add_argument("--data", default=DEFAULT_DIR)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--chunk-size", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--hidden", default="64,32")
    ap.add_argument("--lr", type=float, default=0.05, help="Adagrad rate of the dense layers")
    ap.add_argument("--sparse-lr", type=float, default=0.05, help="... of the embeddings")
    ap.add_argument("--scale", type=float, default=0.05, help="embeddings uniform in +-scale")
    ap.add_argument("--staleness", type=int, default=1)
    ap.add_argument("--table", default="ctr/emb", help="the sparse table's name (prefix of "
                    "the dense ones)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--metrics-out", default="")
    a = ap.parse_args()
    if not a.servers and not a.etcd:
        sys.exit("--servers (or LEASH_SERVERS) is needed, or --etcd for replicated shards")
    import leash
    import leash.torch

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    train, test = load(a.data)
    n = len(train[2])
    order = torch.from_numpy(np.random.default_rng(a.seed).permutation(n))  # same everywhere
    hidden = [int(h) for h in a.hidden.split(",") if h]
    epochs = []
    steps = samples = 0
    start = time.perf_counter()
    with leash.Client(a.servers or None, etcd=a.etcd or None, job=a.job if a.etcd else None,
                      name=a.name, staleness=a.staleness) as client:
        emb = leash.torch.SparseEmbedding(client, a.table, a.dim, optimizer="adagrad",
                                          lr=a.sparse_lr, init="uniform", init_scale=a.scale,
                                          epsilon=1e-8, seed=a.seed)
        model = Ctr(emb, a.dim, hidden)
        params = leash.torch.Parameters(client, model, optimizer="adagrad", lr=a.lr,
                                        epsilon=1e-8, prefix=a.table.rsplit("/", 1)[0] + "/",
                                        seed=a.seed)
        plan = dict(num_samples=n, chunk_size=a.chunk_size, epochs=a.epochs, seed=a.seed)

        def report(epoch):
            params.sync()
            r = {"epoch": epoch, **evaluate(model, test), "samples": samples, "steps": steps,
                 "seconds": time.perf_counter() - start, "name": client.name}
            epochs.append(r)
            print(json.dumps(r), flush=True)

        epoch = None
        for chunk in params.chunks(plan):
            if epoch is not None and chunk.epoch != epoch:
                report(epoch)  # this worker's share of the epoch is trained
            epoch = chunk.epoch
            for i in range(chunk.begin, chunk.end, a.batch):
                idx = order[i:min(i + a.batch, chunk.end)]
                params.pull()
                logits = model(train[0][idx], train[1][idx])
                F.binary_cross_entropy_with_logits(logits, train[2][idx]).backward()
                params.push()
                steps, samples = steps + 1, samples + len(idx)
        report(epoch if epoch is not None else 0)
        name = client.name
        # What the transport did (shared memory or socket, resends, rejoins): what a run
        # that trained worse than usual is checked against.
        counters = {**client.counters(), "rejoins": client.rejoins}
    summary = {"system": "leash", "model": "ctr", "name": name, "train_samples": n,
               "test_samples": len(test[2]), "samples": samples, "steps": steps,
               "seconds": time.perf_counter() - start, "epochs": epochs,
               "test_auc": epochs[-1]["test_auc"], "test_loss": epochs[-1]["test_loss"],
               "counters": counters}
    if a.metrics_out:
        with open(a.metrics_out, "w") as f:
            json.dump(summary, f)


if __name__ == "__main__":
    main()

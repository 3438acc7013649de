#!/usr/bin/python3
"""The PyTorch twin of leash-worker --model ctr: the same click-through model on the same
MovieLens-100k split, fields and initialization (docs/models.md), for bench/ctr_bench.py.

Data: ml-100k.{inter,user,item} (scripts/fetch-movielens.sh). Label rating >= 4; per
user, the latest 20% of the ratings (by timestamp, ties in file order) are the test set.
Fields: user, item, age bucket, gender, occupation, zip prefix (2 chars), release decade,
genres (a bag, mean of its embeddings). Model: one sparse nn.EmbeddingBag (mode mean,
bags padded to 6 with a padding row) over every field's values, concatenated, Linear + ReLU layers (--hidden) to one logit,
BCE-with-logits; embeddings uniform in +-scale, weights normal(0, sqrt(2 / fan_in)),
biases 0; Adagrad (sparse rows and dense, --lr / --sparse-lr). 1 thread.
Prints one JSON object per epoch, then a summary:
  {"epoch", "test_auc", "test_loss", "test_accuracy", "train_loss", "train_seconds",
   "samples_per_second"}
Run under /usr/bin/python3 (Debian python3-torch).
"""
import argparse
import collections
import json
import os
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

DEFAULT_DIR = "/usr/local/share/leash/datasets/ml-100k"
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


def load(data_dir):
    """Returns (train, test): lists of (bags, label), bags = 8 lists of (field, token)."""
    users = {}
    for uid, age, gender, occ, zipc in read(os.path.join(data_dir, "ml-100k.user"),
                                            ["user_id:token", "age:token", "gender:token",
                                             "occupation:token", "zip_code:token"]):
        users[uid] = [(2, age_bucket(int(age))), (3, gender), (4, occ), (5, zipc[:2])]
    items = {}
    for iid, year, genres in read(os.path.join(data_dir, "ml-100k.item"),
                                  ["item_id:token", "release_year:token", "class:token_seq"]):
        g = [t for t in genres.split(" ") if t][:6] or ["unknown"]
        items[iid] = ((6, decade(year)), [(7, t) for t in g])
    ratings = []
    for uid, iid, rating, ts in read(os.path.join(data_dir, "ml-100k.inter"),
                                     ["user_id:token", "item_id:token", "rating:float",
                                      "timestamp:float"]):
        ratings.append((uid, iid, float(ts), 1 if float(rating) >= 4 else 0))
    by_user = collections.defaultdict(list)
    for n, r in enumerate(ratings):
        by_user[r[0]].append(n)
    is_test = [False] * len(ratings)
    for lines in by_user.values():
        lines = sorted(lines, key=lambda n: ratings[n][2])  # stable: ties in file order
        for n in lines[len(lines) - len(lines) // 5:]:
            is_test[n] = True
    train, test = [], []
    for n, (uid, iid, _, label) in enumerate(ratings):
        u = users[uid]
        year, genres = items[iid]
        bags = [[(0, uid)], [(1, iid)], [u[0]], [u[1]], [u[2]], [u[3]], [year], genres]
        (test if is_test[n] else train).append((bags, label))
    return train, test


BAG = 6  # the longest bag (genres); shorter bags are padded with the padding row


def encode(samples, vocab):
    """Key indices (n x 8 fields x BAG, padded with -1 until the vocabulary is complete)
    and labels."""
    keys = torch.full((len(samples), 8, BAG), -1, dtype=torch.int64)
    for n, (bags, _) in enumerate(samples):
        for f, bag in enumerate(bags):
            for j, key in enumerate(bag):
                keys[n, f, j] = vocab.setdefault(key, len(vocab))
    return keys, torch.tensor([label for _, label in samples], dtype=torch.float32)


class Ctr(nn.Module):
    """Row `keys` of the embedding bag is the padding row (excluded from the means)."""

    def __init__(self, keys, dim, hidden, scale, fields=8):
        super().__init__()
        self.fields, self.dim = fields, dim
        self.emb = nn.EmbeddingBag(keys + 1, dim, mode="mean", sparse=True, padding_idx=keys)
        with torch.no_grad():
            nn.init.uniform_(self.emb.weight, -scale, scale)
            self.emb.weight[keys].zero_()
        widths = [fields * dim] + hidden + [1]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        for layer in self.layers:
            nn.init.normal_(layer.weight, 0.0, (2.0 / layer.in_features) ** 0.5)
            nn.init.zeros_(layer.bias)

    def forward(self, keys):
        n = keys.shape[0]
        x = self.emb(keys.view(n * self.fields, BAG)).view(n, self.fields * self.dim)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x.view(n)


def auc(scores, labels):
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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=DEFAULT_DIR)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hidden", default="64,32")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--sparse-lr", type=float, default=0)
    p.add_argument("--scale", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="also write the result as JSON here")
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    train_s, test_s = load(a.data)
    vocab = {}
    train, test = encode(train_s, vocab), encode(test_s, vocab)
    for keys, _ in (train, test):
        keys[keys < 0] = len(vocab)  # the padding row
    hidden = [int(h) for h in a.hidden.split(",") if h]
    model = Ctr(len(vocab), a.dim, hidden, a.scale)
    opt = torch.optim.Adagrad([
        {"params": [model.emb.weight], "lr": a.sparse_lr or a.lr},
        {"params": list(model.layers.parameters()), "lr": a.lr}], lr=a.lr, eps=1e-8)
    n = len(train[1])
    rng = np.random.default_rng(a.seed)
    epochs = []
    for epoch in range(1, a.epochs + 1):
        order = torch.from_numpy(rng.permutation(n))
        t0 = time.perf_counter()
        loss_sum = 0.0
        model.train()
        for i in range(0, n, a.batch):
            idx = order[i:i + a.batch]
            opt.zero_grad(set_to_none=True)
            loss = F.binary_cross_entropy_with_logits(model(train[0][idx]), train[1][idx])
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(idx)
        secs = time.perf_counter() - t0
        with torch.no_grad():
            z = model(test[0])
            test_loss = F.binary_cross_entropy_with_logits(z, test[1]).item()
            acc = ((z >= 0).float() == test[1]).float().mean().item()
            test_auc = auc(z.numpy(), test[1].numpy().astype(np.int64))
        r = {"epoch": epoch, "test_auc": test_auc, "test_loss": test_loss, "test_accuracy": acc,
             "train_loss": loss_sum / n, "train_seconds": secs, "samples_per_second": n / secs}
        epochs.append(r)
        print(json.dumps(r), flush=True)
    result = {"system": "pytorch", "model": "ctr", "train_samples": n,
              "test_samples": len(test[1]), "keys": len(vocab), "epochs": epochs,
              "samples_per_second": sum(e["samples_per_second"] for e in epochs) / len(epochs)}
    print(json.dumps(result), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

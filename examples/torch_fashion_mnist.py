#!/usr/bin/python3
"""A PyTorch CNN (or MLP) trained on Fashion-MNIST by any number of Python workers
against a Leash cluster, with the optimizer on the shards. Start the shards, then run this
once per worker (each leases its own chunks of every epoch):

    build/server/leash-server --shard=0 --num-shards=1 --bind=tcp://127.0.0.1:7000 &
    python3 examples/torch_fashion_mnist.py --servers=tcp://127.0.0.1:7000 --name=w0 &
    python3 examples/torch_fashion_mnist.py --servers=tcp://127.0.0.1:7000 --name=w1

Against replicated shards (leash-server --replicas R --etcd URL --job NAME), give
--etcd URL --job NAME instead of --servers: the primaries are followed on a failover.
--local trains the same loop with no server (torch.optim, same optimizer), the baseline.
Data: the IDX files of Debian's dataset-fashion-mnist (--data). Needs the leash package on
the path (scripts/install-python.sh, or PYTHONPATH=build/python). Writes a JSON summary
with --metrics-out. SIGTERM or Ctrl-C: the worker leaves the job and exits.
"""
import argparse
import faulthandler
import gzip
import json
import os
import signal
import struct
import sys
import time


def _threads_from_argv(default=1):
    for i, arg in enumerate(sys.argv):
        if arg.startswith("--threads="):
            return int(arg.split("=", 1)[1])
        if arg == "--threads" and i + 1 < len(sys.argv):
            return int(sys.argv[i + 1])
    return default


# --threads bounds the system BLAS too: Debian's torch calls OpenBLAS, whose own thread pool
# (one thread per core) torch.set_num_threads() does not bound; it reads this when it loads.
# With both cores in its GEMMs the loop takes the core Leash's threads need (0.76x against
# 0.96x of the plain loop in bench/python_leash.py on 2 cores).
if _threads_from_argv() > 0:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(_threads_from_argv()))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

MEAN, STDDEV = 0.2860, 0.3530  # as worker/src/dataset.cc normalizes


def load_fashion_mnist(data_dir, train, limit=0):
    """(images float32 [n, 784] normalized, labels int64 [n]) from the IDX (gz) files."""
    prefix = "train" if train else "t10k"

    def read(name, ndims):
        path = os.path.join(data_dir, name)
        opener = gzip.open if os.path.exists(path + ".gz") else open
        with opener(path + ".gz" if opener is gzip.open else path, "rb") as f:
            data = f.read()
        dims = struct.unpack(">" + "I" * ndims, data[4:4 + 4 * ndims])
        return np.frombuffer(data, np.uint8, offset=4 + 4 * ndims).reshape(dims)

    x = read(f"{prefix}-images-idx3-ubyte", 3).reshape(-1, 784)
    y = read(f"{prefix}-labels-idx1-ubyte", 1)
    if limit:
        x, y = x[:limit], y[:limit]
    x = (x.astype(np.float32) / 255.0 - MEAN) / STDDEV
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def make_model(name):
    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                             nn.Linear(128, 10))
    return nn.Sequential(nn.Unflatten(1, (1, 28, 28)),
                         nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


@torch.no_grad()
def accuracy(model, x, y, chunk=1000):
    model.eval()
    correct = sum((model(x[i:i + chunk]).argmax(1) == y[i:i + chunk]).sum().item()
                  for i in range(0, x.shape[0], chunk))
    model.train()
    return correct / max(1, x.shape[0])


def batches(chunk_begin, chunk_end, batch, seed):
    """The chunk's samples in a seeded random order, in batches."""
    order = np.random.default_rng(seed).permutation(np.arange(chunk_begin, chunk_end))
    for i in range(0, len(order), batch):
        yield torch.from_numpy(order[i:i + batch])


def local_chunks(num_samples, chunk_size, epochs, seed):
    """The baseline's chunks: every chunk of every epoch, in a seeded order."""
    n = (num_samples + chunk_size - 1) // chunk_size
    for e in range(epochs):
        for c in np.random.default_rng(seed * 1000 + e).permutation(n):
            yield e, int(c), int(c) * chunk_size, min(num_samples, (int(c) + 1) * chunk_size)


def he_init(model):
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            nn.init.zeros_(m.bias)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", default=os.environ.get("LEASH_SERVERS", ""))
    ap.add_argument("--etcd", default=os.environ.get("LEASH_ETCD", ""),
                    help="replicated shards, instead of --servers: etcd's client URL(s); the "
                    "primaries are found there and followed on a failover")
    ap.add_argument("--job", default=os.environ.get("LEASH_JOB") or "leash",
                    help="with --etcd: the job's name in etcd (the servers' --job)")
    ap.add_argument("--name", default=None)
    ap.add_argument("--curve-keys", default=os.environ.get("LEASH_CURVE_KEYS") or None,
                    help="CURVE keys directory (leashctl keygen), as leash-worker's")
    ap.add_argument("--curve-client", default=os.environ.get("LEASH_CURVE_CLIENT", "client"),
                    help="the key pair in --curve-keys to use (DIR/NAME.key)")
    ap.add_argument("--local", action="store_true", help="no server: torch.optim, the baseline")
    ap.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    ap.add_argument("--optimizer", choices=["sgd", "momentum", "adam", "adagrad"], default="adam")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--accumulate", type=int, default=1)
    ap.add_argument("--chunk-size", type=int, default=1024)
    ap.add_argument("--staleness", type=int, default=1)
    ap.add_argument("--wire-dtype", choices=["fp32", "fp16", "bf16"], default="fp32")
    ap.add_argument("--train-limit", type=int, default=0)
    ap.add_argument("--test-limit", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch and OpenBLAS threads (0: their defaults)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-push-in-backward", action="store_true",
                    help="push the gradients after backward() (leash.torch push_in_backward)")
    ap.add_argument("--step-delay", type=float, default=0.0, help="sleep per step (tests)")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--metrics-out", default="")
    a = ap.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1: every thread's stack

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    x, y = load_fashion_mnist(a.data, True, a.train_limit)
    tx, ty = load_fashion_mnist(a.data, False, a.test_limit)
    model = make_model(a.model)
    plan = dict(num_samples=x.shape[0], chunk_size=a.chunk_size, epochs=a.epochs, seed=a.seed)
    steps, samples = 0, 0
    start = time.perf_counter()
    summary = {"model": a.model, "epochs": a.epochs, "batch": a.batch}

    def train_step(idx):
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        if a.step_delay:
            time.sleep(a.step_delay)

    if a.local:
        he_init(model)
        opt = {"sgd": lambda p: torch.optim.SGD(p, lr=a.lr),
               "momentum": lambda p: torch.optim.SGD(p, lr=a.lr, momentum=0.9),
               "adam": lambda p: torch.optim.Adam(p, lr=a.lr),
               "adagrad": lambda p: torch.optim.Adagrad(p, lr=a.lr, eps=1e-8)}[a.optimizer](
                   model.parameters())
        for epoch, chunk, begin, end in local_chunks(**plan):
            for idx in batches(begin, end, a.batch, a.seed * 7919 + chunk + 1000 * epoch):
                opt.zero_grad(set_to_none=True)
                train_step(idx)
                opt.step()
                steps, samples = steps + 1, samples + len(idx)
        train_secs = time.perf_counter() - start
        acc = accuracy(model, tx, ty)
        summary["system"] = "local"
    else:
        import leash
        import leash.torch
        if not a.servers and not a.etcd:
            sys.exit("--servers (or LEASH_SERVERS) is needed, or --etcd for replicated shards, "
                     "or --local")
        with leash.Client(a.servers or None, etcd=a.etcd or None,
                          job=a.job if a.etcd else None, name=a.name, staleness=a.staleness,
                          wire_dtype=a.wire_dtype, curve_keys=a.curve_keys,
                          curve_client=a.curve_client) as client:
            # The lines Leash adds to a PyTorch loop: tables for the parameters, a pull
            # before the step, a push after backward(); the data comes in leased chunks.
            params = leash.torch.Parameters(client, model, optimizer=a.optimizer, lr=a.lr,
                                            accumulate=a.accumulate, prefix=a.model + "/",
                                            seed=a.seed,
                                            push_in_backward=False if a.no_push_in_backward else None)
            for chunk in params.chunks(plan):
                for idx in batches(chunk.begin, chunk.end, a.batch,
                                   a.seed * 7919 + chunk.index + 1000 * chunk.epoch):
                    params.pull()
                    train_step(idx)
                    params.push()
                    steps, samples = steps + 1, samples + len(idx)
                print(f"[{client.name}] epoch {chunk.epoch} chunk {chunk.index}: "
                      f"{chunk.chunks_done}/{chunk.num_chunks} chunks of the epoch done, "
                      f"clock {client.current_clock}", flush=True)
            train_secs = time.perf_counter() - start
            params.sync()
            acc = accuracy(model, tx, ty)
            summary["system"] = "leash"
            summary["name"] = client.name
            summary["rejoins"] = client.rejoins
            summary["binding"] = client.binding_times()
    secs = time.perf_counter() - start
    summary.update({"steps": steps, "samples": samples, "seconds": secs,
                    "train_seconds": train_secs,
                    "samples_per_second": samples / train_secs if train_secs > 0 else 0.0,
                    "test_accuracy": acc})
    print(f"[{summary.get('name', 'local')}] trained {samples} samples in {steps} steps, "
          f"{secs:.1f} s; test accuracy {acc:.4f}", flush=True)
    if a.metrics_out:
        with open(a.metrics_out, "w") as f:
            json.dump(summary, f)


if __name__ == "__main__":
    main()

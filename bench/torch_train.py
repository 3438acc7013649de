#!/usr/bin/python3
"""PyTorch peers of the Leash training benchmark on Fashion-MNIST: the same MLP or CNN,
optimizer, batch and normalization as leash-worker (bench/common), 1 intra-op thread
per process.

  --mode single   one process
  --mode ddp      DistributedDataParallel, gloo backend, N processes on loopback, each
                  training its 1/N of every epoch's shuffled order (batch 64 each);
                  --delay-factors makes ranks stragglers
  --mode hogwild  N processes updating one shared-memory model without locks (each with
                  its own optimizer state), as in the PyTorch Hogwild example

After each epoch the test accuracy is measured (rank 0 / the parent) and recorded with
the elapsed wall time since training started (evaluations included, as leash-worker
counts them). Writes one JSON object to --out:
  {"system", "model", "epochs": [{"epoch", "samples", "train_seconds",
   "samples_per_second", "test_accuracy", "elapsed_seconds"}], "samples_per_second"}
Run under /usr/bin/python3 (Debian python3-torch on OpenBLAS).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# common first: it sets OPENBLAS_CORETYPE where needed, before numpy or torch loads OpenBLAS
# (numpy links it too: imported first, it fixed the pre-AVX kernels for the whole process).
import common  # noqa: E402,F401
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from common import fmnist  # noqa: E402
from common.torch_models import accuracy, make_model, make_optimizer  # noqa: E402


_INTEROP_SET = False


def one_thread():
    """1 intra-op and 1 inter-op thread (the inter-op count can be set once per process,
    before any parallel work; forked children inherit it)."""
    global _INTEROP_SET
    torch.set_num_threads(1)
    if not _INTEROP_SET:
        torch.set_num_interop_threads(1)
        _INTEROP_SET = True


def train_indices(order, model, opt, x, y, batch, delay_factor=1.0):
    """One pass over `order`. delay_factor > 1: after each step's forward and backward
    (under DDP the backward holds the gradient all-reduce), sleep (factor - 1) x their time,
    as leash-worker --step-delay-factor does: a straggler computing that many times slower."""
    for i in range(0, len(order), batch):
        idx = order[i:i + batch]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        if delay_factor > 1:
            time.sleep((delay_factor - 1) * (time.perf_counter() - t0))
        opt.step()


def epoch_order(seed, epoch, n):
    return torch.from_numpy(np.random.default_rng(seed * 1000 + epoch).permutation(n))


def run_single(a, x, y, tx, ty):
    one_thread()
    torch.manual_seed(a.seed)
    model = make_model(a.model)
    opt = make_optimizer(a.model, model.parameters())
    epochs = []
    start = time.perf_counter()
    for e in range(a.epochs):
        t0 = time.perf_counter()
        train_indices(epoch_order(a.seed, e, x.shape[0]), model, opt, x, y, a.batch)
        secs = time.perf_counter() - t0
        acc = accuracy(model, tx, ty)
        epochs.append({"epoch": e + 1, "samples": x.shape[0], "train_seconds": secs,
                       "samples_per_second": x.shape[0] / secs, "test_accuracy": acc,
                       "elapsed_seconds": time.perf_counter() - start})
        print(f"[torch single] epoch {e + 1}: {x.shape[0] / secs:.0f} samples/s, test accuracy {acc:.4f}", flush=True)
    return epochs


def ddp_worker(rank, a, port, x, y, tx, ty, out_q):
    one_thread()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.procs)
    torch.manual_seed(a.seed)
    model = torch.nn.parallel.DistributedDataParallel(make_model(a.model))
    opt = make_optimizer(a.model, model.parameters())
    epochs = []
    dist.barrier()
    start = time.perf_counter()
    for e in range(a.epochs):
        t0 = time.perf_counter()
        order = epoch_order(a.seed, e, x.shape[0])
        # equal shares so every rank makes the same number of steps (DDP needs it)
        share = x.shape[0] // a.procs
        train_indices(order[rank * share:(rank + 1) * share], model, opt, x, y, a.batch,
                      a.delay_factors[rank] if rank < len(a.delay_factors) else 1.0)
        dist.barrier()
        secs = time.perf_counter() - t0
        if rank == 0:
            acc = accuracy(model.module, tx, ty)
            epochs.append({"epoch": e + 1, "samples": share * a.procs, "train_seconds": secs,
                           "samples_per_second": share * a.procs / secs, "test_accuracy": acc,
                           "elapsed_seconds": time.perf_counter() - start})
            print(f"[torch ddp x{a.procs}] epoch {e + 1}: {share * a.procs / secs:.0f} samples/s, "
                  f"test accuracy {acc:.4f}", flush=True)
        dist.barrier()
    if rank == 0:
        out_q.put(epochs)
    dist.destroy_process_group()


def run_ddp(a, x, y, tx, ty):
    from common.util import free_port
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=ddp_worker, args=(r, a, port, x, y, tx, ty, q)) for r in range(a.procs)]
    for p in procs:
        p.start()
    epochs = q.get(timeout=3600)
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a DDP process exited with code {p.exitcode}")
    return epochs


def hogwild_worker(rank, a, model, x, y, barrier):
    one_thread()
    opt = make_optimizer(a.model, model.parameters())  # per-process optimizer state, shared weights
    share = x.shape[0] // a.procs
    for e in range(a.epochs):
        order = epoch_order(a.seed, e, x.shape[0])
        train_indices(order[rank * share:(rank + 1) * share], model, opt, x, y, a.batch)
        barrier.wait()  # epoch trained
        barrier.wait()  # parent evaluated


def run_hogwild(a, x, y, tx, ty):
    one_thread()
    torch.manual_seed(a.seed)
    model = make_model(a.model)
    model.share_memory()
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(a.procs + 1)
    procs = [ctx.Process(target=hogwild_worker, args=(r, a, model, x, y, barrier)) for r in range(a.procs)]
    start = time.perf_counter()
    for p in procs:
        p.start()
    epochs = []
    share = x.shape[0] // a.procs
    for e in range(a.epochs):
        t0 = time.perf_counter()
        barrier.wait(timeout=3600)
        secs = time.perf_counter() - t0
        acc = accuracy(model, tx, ty)
        epochs.append({"epoch": e + 1, "samples": share * a.procs, "train_seconds": secs,
                       "samples_per_second": share * a.procs / secs, "test_accuracy": acc,
                       "elapsed_seconds": time.perf_counter() - start})
        print(f"[torch hogwild x{a.procs}] epoch {e + 1}: {share * a.procs / secs:.0f} samples/s, "
              f"test accuracy {acc:.4f}", flush=True)
        barrier.wait(timeout=3600)
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a Hogwild process exited with code {p.exitcode}")
    return epochs


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["single", "ddp", "hogwild"], required=True)
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--procs", type=int, default=2, help="processes of ddp and hogwild")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--delay-factors", default="",
                   help="ddp: comma-separated step delay factor per rank (e.g. 1,1,3: rank 2 computes 3x "
                        "slower, as leash-worker --step-delay-factor)")
    p.add_argument("--train-limit", type=int, default=0)
    p.add_argument("--test-limit", type=int, default=0)
    p.add_argument("--data", default=fmnist.DEFAULT_DIR)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    a.delay_factors = [float(f) for f in a.delay_factors.split(",") if f]
    one_thread()
    x, y = (torch.from_numpy(v) for v in fmnist.load(True, a.data, a.train_limit))
    tx, ty = (torch.from_numpy(v) for v in fmnist.load(False, a.data, a.test_limit))
    run = {"single": run_single, "ddp": run_ddp, "hogwild": run_hogwild}[a.mode]
    epochs = run(a, x, y, tx, ty)
    samples = sum(e["samples"] for e in epochs)
    seconds = sum(e["train_seconds"] for e in epochs)
    result = {"system": f"torch-{a.mode}", "model": a.model, "batch": a.batch, "threads_per_process": 1,
              "processes": 1 if a.mode == "single" else a.procs, "torch": torch.__version__,
              "epochs": epochs, "samples_per_second": samples / seconds}
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

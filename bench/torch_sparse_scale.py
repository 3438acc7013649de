#!/usr/bin/env python3
"""The PyTorch peer of bench/sparse_scale.py's workload: one process, one embedding table of
--keys rows x --dim held in memory (nn.Embedding with sparse gradients), sparse Adagrad,
batches of 26 fields x --batch keys drawn from the same per-field Zipf law as
leash-bench-sparse (ranks scattered over each field's rows, as Leash hashes them), each
batch a forward (lookup), a backward (gradient 0.001 x sign(value), as the Leash driver
pushes) and an optimizer step. Prints one JSON line: keys/s over the timed steps (key
sampling excluded) and the unique fraction. Run by sparse_scale.py with /usr/bin/python3
(Debian's torch). Not thread-safe; one thread by default, like the issue's reference."""
import argparse
import json
import time

import numpy as np
import torch


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--keys", type=int, default=20_000_000)
    p.add_argument("--fields", type=int, default=26)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--alpha", type=float, default=1.1)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    vocab = args.keys // args.fields
    rows = vocab * args.fields
    t0 = time.perf_counter()
    emb = torch.nn.Embedding(rows, args.dim, sparse=True)
    torch.nn.init.uniform_(emb.weight, -0.05, 0.05)
    opt = torch.optim.Adagrad(emb.parameters(), lr=0.05)
    setup_s = time.perf_counter() - t0
    # Zipf over ranks 1..vocab by inverting the exact CDF; rank r of field f sits at row
    # f * vocab + (r * an odd constant mod vocab): hot rows scattered, not adjacent.
    cdf = np.cumsum(np.arange(1, vocab + 1, dtype=np.float64) ** -args.alpha)
    cdf /= cdf[-1]
    rng = np.random.default_rng(args.seed)
    base = (np.arange(args.fields, dtype=np.int64) * vocab).repeat(args.batch)
    scatter = 2654435761 % vocab or 1
    n = args.fields * args.batch
    steps, step_s, unique = 0, 0.0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        ranks = np.searchsorted(cdf, rng.random(n)).astype(np.int64)
        idx = torch.from_numpy(base + (ranks * scatter) % vocab)
        if steps % 16 == 0:
            unique += int(torch.unique(idx).numel())
        t = time.perf_counter()
        out = emb(idx)
        out.backward(out.detach().sign() * 0.001)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step_s += time.perf_counter() - t
        steps += 1
    print(json.dumps({"mode": "pytorch", "alpha": args.alpha, "batches": steps, "keys": steps * n,
                      "seconds": step_s, "keys_per_s": steps * n / step_s, "setup_seconds": setup_s,
                      "threads": args.threads,
                      "unique_fraction": unique / (((steps + 15) // 16) * n)}))


if __name__ == "__main__":
    main()

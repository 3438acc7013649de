#!/usr/bin/python3
"""What a 16-bit wire costs or saves: leash-worker MLP, 1 worker + 1 shard at staleness 1,
with --wire-dtype fp32, bf16 and fp16, over shared memory (the default on one host) and over
the loopback socket (--no-shm, as between hosts). Every configuration once per round, the
order rotating from round to round (machine noise hits all alike); samples/s over training
time, and each 16-bit row as a ratio to fp32 over the same path in the same round. Also
the final test accuracy, to show the narrower wire trains as well.

    /usr/bin/python3 bench/wire_dtype.py [--rounds 3] [--epochs 2] [--out bench/results]

Writes wire_dtype.json and wire_dtype.md.
"""
import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import leash as L  # noqa: E402
from common.util import median, write_json  # noqa: E402

DTYPES = ("fp32", "bf16", "fp16")
PATHS = {"shm": (), "socket": ("--no-shm",)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    a = p.parse_args()
    if a.rounds < 1 or a.epochs < 1:
        p.error("--rounds and --epochs must be at least 1")
    configs = [(path, dt) for path in PATHS for dt in DTYPES]
    rounds = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            got = {}
            for path, dt in order:
                before = os.getloadavg()[0]
                res = L.run_cluster(a.build, tmp, "mlp", a.epochs, f"r{r}-{path}-{dt}", staleness=1,
                                    worker_args=("--wire-dtype", dt) + PATHS[path])
                acc = res["curve"][-1]["test_accuracy"] if res["curve"] else None
                got[f"{path} {dt}"] = {"samples_per_second": res["samples_per_second"], "test_accuracy": acc,
                                       "load_before": before,
                                       "bytes_sent_per_iteration": res["metrics"][0].get("bytes_sent_per_iteration")}
                print(f"[{time.strftime('%H:%M:%S')}] round {r + 1}/{a.rounds} {path} {dt}: "
                      f"{res['samples_per_second']:.0f} samples/s, accuracy {acc}, load {before}", flush=True)
            rounds.append(got)
    summary = {}
    for path in PATHS:
        for dt in DTYPES:
            k = f"{path} {dt}"
            ratios = [g[k]["samples_per_second"] / g[f"{path} fp32"]["samples_per_second"] for g in rounds]
            summary[k] = {"samples_per_second": [g[k]["samples_per_second"] for g in rounds],
                          "vs_fp32_per_round": ratios, "median_vs_fp32": median(ratios),
                          "test_accuracy": [g[k]["test_accuracy"] for g in rounds],
                          "bytes_sent_per_iteration": rounds[0][k]["bytes_sent_per_iteration"],
                          "load": [g[k]["load_before"] for g in rounds]}
    res = {"benchmark": "wire_dtype", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "nproc": os.cpu_count(),
           "rounds": rounds, "summary": summary, "epochs": a.epochs, "seconds": time.monotonic() - t0}
    os.makedirs(a.out, exist_ok=True)
    write_json(os.path.join(a.out, "wire_dtype.json"), res)
    md = ["# 16-bit wires against fp32", "",
          f"`bench/wire_dtype.py`, {res['time']}, {res['nproc']} cores (shared; load before each run below), "
          f"{a.rounds} rounds, order rotating; leash-worker MLP 1 worker + 1 shard, staleness 1, batch 64, "
          f"{a.epochs} epochs of Fashion-MNIST. Raw numbers: `wire_dtype.json`.", "",
          "| path | wire | samples/s per round | vs fp32 per round | median vs fp32 | bytes pushed per iteration | "
          "test accuracy per round | load |", "|---|---|---|---|---|---|---|---|"]
    for k, s in summary.items():
        path, dt = k.split()
        md.append(f"| {path} | {dt} | {', '.join(f'{x:.0f}' for x in s['samples_per_second'])} | "
                  f"{', '.join(f'{x:.2f}' for x in s['vs_fp32_per_round'])} | **{s['median_vs_fp32']:.2f}x** | "
                  f"{(s['bytes_sent_per_iteration'] or 0) / 1e3:.0f} KB | "
                  f"{', '.join('—' if x is None else f'{x * 100:.1f}%' for x in s['test_accuracy'])} | "
                  f"{', '.join('—' if x is None else f'{x:.1f}' for x in s['load'])} |")
    with open(os.path.join(a.out, "wire_dtype.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The cost of CURVE (encryption and authentication on every ZeroMQ connection),
interleaved in the same run: with and without keys,
- the MLP with 1 worker + 1 shard over the socket (--no-shm; samples/s, staleness 1,
  20000 Fashion-MNIST samples by default),
- leash-bench-pushpull's push rows with 1 shard and 1 worker: 4 KB (p50, 1 in flight)
  and 4 MB (MB/s, 8 in flight).
Rounds alternate the order (plain keys, keys plain, ...); medians and keys/plain ratios,
with the load average around each run (other work on the machine moves these figures).

Usage: bench/curve_cost.py [--build build] [--rounds 5] [--epochs 1] [--seconds 1] [--out bench/results]
Writes curve_cost.json and curve_cost.md under --out.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.leash import RunError, _bin, run_cluster  # noqa: E402
from common.util import write_json  # noqa: E402


def pushpull(build, tmp, seconds, keys):
    out = tempfile.mkdtemp(dir=tmp)
    cmd = [_bin(build, "bench", "leash-bench-pushpull"), "--server-bin", _bin(build, "server", "leash-server"),
           "--sizes", "1024,1048576", "--seconds", str(seconds), "--out", out]
    if keys:
        cmd += ["--curve-keys", keys]
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=900)
    if p.returncode != 0:
        raise RunError(f"leash-bench-pushpull exited {p.returncode}: {p.stderr[-2000:]}")
    with open(os.path.join(out, "pushpull.json")) as f:
        samples = json.load(f)["samples"]

    def cell(floats, inflight):
        for s in samples:
            if (s["system"], s["op"], s["floats"], s["shards"], s["inflight"]) == ("leash", "push", floats, 1, inflight):
                return s
        raise RunError(f"no leash push row for {floats} floats, {inflight} in flight")

    return {"push_4KB_p50_us": cell(1024, 1)["p50_us"], "push_4MB_8_inflight_mb_per_s": cell(1048576, 8)["mb_per_s"]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--train-limit", type=int, default=20000, help="training samples of the MLP job")
    p.add_argument("--seconds", type=float, default=1.0, help="duration of each push measurement")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="leash-curve-")
    keys = os.path.join(tmp, "keys")
    subprocess.run([_bin(args.build, "tools", "leashctl"), "keygen", keys, "--server", "--client", "w0,bench"],
                   check=True, stdout=subprocess.DEVNULL)
    rows = {"plain": [], "curve": []}
    try:
        for r in range(args.rounds):
            order = ["plain", "curve"] if r % 2 == 0 else ["curve", "plain"]
            for which in order:
                k = keys if which == "curve" else None
                load_before = os.getloadavg()[0]
                worker_args = ["--no-shm"] + (["--curve-keys", k, "--curve-client", "w0"] if k else [])
                server_args = ["--no-sync"] + (["--curve-keys", k] if k else [])
                train = run_cluster(args.build, tmp, "mlp", args.epochs, f"{which}{r}", staleness=1, no_eval=True,
                                    train_limit=args.train_limit,
                                    worker_args=worker_args, server_args=server_args)
                got = {"train_samples_per_second": train["samples_per_second"]}
                got.update(pushpull(args.build, tmp, args.seconds, k))
                got.update({"load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)})
                rows[which].append(got)
                print(f"[round {r + 1}/{args.rounds}] {which}: {got}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    keys_of = ["train_samples_per_second", "push_4KB_p50_us", "push_4MB_8_inflight_mb_per_s"]
    med = {w: {k: statistics.median(x[k] for x in rows[w]) for k in keys_of} for w in rows}
    ratio = {k: med["curve"][k] / med["plain"][k] for k in keys_of}
    result = {"benchmark": "curve_cost", "cores": os.cpu_count(), "epochs": args.epochs, "rounds": rows,
              "median": med, "curve_over_plain": ratio}
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "curve_cost.json"), result)
    with open(os.path.join(args.out, "curve_cost.md"), "w") as f:
        f.write(f"# The cost of CURVE\n\n1 worker + 1 shard over the socket (--no-shm), with and without keys; "
                f"{args.rounds} interleaved rounds on {os.cpu_count()} cores.\n\n"
                "| round | keys | MLP samples/s | 4 KB push p50 us | 4 MB push MB/s (8 in flight) | load average |\n"
                "|---|---|---|---|---|---|\n")
        for r in range(args.rounds):
            for w in ("plain", "curve"):
                x = rows[w][r]
                f.write(f"| {r + 1} | {'CURVE' if w == 'curve' else 'none'} | {x['train_samples_per_second']:.0f} | "
                        f"{x['push_4KB_p50_us']:.1f} | {x['push_4MB_8_inflight_mb_per_s']:.0f} | "
                        f"{x['load_before']}-{x['load_after']} |\n")
        for w in ("plain", "curve"):
            f.write(f"| median | {'CURVE' if w == 'curve' else 'none'} | {med[w]['train_samples_per_second']:.0f} | "
                    f"{med[w]['push_4KB_p50_us']:.1f} | {med[w]['push_4MB_8_inflight_mb_per_s']:.0f} | |\n")
        f.write(f"| CURVE / none | | **{ratio['train_samples_per_second']:.2f}** | **{ratio['push_4KB_p50_us']:.2f}** | "
                f"**{ratio['push_4MB_8_inflight_mb_per_s']:.2f}** | |\n")
    print(json.dumps({"median": med, "curve_over_plain": ratio}))


if __name__ == "__main__":
    main()

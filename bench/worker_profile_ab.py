#!/usr/bin/env python3
"""A/B of two Leash builds by where the worker's training thread spends its CPU, for changes
too small for samples/s to show on a noisy machine.

Each round runs one leash-worker (MLP, 1 BLAS thread) against one leash-server shard on
loopback, as bench/ps_cost.py does, under `perf record` (a sampling clock; no hardware
counters needed), once with each build, alternating which goes first. From each profile it
takes the training thread (the thread with most samples) and reports its samples per sample
of the GEMM kernel (OpenBLAS's `sgemm_kernel_*`, the same work in A and B): a machine that
runs slower for a while slows both alike, so the ratio keeps what the change did to the
rest of the thread. Also per run: the samples of the symbols that differ most, the client's
I/O thread, and the worker's own samples/s and compute time per iteration.

--a-flags and --b-flags add leash-worker flags to one side only: --a BUILD --b BUILD with
--a-flags=--pull-in-place=false compares a flag's two settings in one build.
Writes NAME.json and NAME.md under --out.
Usage: bench/worker_profile_ab.py --a BUILD_A --b BUILD_B [--rounds 4] [--epochs 2]
                                  [--staleness 1] [--worker-flags '--no-shm']
                                  [--a-flags F] [--b-flags F]
                                  [--name worker_profile_ab] [--out DIR]
"""
import argparse
import collections
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ps_cost import free_port  # noqa: E402

ROW = re.compile(r"\s*([\d.]+)%\s+(\d+)\s+(\d+):\S+\s+\[(.)\]\s+(.*)")


def profile(perf_data):
    """Samples per thread and, for each thread, per symbol."""
    out = subprocess.run(["perf", "report", "-i", perf_data, "--sort", "pid,sym", "--stdio", "-n"],
                         capture_output=True, text=True, check=True).stdout
    threads = collections.defaultdict(collections.Counter)
    for line in out.splitlines():
        m = ROW.match(line)
        if m:
            sym = m.group(5).strip() if m.group(4) == "." else "[kernel] " + m.group(5).strip()
            threads[int(m.group(3))][sym] += int(m.group(2))
    return threads


def run(build, args, tmp, tag, side_flags=""):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    data = os.path.join(tmp, tag)
    shard = subprocess.Popen([os.path.join(build, "server", "leash-server"), "--bind", endpoint,
                              "--data-dir", data + ".shard", "--checkpoint-interval", "0",
                              "--log-level", "warn"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        metrics = data + ".json"
        perf_data = data + ".perf"
        subprocess.run(["perf", "record", "-q", "-F", str(args.frequency), "-o", perf_data, "--",
                        os.path.join(build, "worker", "leash-worker"), "--servers", endpoint,
                        "--epochs", str(args.epochs), "--batch", "64", "--threads", "1",
                        "--staleness", str(args.staleness), "--log-every", "0", "--no-eval",
                        "--metrics-out", metrics] + args.worker_flags.split() + side_flags.split(),
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
    finally:
        shard.terminate()
        shard.wait(timeout=60)
    with open(metrics) as f:
        m = json.load(f)
    threads = profile(perf_data)
    os.remove(perf_data)
    ranked = sorted(threads, key=lambda t: -sum(threads[t].values()))
    main = threads[ranked[0]]
    io = threads[ranked[1]] if len(ranked) > 1 else collections.Counter()
    kernel = sum(n for s, n in main.items() if s.startswith("sgemm_kernel"))
    if kernel == 0:
        raise RuntimeError(f"no sgemm_kernel samples in the training thread of {build}'s worker")
    it = m["iterations"]
    samples = sum(e["samples"] for e in m["epochs"])
    seconds = sum(e["train_seconds"] for e in m["epochs"])
    return {
        "samples_per_second": samples / seconds,
        "compute_us": m["compute_seconds"] / it * 1e6,
        "iterations": it,
        "pushes_from_shared_memory": m.get("pushes_from_shared_memory", 0),
        "training_thread_samples": sum(main.values()),
        "gemm_kernel_samples": kernel,
        "training_thread_per_gemm": sum(main.values()) / kernel,
        "io_thread_per_gemm": sum(io.values()) / kernel,
        "symbols_per_gemm": {s: n / kernel for s, n in main.most_common(40)},
        "io_symbols_per_gemm": {s: n / kernel for s, n in io.most_common(40)},
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="build directory of A (the reference)")
    p.add_argument("--b", required=True, help="build directory of B (the change)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--staleness", type=int, default=1)
    p.add_argument("--frequency", type=int, default=4999, help="perf record's samples per second")
    p.add_argument("--worker-flags", default="", help="more leash-worker flags for both builds, e.g. '--no-shm'")
    p.add_argument("--a-flags", default="", help="more leash-worker flags for A only")
    p.add_argument("--b-flags", default="", help="more leash-worker flags for B only")
    p.add_argument("--name", default="worker_profile_ab")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    if shutil.which("perf") is None:
        sys.exit("perf not found: apt-get install linux-perf")
    for b in (args.a, args.b):
        for exe in ("server/leash-server", "worker/leash-worker"):
            if not os.path.exists(os.path.join(b, exe)):
                sys.exit(f"{os.path.join(b, exe)} not found: build it first (bash scripts/build.sh)")
    runs = {"a": [], "b": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ("a", "b") if r % 2 == 0 else ("b", "a")
            for who in order:
                res = run(getattr(args, who), args, tmp, f"{who}{r}", getattr(args, f"{who}_flags"))
                runs[who].append(res)
                print(f"[round {r + 1}/{args.rounds}] {who}: training thread {res['training_thread_per_gemm']:.3f} "
                      f"samples per GEMM sample, {res['samples_per_second']:.0f} samples/s", flush=True)
    figures = ["training_thread_per_gemm", "io_thread_per_gemm", "samples_per_second", "compute_us"]
    med = {who: {f: statistics.median(x[f] for x in runs[who]) for f in figures} for who in runs}

    def moved_most(key):
        syms = set()
        for who in runs:
            for x in runs[who]:
                syms.update(x.get(key, {}))
        med_of = {who: {s: statistics.median(x.get(key, {}).get(s, 0) for x in runs[who]) for s in syms}
                  for who in runs}
        top = sorted(syms, key=lambda s: -abs(med_of["b"][s] - med_of["a"][s]))[:8]
        return {s: {"a": med_of["a"][s], "b": med_of["b"][s]} for s in top}

    moved = moved_most("symbols_per_gemm")
    io_moved = moved_most("io_symbols_per_gemm")
    result = {"benchmark": "worker_profile_ab", "a": args.a, "b": args.b, "a_flags": args.a_flags,
              "b_flags": args.b_flags, "rounds": args.rounds,
              "epochs": args.epochs, "staleness": args.staleness, "nproc": os.cpu_count(),
              "time": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg_at_end": os.getloadavg()[0],
              "worker_flags": args.worker_flags, "runs": runs, "medians": med,
              "symbols_moved": moved, "io_symbols_moved": io_moved}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, args.name + ".json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = [f"# Worker profile A/B: {args.a} (A) against {args.b} (B)", "",
             f"{args.rounds} rounds (A B, then B A, ...), MLP 1 worker + 1 shard at staleness "
             f"{args.staleness}, {args.epochs} epoch(s) each"
             + (f", worker flags `{args.worker_flags}`" if args.worker_flags else "")
             + "".join(f", {w.upper()} alone `{f}`" for w, f in (("a", args.a_flags), ("b", args.b_flags)) if f)
             + f", under `perf record -F {args.frequency}`; "
             f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end. Samples are "
             "counted per sample of the GEMM kernel in the same thread (the same work in A and B).", "",
             "| figure | A median | B median | B/A | A runs | B runs |", "|---|---|---|---|---|---|"]
    names = {"training_thread_per_gemm": "training thread, samples per GEMM sample",
             "io_thread_per_gemm": "client I/O thread, samples per GEMM sample",
             "samples_per_second": "samples/s", "compute_us": "compute per iteration (µs)"}
    for f in figures:
        a, b = med["a"][f], med["b"][f]
        lines.append(f"| {names[f]} | {a:.4g} | {b:.4g} | {b / a:.3f} | "
                     + ", ".join(f"{x[f]:.4g}" for x in runs["a"]) + " | "
                     + ", ".join(f"{x[f]:.4g}" for x in runs["b"]) + " |")
    for title, table in (("The training thread's", moved), ("The client I/O thread's", io_moved)):
        lines += ["", f"{title} symbols that moved most (median samples per GEMM sample):", "",
                  "| symbol | A | B |", "|---|---|---|"]
        for s, v in table.items():
            lines.append(f"| `{s}` | {v['a']:.4f} | {v['b']:.4f} |")
    with open(os.path.join(args.out, args.name + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

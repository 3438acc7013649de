#!/usr/bin/env python3
"""Cost of the parameter server: one leash-worker against one leash-server shard on
loopback, against the same worker training the same MLP in local mode (no server), in
the same run. Runs are interleaved (local, cluster, local, ...) so machine noise hits
both alike; the ratio of medians is reported.

Writes bench/results/ps_cost.json and bench/results/ps_cost.md.
Usage: bench/ps_cost.py [--build build] [--repeats 3] [--epochs 1] [--batch 64] [--staleness 0]
"""
import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common.util import iteration_breakdown  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The suite's MLP flags (bench/common/leash.py MODEL_FLAGS["mlp"]), with --suite-flags.
SUITE_FLAGS = ["--device", "cpu", "--model", "mlp", "--optimizer", "momentum", "--momentum", "0.9", "--lr", "0.01"]


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_worker(args, build, out_json, extra):
    cmd = [os.path.join(build, "worker", "leash-worker"), "--epochs", str(args.epochs), "--batch", str(args.batch),
           "--threads", "1", "--log-every", "0", "--metrics-out", out_json] + \
        (SUITE_FLAGS if args.suite_flags else []) + extra + getattr(args, "worker_flags", [])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
    with open(out_json) as f:
        m = json.load(f)
    epochs = m["epochs"]
    samples = sum(e["samples"] for e in epochs)
    seconds = sum(e["train_seconds"] for e in epochs)
    return {"samples_per_second": samples / seconds, "test_accuracy": epochs[-1]["test_accuracy"],
            "samples": samples, "per_iteration_us": breakdown(m)}


# Where an iteration of the worker goes, in µs: the whole step, forward and backward, the
# pull (in local mode the read of the values; in the cluster the wait for the bound, and
# loading the values) and the push (local mode: the update; the cluster: encoding and
# sending the gradient and the clock); the rest is batch loading and accounting.
PARTS = ("step", "compute", "pull", "push", "rest")


def breakdown(m):
    b = iteration_breakdown(m)
    b["rest"] = b["step"] - b["compute"] - b["pull"] - b["push"]
    return {k: b[k] for k in PARTS}


def median_breakdown(runs):
    return {k: statistics.median(r["per_iteration_us"][k] for r in runs) for k in PARTS}


def run_cluster(args, build, tmp, i):
    endpoint = (f"ipc://{os.path.join(tmp, f'shard{i}.sock')}" if args.ipc
                else f"tcp://127.0.0.1:{free_port()}")
    shard = subprocess.Popen([os.path.join(build, "server", "leash-server"), "--bind", endpoint,
                              "--data-dir", os.path.join(tmp, f"shard{i}"), "--checkpoint-interval", "0"] +
                             (["--log-level", "warn"] if args.suite_flags else []),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return run_worker(args, build, os.path.join(tmp, f"cluster{i}.json"),
                          ["--servers", endpoint, "--staleness", str(args.staleness)] +
                          (["--no-shm"] if args.no_shm else []))
    finally:
        shard.terminate()
        shard.wait(timeout=60)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--staleness", type=int, default=0)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--suite-flags", action="store_true",
                   help="the suite's worker and shard flags (--device cpu, momentum 0.9, lr 0.01; shard --log-level "
                        "warn) instead of the worker's defaults (plain SGD)")
    p.add_argument("--name", default="ps_cost", help="file name of the results (.json, .md) in --out")
    p.add_argument("--no-shm", action="store_true", help="the cluster's worker sends everything through the socket")
    p.add_argument("--worker-flags", default="",
                   help="more leash-worker flags for every run, local and cluster "
                        "(--worker-flags=--pull-in-place=false)")
    p.add_argument("--ipc", action="store_true",
                   help="the shard binds a Unix-domain socket (ipc://) instead of loopback TCP")
    args = p.parse_args()
    args.worker_flags = args.worker_flags.split()
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="leash-bench-")
    local, cluster = [], []
    try:
        for i in range(args.repeats):
            print(f"[{i + 1}/{args.repeats}] local mode ...", flush=True)
            c0 = children_cpu()
            local.append(run_worker(args, args.build, os.path.join(tmp, f"local{i}.json"), ["--local"]))
            local[-1]["cpu_seconds"] = children_cpu() - c0
            print(f"    {local[-1]['samples_per_second']:.0f} samples/s", flush=True)
            print(f"[{i + 1}/{args.repeats}] 1 worker + 1 shard ...", flush=True)
            c0 = children_cpu()
            cluster.append(run_cluster(args, args.build, tmp, i))
            cluster[-1]["cpu_seconds"] = children_cpu() - c0  # worker and shard, start to end
            print(f"    {cluster[-1]['samples_per_second']:.0f} samples/s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med_local = statistics.median(r["samples_per_second"] for r in local)
    med_cluster = statistics.median(r["samples_per_second"] for r in cluster)
    result = {
        "benchmark": "ps_cost",
        "model": "MLP 784-256-128-10",
        "batch": args.batch, "epochs": args.epochs, "staleness": args.staleness, "blas_threads": 1,
        "nproc": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "loadavg_at_end": os.getloadavg()[0], "suite_flags": args.suite_flags, "no_shm": args.no_shm, "ipc": args.ipc,
        "worker_flags": args.worker_flags,
        "cpu_seconds_cluster_over_local": statistics.median(c["cpu_seconds"] for c in cluster) /
        statistics.median(r["cpu_seconds"] for r in local),
        "local": local, "cluster": cluster,
        "median_local_samples_per_second": med_local,
        "median_cluster_samples_per_second": med_cluster,
        "cluster_over_local": med_cluster / med_local,
        "median_per_iteration_us": {"local": median_breakdown(local), "cluster": median_breakdown(cluster)},
    }
    with open(os.path.join(args.out, args.name + ".json"), "w") as f:
        json.dump(result, f, indent=2)
    runs_local = ", ".join(f"{r['samples_per_second']:.0f}" for r in local)
    runs_cluster = ", ".join(f"{r['samples_per_second']:.0f}" for r in cluster)
    cpu_local = ", ".join(f"{r['cpu_seconds']:.1f}" for r in local)
    cpu_cluster = ", ".join(f"{r['cpu_seconds']:.1f}" for r in cluster)
    flags_text = ("the suite's (momentum, --device cpu, shard --log-level warn)" if args.suite_flags
                  else "the worker's defaults") + (", no shared memory" if args.no_shm else "") + \
        (f", worker flags `{' '.join(args.worker_flags)}`" if args.worker_flags else "")
    md = (f"# Parameter-server cost\n\nMLP 784-256-128-10, batch {args.batch}, {args.epochs} epoch(s), 1 BLAS thread, "
          f"staleness {args.staleness}, {args.repeats} interleaved runs each, {os.cpu_count()} cores.\n\n"
          f"| mode | median samples/s | runs |\n|---|---|---|\n"
          f"| local (no server) | {med_local:.0f} | {runs_local} |\n"
          f"| 1 worker + 1 shard | {med_cluster:.0f} | {runs_cluster} |\n\n"
          f"cluster / local = **{med_cluster / med_local:.3f}**\n\n"
          f"CPU seconds per run (all processes, start to end): local {cpu_local}; cluster {cpu_cluster} "
          f"(median ratio {result['cpu_seconds_cluster_over_local']:.2f}x); load average at the end "
          f"{result['loadavg_at_end']:.1f}. Flags: {flags_text}.\n\n"
          "The worker's iteration (medians, µs): the pull is the read of the values in local mode, and in "
          "the cluster the wait for the bound and loading the values; the push is the update in local mode, "
          "and in the cluster encoding and sending the gradient and the clock; the rest is batch loading "
          "and accounting.\n\n| mode | " + " | ".join(PARTS) + " |\n" + "|---" * (len(PARTS) + 1) + "|\n" +
          "".join(f"| {name} | " + " | ".join(f"{result['median_per_iteration_us'][key][k]:.0f}" for k in PARTS) +
                  " |\n" for name, key in (("local", "local"), ("1 worker + 1 shard", "cluster"))))
    with open(os.path.join(args.out, args.name + ".md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    sys.exit(main())

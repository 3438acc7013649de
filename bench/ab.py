#!/usr/bin/env python3
"""A/B of two Leash builds, interleaved: does build B run as fast as build A?

For every round, in the order A B B A (then B A A B, ...), it measures with each build:
- the MLP in local mode and with 1 worker + 1 shard at staleness 1 (samples/s, 1 epoch),
- leash-bench-pushpull's 4 KB push p50 (1 in flight) and 4 MB push throughput (8 in
  flight), 1 shard and 1 worker.
With --replicated it measures a shard of 2 replicas instead (etcd, as bench/replication.py
starts them), each build on a cluster of its own: the 4 KB push p50 (1 in flight) and the
1 MB and 4 MB push throughput (8 in flight) against the primary, with the primary's, the
backup's and the pushing client's CPU time per push.
It reports per-round figures, medians, and B/A ratios of the medians, as JSON and Markdown.

Usage: bench/ab.py --a BUILD_A --b BUILD_B [--rounds 3] [--epochs 1] [--replicated | --no-shm]
                   [--suite-flags] [--a-worker-flags F] [--b-worker-flags F]
                   [--a-server-flags F] [--b-server-flags F] [--name ab] [--out DIR]
Each BUILD is a CMake build directory (server/leash-server, worker/leash-worker,
bench/leash-bench-pushpull inside). --a-worker-flags and --b-worker-flags add leash-worker
flags to one side's MLP runs (local and 1+1; not the push rows): --a B --b B with
--a-worker-flags=--pull-in-place=false compares a flag's two settings in one build.
--a-server-flags and --b-server-flags do the same for the replicas of --replicated:
--a B --b B --replicated --a-server-flags=--backups-read-in-place=false.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ps_cost  # noqa: E402  (run_worker, run_cluster: the same runs the suite makes)


def pushpull(build, tmp, seconds):
    out = tempfile.mkdtemp(dir=tmp)
    p = subprocess.run([os.path.join(build, "bench", "leash-bench-pushpull"), "--server-bin",
                        os.path.join(build, "server", "leash-server"), "--sizes", "1024,1048576",
                        "--seconds", str(seconds), "--out", out],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"leash-bench-pushpull of {build} exited {p.returncode}: {p.stderr[-2000:]}")
    with open(os.path.join(out, "pushpull.json")) as f:
        samples = json.load(f)["samples"]

    def cell(floats, inflight):
        for s in samples:
            if (s["system"], s["op"], s["floats"], s["shards"], s["inflight"]) == ("leash", "push", floats, 1,
                                                                                   inflight):
                return s
        raise RuntimeError(f"no leash push row for {floats} floats, {inflight} in flight")

    return {"push_4KB_p50_us": cell(1024, 1)["p50_us"], "push_4MB_8_inflight_mb_per_s": cell(1048576, 8)["mb_per_s"]}


def replicated(build, tmp, tag, seconds, server_flags=()):
    """The R=2 push rows of one build (its replicas started with `server_flags` added), on a
    cluster of its own (bench/replication.py's)."""
    import replication as R  # noqa: E402  (etcd and the replicas, started and stopped there)
    c = dict(R.config(False), pushpull_seconds=seconds)
    cl = R.Replicated(build, tmp, tag, c["ttl"], server_flags)
    got = {}
    try:
        p = cl.primary()
        primary, backup = cl.procs[p["replica"]], cl.procs[1 - p["replica"]]
        for name, floats, inflight in (("4KB", 1024, 1), ("1MB", 262144, 8), ("4MB", 1048576, 8)):
            cpu0 = [R.cpu_seconds(x.pid) for x in (primary, backup)]
            # The client follows the directory as leash-worker does (and reaches an answering backup).
            r = R.pushpull(build, c, tmp, f"{tag}-{name}", ["--etcd", cl.etcd.url, "--job", cl.job], floats,
                           inflight, seconds)
            cpu1 = [R.cpu_seconds(x.pid) for x in (primary, backup)]
            if name == "4KB":
                got["push_4KB_p50_us"] = r["p50_us"]
            else:
                got[f"push_{name}_8_inflight_mb_per_s"] = r["mb_per_s"]
            for who, a, b in zip(("primary", "backup"), cpu0, cpu1):
                got[f"push_{name}_{who}_cpu_us"] = (b - a) / r["ops"] * 1e6
            got[f"push_{name}_client_cpu_us"] = r["client_cpu_us_per_iteration"]
    finally:
        cl.stop()
    return got


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="build directory of A (the reference)")
    p.add_argument("--b", required=True, help="build directory of B (the change)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seconds", type=float, default=1.0, help="duration of each push/pull measurement")
    p.add_argument("--replicated", action="store_true",
                   help="measure R=2's push rows and the replicas' CPU per push instead")
    p.add_argument("--no-shm", action="store_true",
                   help="the MLP's 1+1 cluster sends everything through the socket (as between hosts)")
    p.add_argument("--suite-flags", action="store_true",
                   help="the MLP with the suite's flags (momentum 0.9, lr 0.01) instead of the worker's defaults")
    p.add_argument("--a-worker-flags", default="", help="more leash-worker flags for A's MLP runs")
    p.add_argument("--b-worker-flags", default="", help="more leash-worker flags for B's MLP runs")
    p.add_argument("--a-server-flags", default="",
                   help="with --replicated: more leash-server flags for A's replicas")
    p.add_argument("--b-server-flags", default="",
                   help="with --replicated: more leash-server flags for B's replicas")
    p.add_argument("--name", default="ab", help="writes NAME.json and NAME.md (default ab)")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    for b in (args.a, args.b):
        for exe in ("server/leash-server", "worker/leash-worker", "bench/leash-bench-pushpull"):
            if not os.access(os.path.join(b, exe), os.X_OK):
                sys.exit(f"ab.py: {os.path.join(b, exe)} is missing: build it first (scripts/build.sh)")
    os.makedirs(args.out, exist_ok=True)
    run_args = {w: argparse.Namespace(epochs=args.epochs, batch=args.batch, staleness=1, suite_flags=args.suite_flags,
                                      no_shm=args.no_shm, ipc=False,
                                      worker_flags=getattr(args, f"{w}_worker_flags").split())
                for w in ("a", "b")}
    tmp = tempfile.mkdtemp(prefix="leash-ab-")
    rows = {"a": [], "b": []}
    try:
        for r in range(args.rounds):
            order = ["a", "b", "b", "a"] if r % 2 == 0 else ["b", "a", "a", "b"]
            got = {"a": {}, "b": {}}
            for k, which in enumerate(order):
                build = getattr(args, which)
                if args.replicated:
                    if not got[which]:  # one cluster per build per round
                        got[which] = replicated(build, tmp, f"r{r}{k}", args.seconds,
                                                getattr(args, f"{which}_server_flags").split())
                        print(f"[round {r + 1}/{args.rounds}] {which}: {got[which]}", flush=True)
                    continue
                if "local" not in got[which]:
                    got[which]["local"] = ps_cost.run_worker(run_args[which], build,
                                                             os.path.join(tmp, f"l{r}{k}.json"),
                                                             ["--local"])["samples_per_second"]
                    got[which]["cluster"] = ps_cost.run_cluster(run_args[which], build, tmp,
                                                                f"{r}{k}")["samples_per_second"]
                else:
                    got[which].update(pushpull(build, tmp, args.seconds))
                print(f"[round {r + 1}/{args.rounds}] {which}: {got[which]}", flush=True)
            for which in ("a", "b"):
                if not args.replicated:
                    got[which]["cluster_over_local"] = got[which]["cluster"] / got[which]["local"]
                rows[which].append(got[which])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    keys = ["local", "cluster", "cluster_over_local", "push_4KB_p50_us", "push_4MB_8_inflight_mb_per_s"]
    if args.replicated:
        keys = list(rows["a"][0])
    med = {w: {k: statistics.median(x[k] for x in rows[w]) for k in keys} for w in ("a", "b")}
    ratio = {k: med["b"][k] / med["a"][k] for k in keys}
    result = {"benchmark": "ab", "replicated": args.replicated, "a": os.path.abspath(args.a),
              "b": os.path.abspath(args.b), "a_worker_flags": args.a_worker_flags,
              "b_worker_flags": args.b_worker_flags, "a_server_flags": args.a_server_flags,
              "b_server_flags": args.b_server_flags, "rounds": args.rounds, "epochs": args.epochs, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "nproc": os.cpu_count(), "runs": rows, "median": med, "b_over_a": ratio}
    with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
        json.dump(result, f, indent=2)
    names = {"local": "MLP local samples/s", "cluster": "MLP 1+1 s=1 samples/s",
             "cluster_over_local": "MLP 1+1 s=1 / local", "push_4KB_p50_us": "4 KB push p50 (us, lower is better)",
             "push_4MB_8_inflight_mb_per_s": "4 MB push, 8 in flight (MB/s)",
             "push_1MB_8_inflight_mb_per_s": "1 MB push, 8 in flight (MB/s)"}
    for size in ("4KB", "1MB", "4MB"):
        for who in ("primary", "backup", "client"):
            names[f"push_{size}_{who}_cpu_us"] = f"{size} push: the {who}'s CPU per push (us)"
    what = ("R=2 (2 replicas and etcd; the push rows against the primary)"
            + "".join(f", {w.upper()}'s replicas with `{f}`" for w, f in
                      (("a", args.a_server_flags), ("b", args.b_server_flags)) if f)
            if args.replicated else
            f"{args.epochs} epoch(s) each" + (", the cluster over the socket only (--no-shm)" if args.no_shm else "")
            + (", the suite's worker flags" if args.suite_flags else "")
            + "".join(f", {w.upper()}'s workers with `{f}`" for w, f in
                      (("a", args.a_worker_flags), ("b", args.b_worker_flags)) if f))
    md = [f"# A/B: {args.a} (A) against {args.b} (B)", "",
          f"{args.rounds} rounds, interleaved (A B B A, then B A A B), {what}, "
          f"{os.cpu_count()} cores.", "", "| figure | A median | B median | B/A | A runs | B runs |",
          "|---|---|---|---|---|---|"]
    for k in keys:
        ra = ", ".join(f"{x[k]:.3g}" for x in rows["a"])
        rb = ", ".join(f"{x[k]:.3g}" for x in rows["b"])
        md.append(f"| {names[k]} | {med['a'][k]:.4g} | {med['b'][k]:.4g} | {ratio[k]:.3f} | {ra} | {rb} |")
    text = "\n".join(md) + "\n"
    with open(os.path.join(args.out, f"{args.name}.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())

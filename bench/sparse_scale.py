#!/usr/bin/env python3
"""Sparse tables at scale (issue 14): one leash-server shard holding a sparse table of
--keys rows (26 categorical fields, power-law keys; bench/sparse_scale.cc drives it) with
the table all in memory, against the same table with a memory budget of 1/4 of its size,
in the same run, measurement rounds interleaved.

"Larger than memory" is made real twice over: the budgeted shard runs in a memory cgroup
(v1 memory.limit_in_bytes, or v2 memory.max: both count page cache) whose limit is the
budget plus the overhead docs/sparse.md states, and its RocksDB tier reads with O_DIRECT
(--sparse-direct-reads), so the kernel's page cache cannot hold the table for it.

Reports per alpha: pull + push keys/s of both shards and their ratio, the memory tier's hit
rate, the shard's resident memory (VmRSS, peak VmHWM) and the cgroup's peak against the
budget, bytes on disk per row, and the snapshot time and bytes written when 1% of the rows
changed (against the first, full snapshot). Writes sparse_scale.json, sparse_scale.md and
sparse_scale.png (when matplotlib is there) into --out. Needs root for the cgroup (without
it the run goes on with direct reads only and says so). Every process is started here and
stopped by its handle. Not thread-safe."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.util import free_port, stop, write_json, now  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20


def proc_status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return None


def proc_write_bytes(pid):
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return None


def du(path):
    """Bytes on disk under `path`, each file counted once however many hard links it has
    (a checkpoint shares its table files with the live store)."""
    total, seen = 0, set()
    for d, _, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(d, name))
            except FileNotFoundError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


class Cgroup:
    """A memory cgroup the budgeted shard runs in (v1 or v2), or None without root."""

    def __init__(self, name, limit):
        self.path = None
        for base, limit_file, peak_file in (("/sys/fs/cgroup/memory", "memory.limit_in_bytes",
                                             "memory.max_usage_in_bytes"),
                                            ("/sys/fs/cgroup", "memory.max", "memory.peak")):
            if not os.path.exists(os.path.join(base, limit_file if base.endswith("memory") else
                                               "cgroup.controllers")):
                continue
            path = os.path.join(base, name)
            try:
                os.makedirs(path, exist_ok=True)
                with open(os.path.join(path, limit_file), "w") as f:
                    f.write(str(limit))
            except OSError as e:
                print(f"sparse_scale: no memory cgroup at {path} ({e})", file=sys.stderr)
                continue
            self.path, self.peak_file, self.limit = path, peak_file, limit
            self.kind = "v1 memory.limit_in_bytes" if base.endswith("memory") else "v2 memory.max"
            break

    def join(self):  # in the child, before exec
        if self.path:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

    def peak(self):
        try:
            with open(os.path.join(self.path, self.peak_file)) as f:
                return int(f.read().split()[0])
        except (OSError, TypeError, ValueError):
            return None

    def remove(self):
        if self.path:
            try:
                os.rmdir(self.path)
            except OSError:
                pass


class Server:
    def __init__(self, build, tmp, tag, budget, cgroup=None):
        self.tag, self.budget, self.cgroup = tag, budget, cgroup
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.data = os.path.join(tmp, tag)
        self.log = open(os.path.join(tmp, f"{tag}.log"), "w")
        cmd = [os.path.join(build, "server", "leash-server"), "--bind", self.endpoint, "--data-dir", self.data,
               "--checkpoint-interval", "0", "--log-level", "warn", "--sparse-direct-reads"]
        if budget:
            cmd += ["--memory-budget", str(budget)]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=cgroup.join if cgroup and cgroup.path else None)

    def close(self):
        stop(self.proc)
        self.log.close()


def driver(build, server, phase, args, **extra):
    cmd = [os.path.join(build, "bench", "leash-bench-sparse"), "--servers", server.endpoint, "--phase", phase,
           "--keys", str(args.keys), "--dim", str(args.dim), "--batch", str(args.batch)]
    for k, v in extra.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=sys.stderr, text=True, timeout=7200)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode} (server log {server.log.name})")
    if server.proc.poll() is not None:
        raise RuntimeError(f"{server.tag}: leash-server exited {server.proc.returncode} (log {server.log.name})")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table_stats(build, server, args):
    s = driver(build, server, "stats", args)["shards"][0]
    s["rss_bytes"] = proc_status(server.proc.pid, "VmRSS")
    s["peak_rss_bytes"] = proc_status(server.proc.pid, "VmHWM")
    if server.cgroup and server.cgroup.path:
        s["cgroup_peak_bytes"] = server.cgroup.peak()
    return s


def snapshot(build, server, args):
    before = proc_write_bytes(server.proc.pid)
    r = driver(build, server, "checkpoint", args)
    return {"seconds": r["seconds"], "bytes_written": proc_write_bytes(server.proc.pid) - before}


def start_perf(server, tmp, alpha, seconds):
    out = os.path.join(tmp, f"perf-{alpha}.data")
    proc = subprocess.Popen(["perf", "record", "-F", "499", "-g", "-o", out, "-p", str(server.proc.pid), "--",
                             "sleep", str(max(1, seconds - 1))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, out


def finish_perf(prof):
    """The profile's top entries (self time, by shared object and symbol)."""
    proc, out = prof
    proc.wait()
    rep = subprocess.run(["perf", "report", "-i", out, "--stdio", "--no-children", "--sort", "dso,symbol",
                          "--percent-limit", "1.5", "-g", "none"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    return [line.strip() for line in rep.stdout.splitlines() if line.strip() and not line.startswith("#")][:25]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--keys", type=int, default=20_000_000, help="distinct keys in all")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=4096, help="samples per batch (26 keys each)")
    p.add_argument("--alphas", default="1.1,1.3")
    p.add_argument("--seconds", type=float, default=20, help="per measurement")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds per alpha")
    p.add_argument("--ratio", type=float, default=4, help="table size / memory budget")
    p.add_argument("--allowance-mib", type=int,
                   help="the cgroup limit is the budget plus this; default: the overhead docs/sparse.md "
                        "states (64 MiB + 3R+128 bytes per key of the largest request, 26 x batch)")
    p.add_argument("--tmp", help="data directories (on a real disk; default a temporary one under /var/tmp)")
    p.add_argument("--perf", action="store_true",
                   help="profile the budgeted shard (perf record) in its first round of each alpha")
    p.add_argument("--quick", action="store_true", help="smoke run: 1M keys, 5 s measurements, 1 round")
    args = p.parse_args()
    if args.quick:
        args.keys, args.seconds, args.rounds = 1_000_000, 5, 1
        if args.out == os.path.join(ROOT, "bench", "results"):
            args.out = os.path.join(ROOT, "bench", "results", "quick")

    slots = 1  # adagrad
    row_bytes = args.dim * 4 * (1 + slots) + 16  # values, state, steps and last clock
    table_bytes = args.keys * row_bytes
    budget = int(table_bytes / args.ratio)
    tmp = tempfile.mkdtemp(prefix="leash-sparse-", dir=args.tmp or "/var/tmp")
    # The stated bound (server/include/leash/server/shard.h: kMemoryOverheadBytes and
    # SparseRequestBytesPerKey), so that the cgroup checks it.
    allowance = (args.allowance_mib * MiB if args.allowance_mib is not None
                 else 64 * MiB + 26 * args.batch * (3 * row_bytes + 128))
    cg = Cgroup(f"leash-sparse-bench-{os.getpid()}", budget + allowance)
    servers = {"memory": Server(args.build, tmp, "memory", 0),
               "tiered": Server(args.build, tmp, "tiered", budget, cg)}
    res = {"when": now(), "keys": args.keys, "dim": args.dim, "fields": 26, "batch": args.batch,
           "optimizer": "adagrad", "row_bytes": row_bytes, "table_bytes": table_bytes, "budget_bytes": budget,
           "ratio": args.ratio, "cgroup": cg.kind if cg.path else None,
           "cgroup_limit_bytes": cg.limit if cg.path else None, "direct_reads": True,
           "populate": {}, "full_snapshot": {}, "runs": [], "stats": {}, "one_percent_snapshot": {}}
    try:
        time.sleep(1)
        for name, s in servers.items():
            print(f"sparse_scale: populating {name} ({args.keys} keys)", file=sys.stderr)
            res["populate"][name] = driver(args.build, s, "populate", args)
            res["full_snapshot"][name] = snapshot(args.build, s, args)
            res["stats"][name + "_after_populate"] = table_stats(args.build, s, args)
        for alpha in [float(a) for a in args.alphas.split(",")]:
            for rnd in range(args.rounds):
                order = ["memory", "tiered"] if rnd % 2 == 0 else ["tiered", "memory"]
                for name in order:
                    s = servers[name]
                    before = table_stats(args.build, s, args)
                    prof = None
                    if args.perf and name == "tiered" and rnd == 0 and shutil.which("perf"):
                        prof = start_perf(s, tmp, alpha, args.seconds)
                    r = driver(args.build, s, "run", args, alpha=alpha, seconds=args.seconds, seed=rnd + 1)
                    if prof:
                        res.setdefault("profile", {})[str(alpha)] = finish_perf(prof)
                    after = table_stats(args.build, s, args)
                    hits = after["tier_hits"] - before["tier_hits"]
                    misses = after["tier_misses"] - before["tier_misses"]
                    r.update({"mode": name, "round": rnd, "hit_rate": hits / max(1, hits + misses),
                              "rss_bytes": after["rss_bytes"], "peak_rss_bytes": after["peak_rss_bytes"],
                              "memory_used_bytes": after["memory_used_bytes"],
                              "cgroup_peak_bytes": after.get("cgroup_peak_bytes")})
                    res["runs"].append(r)
                    print(f"sparse_scale: alpha {alpha} round {rnd} {name}: {r['keys_per_s']:.0f} keys/s, "
                          f"hit rate {r['hit_rate']:.3f}", file=sys.stderr)
        for name, s in servers.items():
            # Everything the runs changed goes into this snapshot, so the next one holds only
            # the 1% touched.
            res.setdefault("snapshot_after_runs", {})[name] = snapshot(args.build, s, args)
            driver(args.build, s, "touch", args, touch_every=100)
            res["one_percent_snapshot"][name] = snapshot(args.build, s, args)
            res["stats"][name] = table_stats(args.build, s, args)
        for name, s in servers.items():
            res.setdefault("disk_bytes", {})[name] = du(s.data)
            rows = res["stats"][name]["local_rows"]
            res.setdefault("disk_bytes_per_row", {})[name] = du(s.data) / max(1, rows)
    finally:
        for s in servers.values():
            s.close()
        cg.remove()
        shutil.rmtree(tmp, ignore_errors=True)
    summarize(res, args.out)


def summarize(res, out):
    os.makedirs(out, exist_ok=True)
    alphas = sorted({r["alpha"] for r in res["runs"]})
    res["summary"] = []
    for a in alphas:
        def med(mode, key):
            v = sorted(r[key] for r in res["runs"] if r["alpha"] == a and r["mode"] == mode)
            return v[len(v) // 2] if v else None
        m, t = med("memory", "keys_per_s"), med("tiered", "keys_per_s")
        res["summary"].append({"alpha": a, "memory_keys_per_s": m, "tiered_keys_per_s": t,
                               "ratio": t / m if m and t else None, "tiered_hit_rate": med("tiered", "hit_rate"),
                               "unique_fraction": med("tiered", "unique_fraction")})
    write_json(os.path.join(out, "sparse_scale.json"), res)
    gib = 1 << 30
    lines = [f"# Sparse table at scale ({res['when']})", "",
             f"{res['keys']:,} keys x {res['dim']} ({res['optimizer']}, {res['row_bytes']} B a row: "
             f"{res['table_bytes'] / gib:.2f} GiB), memory budget {res['budget_bytes'] / gib:.2f} GiB "
             f"(1/{res['ratio']:g}); cgroup: {res['cgroup'] or 'none (not root)'}"
             f"{', limit %.2f GiB' % (res['cgroup_limit_bytes'] / gib) if res['cgroup_limit_bytes'] else ''}; "
             "RocksDB reads with O_DIRECT.", "",
             "| alpha | all in memory keys/s | 4x budget keys/s | ratio | tier hit rate | unique keys per batch |",
             "|---|---|---|---|---|---|"]
    for s in res["summary"]:
        lines.append(f"| {s['alpha']} | {s['memory_keys_per_s']:,.0f} | {s['tiered_keys_per_s']:,.0f} | "
                     f"{s['ratio']:.2f} | {s['tiered_hit_rate']:.3f} | {s['unique_fraction']:.2f} |")
    st = res["stats"].get("tiered", {})
    lines += ["", f"- Budgeted shard: VmRSS {st.get('rss_bytes', 0) / gib:.2f} GiB, peak VmHWM "
              f"{st.get('peak_rss_bytes', 0) / gib:.2f} GiB, cgroup peak (page cache included) "
              f"{(st.get('cgroup_peak_bytes') or 0) / gib:.2f} GiB, against a budget of "
              f"{res['budget_bytes'] / gib:.2f} GiB; memory tier + caches by its own count "
              f"{st.get('memory_used_bytes', 0) / gib:.2f} GiB.",
              f"- Bytes on disk per row: " + ", ".join(f"{k} {v:.0f}" for k, v in res.get('disk_bytes_per_row', {}).items()),
              "- Populate (every key pulled once): " + ", ".join(
                  f"{k} {v['keys_per_s']:,.0f} keys/s" for k, v in res["populate"].items())]
    for k in res["one_percent_snapshot"]:
        f, o = res["full_snapshot"][k], res["one_percent_snapshot"][k]
        lines.append(f"- Snapshot, {k}: first (every row new) {f['seconds']:.2f} s, {f['bytes_written'] / (1 << 20):,.0f} MiB "
                     f"written; after 1% of the rows changed {o['seconds']:.2f} s, {o['bytes_written'] / (1 << 20):,.1f} MiB.")
    for a, top in res.get("profile", {}).items():
        lines += ["", f"Where the budgeted shard's time goes at alpha {a} (perf, self time):", "", "```"] + top + ["```"]
    with open(os.path.join(out, "sparse_scale.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("sparse_scale: no matplotlib, no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(res["summary"]))
    ax.bar([x - 0.2 for x in xs], [s["memory_keys_per_s"] for s in res["summary"]], 0.4, label="all in memory")
    ax.bar([x + 0.2 for x in xs], [s["tiered_keys_per_s"] for s in res["summary"]], 0.4, label="table 4x the budget")
    ax.set_xticks(list(xs), [f"alpha {s['alpha']}" for s in res["summary"]])
    ax.set_ylabel("pull + push keys/s (one shard)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "sparse_scale.png"), dpi=120)


if __name__ == "__main__":
    main()

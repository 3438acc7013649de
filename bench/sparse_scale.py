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
from common.util import free_port, now, pyplot, stop, write_json  # noqa: E402

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


def thread_cpu(pid):
    """CPU seconds by thread name (comm) of process `pid`: leash-server (the request loop),
    leash-sparse-rd (the cold tier's readers), rocksdb:low/high (compaction, flushes),
    ZMQbg/* (sockets)."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                stat = f.read()
        except FileNotFoundError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[comm] = out.get(comm, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


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
    # The driver would wait for a dead shard (its client reconnects and resends): watch the
    # shard while it runs, and stop the driver if the shard exits (e.g. OOM-killed in its
    # cgroup).
    with tempfile.TemporaryFile("w+") as out:
        drv = subprocess.Popen(cmd, stdout=out, stderr=sys.stderr, text=True)
        t0 = time.time()
        while drv.poll() is None:
            if server.proc.poll() is not None or time.time() - t0 > 7200:
                stop(drv)
                cgroup = server.cgroup
                why = (" (its memory cgroup's peak was %.0f MiB of %.0f)" % (cgroup.peak() / MiB, cgroup.limit / MiB)
                       if cgroup and cgroup.path and cgroup.peak() else "")
                raise RuntimeError(f"{server.tag}: leash-server exited {server.proc.returncode} during "
                                   f"{phase}{why} (log {server.log.name})")
            time.sleep(0.2)
        if drv.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {drv.returncode} (server log {server.log.name})")
        out.seek(0)
        return json.loads(out.read().strip().splitlines()[-1])


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


def disk_iops(tmp, depths=(1, 8, 32), seconds=8):
    """4 KiB random direct reads of a 2 GiB file under `tmp` with fio, at each queue depth:
    the disk's limits measured in this run, next to the cold tier's reads/s. None without
    fio."""
    if not shutil.which("fio"):
        print("sparse_scale: no fio, so no disk limits in the report (apt-get install fio)", file=sys.stderr)
        return None
    out = {}
    path = os.path.join(tmp, "fio.dat")
    for qd in depths:
        r = subprocess.run(["fio", "--name=randread", f"--filename={path}", "--size=2G", "--rw=randread", "--bs=4k",
                            "--direct=1", "--ioengine=libaio", f"--iodepth={qd}", f"--runtime={seconds}",
                            "--time_based", "--output-format=json"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
        if r.returncode != 0:
            return None
        out[str(qd)] = json.loads(r.stdout)["jobs"][0]["read"]["iops"]
    os.remove(path)
    return out


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
    rows = []
    for line in rep.stdout.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split()
        rows.append(" ".join(parts[:2]) + "  " + " ".join(p for p in parts[2:] if p != "-"))
    return rows[:25]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--keys", type=int, default=20_000_000, help="distinct keys in all")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=4096, help="samples per batch (26 keys each)")
    p.add_argument("--alphas", default="1.1,1.3")
    p.add_argument("--seconds", type=float, default=20, help="per measurement")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds per alpha (the first warms the tier and is left out of medians)")
    p.add_argument("--ratio", type=float, default=4, help="table size / memory budget")
    p.add_argument("--allowance-mib", type=int,
                   help="the cgroup limit is the budget plus this; default: the overhead docs/sparse.md "
                        "states (96 MiB + 3R+128 bytes per key of the largest request, 26 x batch)")
    p.add_argument("--tmp", help="data directories (on a real disk; default a temporary one under /var/tmp)")
    p.add_argument("--perf", action="store_true",
                   help="profile the budgeted shard (perf record) in its first round of each alpha")
    p.add_argument("--quick", action="store_true", help="smoke run: 1M keys, 5 s measurements, 1 round")
    p.add_argument("--torch-python", default="/usr/bin/python3",
                   help="the Python with torch that runs the PyTorch peer (bench/torch_sparse_scale.py); "
                        "'' leaves the peer out")
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
                 else 96 * MiB + 26 * args.batch * (3 * row_bytes + 128))
    cg = Cgroup(f"leash-sparse-bench-{os.getpid()}", budget + allowance)
    servers = {"memory": Server(args.build, tmp, "memory", 0),
               "tiered": Server(args.build, tmp, "tiered", budget, cg)}
    res = {"when": now(), "keys": args.keys, "dim": args.dim, "fields": 26, "batch": args.batch,
           "optimizer": "adagrad", "row_bytes": row_bytes, "table_bytes": table_bytes, "budget_bytes": budget,
           "ratio": args.ratio, "rounds": args.rounds, "cgroup": cg.kind if cg.path else None,
           "cgroup_limit_bytes": cg.limit if cg.path else None, "direct_reads": True,
           "populate": {}, "full_snapshot": {}, "runs": [], "stats": {}, "one_percent_snapshot": {}}
    try:
        res["disk_iops_before"] = disk_iops(tmp)
        for name, s in servers.items():
            print(f"sparse_scale: populating {name} ({args.keys} keys)", file=sys.stderr)
            res["populate"][name] = driver(args.build, s, "populate", args)
            res["full_snapshot"][name] = snapshot(args.build, s, args)
            res["stats"][name + "_after_populate"] = table_stats(args.build, s, args)
        peer = args.torch_python and os.path.exists(args.torch_python) and subprocess.run(
            [args.torch_python, "-c", "import torch"], stderr=subprocess.DEVNULL).returncode == 0
        if not peer:
            print("sparse_scale: no torch under --torch-python, so no PyTorch peer", file=sys.stderr)
        for alpha in [float(a) for a in args.alphas.split(",")]:
            for rnd in range(args.rounds):
                order = ["memory", "tiered"] + (["pytorch"] if peer else [])
                if rnd % 2 == 1:
                    order.reverse()
                for name in order:
                    if name == "pytorch":
                        out = subprocess.run(
                            [args.torch_python, os.path.join(ROOT, "bench", "torch_sparse_scale.py"), "--keys",
                             str(args.keys), "--batch", str(args.batch), "--dim", str(args.dim), "--alpha",
                             str(alpha), "--seconds", str(args.seconds), "--seed", str(rnd + 1)],
                            stdout=subprocess.PIPE, text=True, check=True)
                        r = json.loads(out.stdout.strip().splitlines()[-1])
                        r["round"] = rnd
                        res["runs"].append(r)
                        print(f"sparse_scale: alpha {alpha} round {rnd} pytorch: {r['keys_per_s']:.0f} keys/s",
                              file=sys.stderr)
                        continue
                    s = servers[name]
                    before = table_stats(args.build, s, args)
                    cpu0 = thread_cpu(s.proc.pid)
                    prof = None
                    if args.perf and name == "tiered" and rnd == 0 and shutil.which("perf"):
                        prof = start_perf(s, tmp, alpha, args.seconds)
                    r = driver(args.build, s, "run", args, alpha=alpha, seconds=args.seconds, seed=rnd + 1)
                    if prof:
                        res.setdefault("profile", {})[str(alpha)] = finish_perf(prof)
                    cpu1 = thread_cpu(s.proc.pid)
                    after = table_stats(args.build, s, args)
                    hits = after["tier_hits"] - before["tier_hits"]
                    misses = after["tier_misses"] - before["tier_misses"]
                    r.update({"mode": name, "round": rnd, "hit_rate": hits / max(1, hits + misses),
                              "cold_reads_per_s": misses / r["seconds"],
                              "cpu_cores": {k: round((cpu1[k] - cpu0.get(k, 0.0)) / r["seconds"], 3)
                                            for k in cpu1 if cpu1[k] - cpu0.get(k, 0.0) > 0},
                              "misses_per_batch": misses / max(1, r["batches"]),
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
        res["disk_iops_after"] = disk_iops(tmp)
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
    iops = [d["32"] for d in (res.get("disk_iops_before"), res.get("disk_iops_after")) if d]
    keys_per_batch = res["fields"] * res["batch"]
    for a in alphas:
        def med(mode, key, skip_first=False):
            v = sorted(r[key] for r in res["runs"] if r["alpha"] == a and r["mode"] == mode and
                       r.get(key) is not None and not (skip_first and r["round"] == 0 and res["rounds"] > 1))
            if not v:
                return None
            return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2
        # Per round: the tiered shard against the in-memory one measured beside it, and the
        # best ratio the disk allows for that round: a batch takes its in-memory time plus its
        # misses read at the disk's 4 KiB random-read rate at queue depth 32 (fio, this run).
        for r in res["runs"]:
            if r["alpha"] != a or r["mode"] != "tiered":
                continue
            peer = [x for x in res["runs"] if x["alpha"] == a and x["mode"] == "memory" and x["round"] == r["round"]]
            if not peer:
                continue
            r["ratio"] = r["keys_per_s"] / peer[0]["keys_per_s"]
            t_mem = keys_per_batch / peer[0]["keys_per_s"]
            r["reads_needed_for_half"] = r["misses_per_batch"] / t_mem
            if iops:
                r["disk_bound_ratio"] = t_mem / (t_mem + r["misses_per_batch"] / max(iops))
        # The first round warms the memory tier: left out of the medians when there are more.
        row = {"alpha": a, "memory_keys_per_s": med("memory", "keys_per_s", True),
               "tiered_keys_per_s": med("tiered", "keys_per_s", True), "ratio": med("tiered", "ratio", True),
               "tiered_hit_rate": med("tiered", "hit_rate", True),
               "unique_fraction": med("tiered", "unique_fraction", True),
               "cold_reads_per_s": med("tiered", "cold_reads_per_s", True),
               "misses_per_batch": med("tiered", "misses_per_batch", True),
               "disk_bound_ratio": med("tiered", "disk_bound_ratio", True),
               "reads_needed_for_half": med("tiered", "reads_needed_for_half", True),
               "pytorch_keys_per_s": med("pytorch", "keys_per_s", True)}
        if iops:
            row["disk_iops_qd32"] = max(iops)
        res["summary"].append(row)
    write_json(os.path.join(out, "sparse_scale.json"), res)
    gib = 1 << 30
    lines = [f"# Sparse table at scale ({res['when']})", "",
             f"{res['keys']:,} keys x {res['dim']} ({res['optimizer']}, {res['row_bytes']} B a row: "
             f"{res['table_bytes'] / gib:.2f} GiB), memory budget {res['budget_bytes'] / gib:.2f} GiB "
             f"(1/{res['ratio']:g}); cgroup: {res['cgroup'] or 'none (not root)'}"
             f"{', limit %.2f GiB' % (res['cgroup_limit_bytes'] / gib) if res['cgroup_limit_bytes'] else ''}; "
             "RocksDB reads with O_DIRECT.", "",
             "| alpha | all in memory keys/s | 4x budget keys/s | ratio | tier hit rate | unique keys per batch "
             "| misses per batch | cold reads/s | best ratio the disk allows | reads/s 0.5x needs |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in res["summary"]:
        lines.append(f"| {s['alpha']} | {s['memory_keys_per_s']:,.0f} | {s['tiered_keys_per_s']:,.0f} | "
                     f"{s['ratio']:.2f} | {s['tiered_hit_rate']:.3f} | {s['unique_fraction']:.2f} | "
                     f"{s['misses_per_batch']:,.0f} | {s['cold_reads_per_s']:,.0f} | "
                     f"{s.get('disk_bound_ratio', float('nan')):.2f} | {s.get('reads_needed_for_half', float('nan')):,.0f} |")
    if any(s.get("pytorch_keys_per_s") for s in res["summary"]):
        lines += ["", "The PyTorch peer (bench/torch_sparse_scale.py: nn.Embedding with sparse gradients, sparse "
                  "Adagrad, all in memory, 1 thread, the same keys; key sampling not timed):", ""]
        for s in res["summary"]:
            if s.get("pytorch_keys_per_s"):
                lines.append(f"- alpha {s['alpha']}: {s['pytorch_keys_per_s']:,.0f} keys/s; the Leash shard all in "
                             f"memory {s['memory_keys_per_s'] / s['pytorch_keys_per_s']:.2f}x it, at 4x the budget "
                             f"{s['tiered_keys_per_s'] / s['pytorch_keys_per_s']:.2f}x.")
    for when in ("before", "after"):
        d = res.get(f"disk_iops_{when}")
        if d:
            lines.append(f"\nDisk {when} the runs (fio, 4 KiB random direct reads): " +
                         ", ".join(f"{int(v):,} IOPS at queue depth {q}" for q, v in d.items()) + ".")
    st = res["stats"].get("tiered", {})
    lines += ["", f"- Budgeted shard: VmRSS {st.get('rss_bytes', 0) / gib:.2f} GiB, peak VmHWM "
              f"{st.get('peak_rss_bytes', 0) / gib:.2f} GiB, cgroup peak (page cache included) "
              f"{(st.get('cgroup_peak_bytes') or 0) / gib:.2f} GiB, against a budget of "
              f"{res['budget_bytes'] / gib:.2f} GiB; memory tier + caches by its own count "
              f"{st.get('memory_used_bytes', 0) / gib:.2f} GiB.",
              "- Bytes on disk per row: " + ", ".join(f"{k} {v:.0f}" for k, v in res.get('disk_bytes_per_row', {}).items()),
              "- Populate (every key pulled once): " + ", ".join(
                  f"{k} {v['keys_per_s']:,.0f} keys/s" for k, v in res["populate"].items())]
    for k in res["one_percent_snapshot"]:
        f, o = res["full_snapshot"][k], res["one_percent_snapshot"][k]
        lines.append(f"- Snapshot, {k}: first (every row new) {f['seconds']:.2f} s, {f['bytes_written'] / (1 << 20):,.0f} MiB "
                     f"written; after 1% of the rows changed {o['seconds']:.2f} s, {o['bytes_written'] / (1 << 20):,.1f} MiB.")
    lines += ["", "CPU of the shard's threads during the runs (cores, median over rounds; the machine has "
              f"{os.cpu_count()}; the driver and the other shard share them):", ""]
    for a in alphas:
        for mode in ("memory", "tiered"):
            runs = [r for r in res["runs"] if r["alpha"] == a and r["mode"] == mode and r.get("cpu_cores")]
            if not runs:
                continue
            names = sorted({k for r in runs for k in r["cpu_cores"]})
            med = {}
            for k in names:
                v = sorted(r["cpu_cores"].get(k, 0.0) for r in runs)
                med[k] = v[len(v) // 2]
            lines.append(f"- alpha {a}, {mode}: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                              sorted(med.items(), key=lambda kv: -kv[1]) if v >= 0.01))
    for a, top in res.get("profile", {}).items():
        lines += ["", f"Where the budgeted shard's time goes at alpha {a} (perf, self time):", "", "```"] + top + ["```"]
    with open(os.path.join(out, "sparse_scale.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(res["summary"]))
    peer = all(s.get("pytorch_keys_per_s") for s in res["summary"])
    w = 0.27 if peer else 0.4
    ax.bar([x - w for x in xs], [s["memory_keys_per_s"] for s in res["summary"]], w, label="Leash, all in memory")
    ax.bar(list(xs), [s["tiered_keys_per_s"] for s in res["summary"]], w, label="Leash, table 4x the budget")
    if peer:
        ax.bar([x + w for x in xs], [s["pytorch_keys_per_s"] for s in res["summary"]], w,
               label="PyTorch sparse, in memory")
    ax.set_xticks(list(xs), [f"alpha {s['alpha']}" for s in res["summary"]])
    ax.set_ylabel("pull + push keys/s (one shard)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "sparse_scale.png"), dpi=120)


if __name__ == "__main__":
    main()

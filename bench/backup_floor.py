#!/usr/bin/python3
"""Whether issue 16's 4 MB target can hold on this machine at all (replicated shards).

The target: R=2 costs at most 25% against R=1, so R=2's 4 MB push row (8 in flight) must
reach 0.75x R=1's pushes a second, with the backup on the same cores. Whatever its design, a
backup applies every push's optimizer update to state of its own (the replicas' tables and
momentum are the same bit for bit), and one with memory of its own receives each push once.
This runs that least work with no backup at all, beside an unreplicated shard:

  alone   R=1's 4 MB push row (leash-bench-pushpull against one leash-server);
  update  the same, while leash-bench-backup-load applies the momentum update to 4 MB at
          0.75x R=1's rate (the rate R=2 must keep), cycling through 8 gradients;
  copy    the same with one copy of each push into its memory before the update;
  r2      R=2's row itself (etcd and two leash-server replicas, the defaults: the backup
          answers and applies each entry in place in the primary's ring), in the same rounds;
  r2copy  R=2 with --backups-read-in-place=false (the backup copies each entry out of the
          ring and checks it for NaN first: the design before), in the same rounds.

If the shard cannot keep 0.75x R=1's rate while the update alone runs at that rate, no R=2 on
these cores can: R=2 does at least R=1's work and the backup's update at the same rate. If it
can, the gap between it and R=2 (bench/replication.py) is what Leash's replication adds.
The CPU-only floor (replication.py's push_4MB_floor) leaves out that the processes share the
memory bandwidth; this measures it.

Rounds are interleaved, order rotated. The co-runner's rate in a round is 0.75x the median of
R=1's rates measured so far (a calibration run first). Writes backup_floor.json and
backup_floor.md to --out. Every process is started here and stopped by its handle.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import replication as R  # noqa: E402
from common import leash as L  # noqa: E402
from common.util import cpu_model, median, write_json  # noqa: E402

FLOATS = 1048576  # the 4 MB push row
TARGET = 0.75     # R=2 at most 25% below R=1


def measure_r2(build, tmp, tag, seconds, extra=()):
    """R=2's 4 MB push row (leash-server's defaults: the backup answers, `extra` flags added) on a
    fresh cluster, with the primary's and the backup's CPU per push."""
    cl = R.Replicated(build, tmp, tag, 2, extra)
    try:
        p = cl.primary()
        procs = {"primary": cl.procs[p["replica"]], "backup": cl.procs[1 - p["replica"]]}
        cpu0 = {k: R.cpu_seconds(v.pid) for k, v in procs.items()}
        r = R.pushpull(build, {}, tmp, f"{tag}-pp", ["--etcd", cl.etcd.url, "--job", cl.job], FLOATS, 8, seconds)
        for k, v in procs.items():
            c1 = R.cpu_seconds(v.pid)
            if cpu0[k] is not None and c1 is not None and r["cpu_ops"]:
                r[f"{k}_cpu_us_per_push"] = (c1 - cpu0[k]) / r["cpu_ops"] * 1e6
        return r
    finally:
        cl.stop()


def measure(build, tmp, tag, seconds, load=None):
    """R=1's 4 MB push row on a fresh shard; with `load` ({"rate", "copy"}) beside the co-runner."""
    shard = R.Single(build, tmp, tag)
    co = None
    try:
        if load:
            cmd = [L._bin(build, "bench", "leash-bench-backup-load"), f"--floats={FLOATS}",
                   f"--rate={load['rate']:.3f}", f"--copy={'true' if load['copy'] else 'false'}"]
            co = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        cpu0 = R.cpu_seconds(shard.proc.pid)
        r = R.pushpull(build, {}, tmp, f"{tag}-pp", ["--servers", shard.endpoint], FLOATS, 8, seconds)
        cpu1 = R.cpu_seconds(shard.proc.pid)
        if cpu0 is not None and cpu1 is not None and r["cpu_ops"]:
            r["shard_cpu_us_per_push"] = (cpu1 - cpu0) / r["cpu_ops"] * 1e6
        if co:
            co.send_signal(signal.SIGTERM)
            out, err = co.communicate(timeout=30)
            if co.returncode != 0:
                raise L.RunError(f"leash-bench-backup-load exited {co.returncode}: {err[-500:]}")
            r["co_runner"] = json.loads(out)
            co = None
        return r
    finally:
        if co:
            co.kill()
            co.wait()
        shard.stop()


def run(build, rounds, seconds, tmp, log):
    cal = measure(build, tmp, "cal", seconds)
    log(f"calibration: R=1 4 MB push {cal['ops_per_s']:.0f}/s ({cal['mb_per_s']:.0f} MB/s)")
    rates = [cal["ops_per_s"]]
    configs = ["alone", "update", "copy", "r2", "r2copy"]
    out = []
    for r in range(rounds):
        rate = TARGET * median(rates)
        got = {"co_runner_rate": rate}
        k = r % len(configs)
        for name in configs[k:] + configs[:k]:
            if name == "r2":
                got[name] = measure_r2(build, tmp, f"r{r}{name}", seconds)
            elif name == "r2copy":
                got[name] = measure_r2(build, tmp, f"r{r}{name}", seconds, ["--backups-read-in-place=false"])
            else:
                load = None if name == "alone" else {"rate": rate, "copy": name == "copy"}
                got[name] = measure(build, tmp, f"r{r}{name}", seconds, load)
            g = got[name]
            extra = ""
            if "co_runner" in g:
                c = g["co_runner"]
                extra = (f"; co-runner {c['rate_reached']:.0f}/{c['rate_asked']:.0f} updates/s, "
                         f"update p50 {c['update_p50_us']:.0f} us" +
                         (f", copy p50 {c['copy_p50_us']:.0f} us" if c["copy"] else ""))
            log(f"  round {r + 1}/{rounds} {name}: {g['ops_per_s']:.0f} pushes/s ({g['mb_per_s']:.0f} MB/s), "
                f"load {R.load():.1f}{extra}")
        rates.append(got["alone"]["ops_per_s"])
        for name in ("update", "copy", "r2", "r2copy"):
            g = got[name]
            g["over_alone"] = g["ops_per_s"] / got["alone"]["ops_per_s"]
            # Keeps R=2's target rate (for update and copy: while a backup's least work runs at it).
            g["keeps_target_rate"] = g["ops_per_s"] >= rate
        out.append(got)
    summary = {}
    for name in ("r2", "r2copy"):
        r2 = [g[name]["over_alone"] for g in out]
        summary[name] = {"over_alone_per_round": r2, "median_over_alone": median(r2), "median_cost": 1 - median(r2),
                         "rounds_keeping_target_rate": sum(g[name]["keeps_target_rate"] for g in out),
                         "primary_cpu_us_per_push": median(g[name].get("primary_cpu_us_per_push") for g in out),
                         "backup_cpu_us_per_push": median(g[name].get("backup_cpu_us_per_push") for g in out)}
    # In place against copied out, round by round (the two R=2 designs, same rounds).
    in_place = [g["r2"]["ops_per_s"] / g["r2copy"]["ops_per_s"] for g in out]
    summary["r2_in_place_over_copy"] = {"per_round": in_place, "median": median(in_place)}
    for name in ("update", "copy"):
        ratios = [g[name]["over_alone"] for g in out]
        summary[name] = {
            "over_alone_per_round": ratios, "median_over_alone": median(ratios),
            # the least R=2 costs with only this much added: R=1's row with the load, against alone
            "floor_cost_per_round": [1 - x for x in ratios], "median_floor_cost": 1 - median(ratios),
            "rounds_keeping_target_rate": sum(g[name]["keeps_target_rate"] for g in out),
            "co_runner_kept_rate": [g[name]["co_runner"]["rate_reached"] >= 0.97 * g[name]["co_runner"]["rate_asked"]
                                    for g in out],
            "co_runner_update_p50_us": median(g[name]["co_runner"]["update_p50_us"] for g in out),
            "co_runner_cpu_us_per_update": median(g[name]["co_runner"]["cpu_us_per_update"] for g in out),
            "shard_cpu_us_per_push": median(g[name].get("shard_cpu_us_per_push") for g in out
                                            if g[name].get("shard_cpu_us_per_push") is not None),
        }
        if name == "copy":
            summary[name]["co_runner_copy_p50_us"] = median(g[name]["co_runner"]["copy_p50_us"] for g in out)
    summary["alone"] = {"ops_per_s": [g["alone"]["ops_per_s"] for g in out],
                        "mb_per_s": [g["alone"]["mb_per_s"] for g in out],
                        "shard_cpu_us_per_push": median(g["alone"].get("shard_cpu_us_per_push") for g in out
                                                        if g["alone"].get("shard_cpu_us_per_push") is not None)}
    return {"benchmark": "backup_floor", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "nproc": os.cpu_count(),
            "cpu": cpu_model(), "seconds": seconds, "target_ratio": TARGET, "calibration": cal, "rounds": out,
            "summary": summary}


def write_md(res, out_dir):
    s = res["summary"]
    lines = [
        "# The floor under R=2's 4 MB push row (issue 16)",
        "",
        f"{res['cpu']}, {res['nproc']} cores, {res['time']}, {len(res['rounds'])} interleaved rounds of "
        f"{res['seconds']} s per row (`bench/backup_floor.py`). R=1's 4 MB push row (8 in flight, one "
        "leash-server) alone, and beside `leash-bench-backup-load` doing a backup's least work with no "
        f"backup: the momentum update of each push (update), or one copy of it and the update (copy), at "
        f"{res['target_ratio']:.2f}x R=1's rate, the rate R=2 must keep to cost at most 25%.",
        "",
        "| round | co-runner rate (updates/s) | R=1 alone (pushes/s) | with update | with copy + update | R=2 "
        "(in place) | R=2 copying out |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, g in enumerate(res["rounds"]):
        def cell(name):
            x = g[name]
            c = x["co_runner"]
            return (f"{x['ops_per_s']:.0f} ({x['over_alone']:.2f}x{'' if x['keeps_target_rate'] else ', under the rate'}"
                    f"; co-runner {c['rate_reached']:.0f}/s)")
        r2, rc = g["r2"], g.get("r2copy")
        last = f" {rc['ops_per_s']:.0f} ({rc['over_alone']:.2f}x) |" if rc else " - |"
        lines.append(f"| {i + 1} | {g['co_runner_rate']:.0f} | {g['alone']['ops_per_s']:.0f} | {cell('update')} | "
                     f"{cell('copy')} | {r2['ops_per_s']:.0f} ({r2['over_alone']:.2f}x) |{last}")
    u, c, r2 = s["update"], s["copy"], s["r2"]
    n = len(res["rounds"])
    lines += [
        "",
        f"- With the update alone beside it, R=1 ran at **{u['median_over_alone']:.2f}x** its rate alone (median; "
        f"a floor cost of {u['median_floor_cost'] * 100:.1f}%), keeping R=2's target rate in "
        f"{u['rounds_keeping_target_rate']} of {n} rounds; the co-runner's update took {u['co_runner_update_p50_us']:.0f} "
        f"us (p50), {u['co_runner_cpu_us_per_update']:.0f} us of CPU per update.",
        f"- With one copy and the update: **{c['median_over_alone']:.2f}x** (floor cost "
        f"{c['median_floor_cost'] * 100:.1f}%), the target rate kept in {c['rounds_keeping_target_rate']} of {n}; "
        f"copy p50 {c['co_runner_copy_p50_us']:.0f} us, update {c['co_runner_update_p50_us']:.0f} us.",
        f"- The shard's CPU per push: {s['alone']['shard_cpu_us_per_push']:.0f} us alone, "
        f"{u['shard_cpu_us_per_push']:.0f} us beside the update, {c['shard_cpu_us_per_push']:.0f} us beside the copy.",
        f"- R=2 (leash-server's defaults, etcd, the backup answering) in the same rounds: **{r2['median_over_alone']:.2f}x** "
        f"R=1 (cost {r2['median_cost'] * 100:.1f}%), the target rate kept in {r2['rounds_keeping_target_rate']} of {n}; "
        f"the primary {r2['primary_cpu_us_per_push']:.0f} us and the backup {r2['backup_cpu_us_per_push']:.0f} us of CPU per push.",
    ]
    if "r2copy" in s:
        rc, ip = s["r2copy"], s["r2_in_place_over_copy"]
        lines += [
            f"- R=2 with the backup copying each entry out of the ring first (`--backups-read-in-place=false`, the "
            f"design before): **{rc['median_over_alone']:.2f}x** R=1 (cost {rc['median_cost'] * 100:.1f}%); the primary "
            f"{rc['primary_cpu_us_per_push']:.0f} us and the backup {rc['backup_cpu_us_per_push']:.0f} us of CPU per push. "
            f"In place against copying out, round by round: **{ip['median']:.2f}x** (median; "
            + ", ".join(f"{x:.2f}" for x in ip["per_round"]) + ").",
        ]
    lines += [        "",
        "Where the row stays under the target rate with only the update beside it, no backup on these cores "
        "can meet the target: R=2 does at least that work at that rate. Where it keeps it, the distance from "
        "there to R=2 is what Leash's replication adds beyond the least work.",
    ]
    with open(os.path.join(out_dir, "backup_floor.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seconds", type=float, default=2.0, help="each row's measurement")
    p.add_argument("--summary-only", action="store_true", help="rewrite backup_floor.md from --out/backup_floor.json")
    a = p.parse_args()
    if a.rounds < 1 or a.seconds <= 0:
        p.error("--rounds must be at least 1 and --seconds positive")
    if a.summary_only:
        with open(os.path.join(a.out, "backup_floor.json")) as f:
            print("\n".join(write_md(json.load(f), a.out)))
        return 0
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="leash-backup-floor-")

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    try:
        res = run(a.build, a.rounds, a.seconds, tmp, log)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_json(os.path.join(a.out, "backup_floor.json"), res)
    print("\n".join(write_md(res, a.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

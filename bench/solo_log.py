#!/usr/bin/python3
"""An unreplicated shard's durable log (leash-server --durable-log with --replicas 1: a group
of one, no etcd; docs/replication.md, "One replica with a durable log"), with real processes:

  kills  one shard SIGKILLed under leash-bench-failover's pushes (SGD at lr 1: the final table
         against the exact sum of the acknowledged pushes) and restarted at once, snapshots
         every 1 s, with the log (write) and without it (snapshots only, today's R=1),
         alternated pair by pair on fresh shards: acknowledged pushes lost and doubled per
         kill, and the time from the kill to the first acknowledgement after the restart.
  cost   the shard with --durable-log write and fsync against off, interleaved (the order
         rotates each round): replication.py's MLP 1 worker + 1 shard at staleness 1
         (samples/s), the 4 KB push p50 (1 in flight) and the 4 MB push MB/s (8 in flight),
         the shard's CPU per iteration, and what it wrote to its log.

Writes solo_log.json and solo_log.md to --out (default bench/results). Every process is started
here and stopped by its handle.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import durable_log as D  # noqa: E402  (its cost part, here on one shard)
import replication as R  # noqa: E402  (its shards and probe)
from common import leash as L  # noqa: E402
from common.util import cpu_model, median, write_json  # noqa: E402

MODES = D.MODES
FIGURES = D.COST_FIGURES


def part_kills(build, c, tmp, log):
    runs = {"snapshots": [], "log": []}
    for pair in range(c["pairs"]):
        order = ("snapshots", "log") if pair % 2 == 0 else ("log", "snapshots")
        for mode in order:
            extra = ["--durable-log=write"] if mode == "log" else []
            log(f"pair {pair + 1}/{c['pairs']}, {mode}: {c['kills_per_pair']} SIGKILLs")
            r = R.single_kills(build, c, tmp, log, extra, f"kills{pair}{mode}", c["kills_per_pair"])
            runs[mode].append(r)
    out = {}
    for mode, rs in runs.items():
        kills = sum(len(r["kills"]) for r in rs)
        lost = sum(r["probe"]["lost"] for r in rs)
        doubled = sum(r["probe"]["doubled"] for r in rs)
        down = [k["down_ms"] for r in rs for k in r["kills"]]
        out[mode] = {"runs": rs, "kills": kills, "lost": lost, "doubled": doubled,
                     "acknowledged": sum(r["probe"]["acknowledged"] for r in rs),
                     "lost_per_kill": lost / kills, "doubled_per_kill": doubled / kills,
                     "lost_per_kill_each_run": [r["lost_per_kill"] for r in rs],
                     "median_down_ms": median(down), "max_down_ms": max(down)}
    return out


def summary_md(res):
    md = []
    k = res.get("kills")
    if k:
        s, g = k["snapshots"], k["log"]
        md += ["## One shard SIGKILLed and restarted (snapshots every 1 s)", "",
               f"{res['config']['pairs']} pairs of fresh shards, {res['config']['kills_per_pair']} kills each, "
               "with the log and without it alternated, under leash-bench-failover's pushes "
               f"(at most {res['config']['rate']} a second):", "",
               "| | kills | acknowledged | lost per kill | applied twice per kill | kill to first ack after restart (median / max) |",
               "|---|---|---|---|---|---|",
               f"| snapshots only (today's R=1) | {s['kills']} | {s['acknowledged']} | **{s['lost_per_kill']:g}** | "
               f"{s['doubled_per_kill']:g} | {s['median_down_ms']:.0f} / {s['max_down_ms']:.0f} ms |",
               f"| `--durable-log write` | {g['kills']} | {g['acknowledged']} | **{g['lost_per_kill']:g}** | "
               f"{g['doubled_per_kill']:g} | {g['median_down_ms']:.0f} / {g['max_down_ms']:.0f} ms |", ""]
    cost = res.get("cost")
    if cost:
        s = cost["summary"]
        md += D.cost_table_md(cost, res["nproc"], replicas=1)
        md += ["", "Shard CPU per iteration (µs, median; an MLP step, a 4 KB push, a 4 MB push): "
               + "; ".join(f"{m}: " + ", ".join(f"{s[name][f'{m}_primary_cpu_us_per_iteration'] or 0:.0f}"
                                               for name, _ in FIGURES) for m in MODES) + ".", ""]
    return md


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--only", default="kills,cost", help="comma-separated: kills, cost")
    p.add_argument("--pairs", type=int, default=3, help="kill pairs (default 3)")
    p.add_argument("--kills-per-pair", type=int, default=3, help="kills per shard (default 3)")
    p.add_argument("--rounds", type=int, default=3, help="cost rounds (default 3)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 pair of 1 kill, 1 round, short runs")
    p.add_argument("--keep-tmp", action="store_true")
    a = p.parse_args()
    c = R.config(a.quick)
    c["pairs"], c["kills_per_pair"], c["rounds"] = (1, 1, 1) if a.quick else (a.pairs, a.kills_per_pair, a.rounds)
    parts = [x.strip() for x in a.only.split(",")]
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="leash-solo-log-")

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    res = {"benchmark": "solo_log", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "config": c,
           "nproc": os.cpu_count(), "cpu": cpu_model()}
    t0 = time.monotonic()
    try:
        if "kills" in parts:
            res["kills"] = part_kills(a.build, c, tmp, log)
        if "cost" in parts:
            log(f"cost: {c['rounds']} rounds of off, write and fsync")
            res["cost"] = D.part_cost(a.build, c, tmp, log, replicas=1)
    except L.RunError as e:
        log(f"failed: {e}")
        a.keep_tmp = True
        raise
    finally:
        if a.keep_tmp:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    res["seconds"] = time.monotonic() - t0
    write_json(os.path.join(a.out, "solo_log.json"), res)
    md = ["# An unreplicated shard's durable log", "",
          f"`bench/solo_log.py`, {res['time']}, {res['nproc']} cores ({res.get('cpu', 'CPU not recorded')}), "
          f"took {res['seconds'] / 60:.1f} min; raw numbers: `solo_log.json`.", ""] + summary_md(res)
    with open(os.path.join(a.out, "solo_log.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(summary_md(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

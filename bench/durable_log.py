#!/usr/bin/python3
"""A replica's durable log (leash-server --durable-log, issue 16), with real processes and a
real etcd:

  group  every replica of the shard SIGKILLed at once under leash-bench-failover's pushes (SGD
         at lr 1: the final table against the exact sum of the acknowledged pushes), both
         started again at once: acknowledged pushes lost and doubled per group kill (target 0),
         and the stall from the kill to the first push acknowledged after it, and from the
         restart. Snapshots every 1 s, so each restart reads a snapshot and the file begun
         with it. Without the durable log such a group waits for a person (not run).
  cost   R=2 with --durable-log write and fsync against off, interleaved (the order rotates
         each round): replication.py's MLP 1 worker + 1 shard at staleness 1 (samples/s), the
         4 KB push p50 (1 in flight) and the 4 MB push MB/s (8 in flight) against the primary,
         the replicas' CPU per iteration, and what each replica wrote to its log.

Writes durable_log.json and durable_log.md to --out (default bench/results). Every process is
started here and stopped by its handle.
"""
import argparse
import os
import re
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import replication as R  # noqa: E402  (its clusters, probe and cost rows)
from common import leash as L  # noqa: E402
from common.util import cpu_model, median, write_json  # noqa: E402

MODES = ("off", "write", "fsync")


def group_kills(build, c, tmp, log):
    cl = R.Replicated(build, tmp, "group", c["ttl"], ["--durable-log=write", "--checkpoint-interval=1s"])
    kills = []
    try:
        probe = R.Probe(build, tmp, "group", [f"--etcd={cl.etcd.url}", f"--job={cl.job}", f"--rate={c['rate']}"])
        try:
            for k in range(c["kills"]):
                cl.wait_in_sync()
                time.sleep(1.3 + 0.17 * k)  # a snapshot or two since the last restart; kills at varying points
                before = R.load()
                t_kill = time.time()
                for p in cl.procs:
                    p.kill()
                for p in cl.procs:
                    p.wait()
                t_restart = time.time()
                first = k % 2  # either may come back first
                cl.start(first)
                cl.start(1 - first)
                _, t_first = probe.resumed_after(time.time(), 120)
                restored = [R.first_line_after(cl.logpath(r), r"starts again from its durable log", t_kill)
                            for r in range(2)]
                kills.append({"stall_ms": round((t_first - t_kill) * 1000),
                              "after_restart_ms": round((t_first - t_restart) * 1000), "load_before": before,
                              "restored_from_log": [t is not None for t in restored]})
                log(f"  group kill {k + 1}/{c['kills']}: pushes resumed {kills[-1]['after_restart_ms']} ms after "
                    f"the restart ({kills[-1]['stall_ms']} ms after the kill); restored from the log: "
                    f"{kills[-1]['restored_from_log']}; load {before:.1f}")
            totals = probe.finish()
        finally:
            if probe.proc.poll() is None:
                probe.proc.kill()
    finally:
        cl.stop()
    return {"ttl_s": c["ttl"], "kills": kills, "probe": {k: v for k, v in totals.items() if k != "gaps_ms"},
            "lost_per_kill": totals["lost"] / len(kills), "doubled_per_kill": totals["doubled"] / len(kills),
            "median_after_restart_ms": median(k["after_restart_ms"] for k in kills),
            "max_after_restart_ms": max(k["after_restart_ms"] for k in kills),
            "median_stall_ms": median(k["stall_ms"] for k in kills)}


def written(tmp, tag, replicas=2):
    """What the replicas of cost run `tag` wrote to their logs (their exit lines); with
    `replicas` 1, the unreplicated shard's."""
    out = {"records": 0, "mib": 0.0}
    paths = [os.path.join(tmp, f"{tag}-r{r}.log") for r in range(2)] if replicas == 2 else \
        [os.path.join(tmp, f"{tag}-shard.log")]
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for m in re.finditer(r"wrote (\d+) durable log record\(s\), ([0-9.]+) MiB", f.read()):
                out["records"] += int(m.group(1))
                out["mib"] += float(m.group(2))
    return out


def part_cost(build, c, tmp, log, replicas=2):
    """Off, write and fsync in a rotating order each round, on R=`replicas` (with R=1 the
    shard's CPU is its "primary" figure)."""
    rounds = []
    for r in range(c["rounds"]):
        order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
        got = {}
        for mode in order:
            tag = f"cost{r}{mode}"
            got[mode] = R.cost_one(build, c, tmp, tag, replicas, [f"--durable-log={mode}"])
            got[mode]["written"] = written(tmp, tag, replicas)
            g = got[mode]
            log(f"  round {r + 1}/{c['rounds']} {mode}: {R.rows_line(g)}; primary CPU/iteration {g['mlp'].get('primary_cpu_us_per_iteration', 0):.0f} us, backup "
                f"{g['mlp'].get('backup_cpu_us_per_iteration', 0):.0f} us; log {g['written']['mib']:.0f} MiB; "
                f"load {g['mlp']['load_before']:.1f}")
        rounds.append(got)
    summary = {}
    for name, (row, key, higher) in R.COST_FIGURES.items():
        summary[name] = {"off": [g["off"][row][key] for g in rounds], "higher_is_better": higher}
        for mode in MODES[1:]:
            ratios, costs = R.per_round(rounds, mode, "off", row, key, higher)
            summary[name][mode] = [g[mode][row][key] for g in rounds]
            summary[name][f"{mode}_over_off_per_round"] = ratios
            summary[name][f"{mode}_median_cost"] = median(costs)
            for who in ("primary", "backup"):
                summary[name][f"{mode}_{who}_cpu_us_per_iteration"] = median(
                    g[mode][row].get(f"{who}_cpu_us_per_iteration") for g in rounds)
        for who in ("primary", "backup"):
            summary[name][f"off_{who}_cpu_us_per_iteration"] = median(
                g["off"][row].get(f"{who}_cpu_us_per_iteration") for g in rounds)
    return {"rounds": rounds, "summary": summary}


def summary_md(res):
    md = []
    g = res.get("group")
    if g:
        md += ["## Every replica SIGKILLed at once (`--durable-log write`)", "",
               f"{len(g['kills'])} group kills under leash-bench-failover's pushes (etcd TTL {g['ttl_s']} s, "
               "snapshots every 1 s, both replicas restarted at once):", "",
               f"- acknowledged pushes lost per group kill: **{g['lost_per_kill']:g}** (target 0); applied twice: "
               f"**{g['doubled_per_kill']:g}**; pushes acknowledged in all: {g['probe'].get('acknowledged')}",
               f"- pushes resumed after the restart: median **{g['median_after_restart_ms']:.0f} ms**, max "
               f"{g['max_after_restart_ms']:.0f} ms (median {g['median_stall_ms']:.0f} ms after the kill)",
               f"- replicas restored from their logs: {sum(sum(k['restored_from_log']) for k in g['kills'])} "
               f"of {2 * len(g['kills'])}", ""]
    cost = res.get("cost")
    if cost:
        s = cost["summary"]
        md += cost_table_md(cost, res["nproc"], replicas=2)
        x = s["mlp_samples_per_second"]
        md += ["", "Replicas' CPU per MLP iteration (µs, median): "
               + ", ".join(f"{m}: primary {x[f'{m}_primary_cpu_us_per_iteration']:.0f}, backup "
                           f"{x[f'{m}_backup_cpu_us_per_iteration']:.0f}" for m in MODES) + ".", ""]
    return md


COST_FIGURES = (("mlp_samples_per_second", "MLP 1+1 s=1, samples/s"),
                ("push_4KB_p50_us", "4 KB push p50, µs"),
                ("push_4MB_mb_per_s", "4 MB push at 8 in flight, MB/s"))


def cost_table_md(cost, nproc, replicas):
    """The cost part's table: each figure off, write and fsync, with the median costs."""
    s = cost["summary"]
    md = [f"## Cost against no durable log (R={replicas}, interleaved)", "",
          f"{len(cost['rounds'])} rounds, each running off, write and fsync in a rotating order on this "
          f"{nproc}-core machine; cost = throughput lost (or latency added) against off in the same "
          "round, median of the rounds.", "",
          "| figure | off | write | cost | fsync | cost |", "|---|---|---|---|---|---|"]
    for name, label in COST_FIGURES:
        x = s[name]
        md.append(f"| {label} | {median(x['off']):.0f} | {median(x['write']):.0f} | "
                  f"{100 * x['write_median_cost']:+.1f}% | {median(x['fsync']):.0f} | "
                  f"{100 * x['fsync_median_cost']:+.1f}% |")
    return md


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--only", default="group,cost", help="comma-separated: group, cost")
    p.add_argument("--kills", type=int, default=5, help="group kills (default 5)")
    p.add_argument("--rounds", type=int, default=3, help="cost rounds (default 3)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 2 kills, 1 round, short runs")
    p.add_argument("--keep-tmp", action="store_true")
    a = p.parse_args()
    c = R.config(a.quick)
    c["kills"], c["rounds"] = (2, 1) if a.quick else (a.kills, a.rounds)
    parts = [x.strip() for x in a.only.split(",")]
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="leash-durable-log-")

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    res = {"benchmark": "durable_log", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "config": c,
           "nproc": os.cpu_count(), "cpu": cpu_model()}
    t0 = time.monotonic()
    try:
        if "group" in parts:
            log(f"group kills: {c['kills']}")
            res["group"] = group_kills(a.build, c, tmp, log)
        if "cost" in parts:
            log(f"cost: {c['rounds']} rounds of off, write and fsync")
            res["cost"] = part_cost(a.build, c, tmp, log)
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
    write_json(os.path.join(a.out, "durable_log.json"), res)
    md = ["# A replica's durable log", "",
          f"`bench/durable_log.py`, {res['time']}, {res['nproc']} cores ({res.get('cpu', 'CPU not recorded')}), took {res['seconds'] / 60:.1f} min; raw "
          "numbers: `durable_log.json`.", ""] + summary_md(res)
    with open(os.path.join(a.out, "durable_log.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(summary_md(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Client::Pull (the values copied into the caller's buffer) against Client::PullInPlace (read
where the replies brought them) over the socket, under the same leash-bench-pushpull run: each
round measures both ops in every cell back to back, in alternating order, beside raw ZeroMQ
one-way between two processes (the 4 MB ceiling of issue 19's target). Reports MB/s, p50 and
the client's CPU per request, in-place over copied per round and by median, and the 4 MB pull
at 8 in flight over raw one-way, as JSON and Markdown.

    /usr/bin/python3 bench/pull_in_place.py [--rounds 6] [--sizes 65536,1048576]
        [--inflight 1,8] [--seconds 1] [--name pull_in_place] [--out bench/results]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common.util import loads_before, median, spaced, write_json  # noqa: E402

OPS = ("pull", "pull_in_place")


def run(a, ops, tmp):
    out = tempfile.mkdtemp(dir=tmp)
    p = subprocess.run([a.bench, "--server-bin", a.server, "--sizes", a.sizes, "--ops", ",".join(ops),
                        "--modes", "socket", "--shards", "1", "--inflight", a.inflight,
                        "--raw-rows", "oneway2", "--stripes", "", "--seconds", str(a.seconds), "--out", out],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"leash-bench-pushpull exited {p.returncode}: {p.stderr[-2000:]}")
    with open(os.path.join(out, "pushpull.json")) as f:
        samples = json.load(f)["samples"]
    cells, raw = {}, {}
    for s in samples:
        if s["system"] == "leash" and s["op"] in OPS:
            cells.setdefault(f"{s['floats'] * 4 // 1024} KB {s['inflight']} in flight", {})[s["op"]] = s
        elif s["system"] == "raw zmq" and s["op"] == "one-way, 2 processes":
            raw[f"{s['floats'] * 4 // 1024} KB {s['inflight']} in flight"] = s["mb_per_s"]
    return cells, raw


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    build = os.path.join(os.path.dirname(HERE), "build")
    p.add_argument("--bench", default=os.path.join(build, "bench", "leash-bench-pushpull"))
    p.add_argument("--server", default=os.path.join(build, "server", "leash-server"))
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--sizes", default="65536,1048576")
    p.add_argument("--inflight", default="1,8")
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--name", default="pull_in_place")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    a = p.parse_args()
    for exe in (a.bench, a.server):
        if not os.access(exe, os.X_OK):
            p.error(f"{exe} is not an executable: build first (bash scripts/build.sh)")
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            load = os.getloadavg()[0]
            cells, raw = run(a, OPS if r % 2 == 0 else OPS[::-1], tmp)
            rounds.append({"load_before": load, "cells": cells, "raw_oneway_mb_per_s": raw})
            print(f"[{time.strftime('%H:%M:%S')}] round {r + 1}/{a.rounds} (load {load:.2f})", flush=True)
    summary = {}
    for cell in rounds[0]["cells"]:
        per = [rd["cells"][cell] for rd in rounds if all(op in rd["cells"].get(cell, {}) for op in OPS)]
        row = {"rounds": len(per)}
        for key in ("mb_per_s", "p50_us", "client_cpu_us"):
            row[key] = {op: median([c[op][key] for c in per]) for op in OPS}
            row[key + "_ratio_per_round"] = [c["pull_in_place"][key] / c["pull"][key] for c in per if c["pull"][key]]
            row[key + "_ratio"] = median(row[key + "_ratio_per_round"])
        raws = [rd["raw_oneway_mb_per_s"].get(cell) for rd in rounds]
        if all(raws):
            row["over_raw_oneway_per_round"] = {op: [c[op]["mb_per_s"] / r for c, r in zip(per, raws)] for op in OPS}
            row["over_raw_oneway"] = {op: median(v) for op, v in row["over_raw_oneway_per_round"].items()}
        summary[cell] = row
    res = {"benchmark": "pull_in_place", "date": time.strftime("%Y-%m-%d %H:%M"), "rounds": a.rounds,
           "seconds": a.seconds, "cores": os.cpu_count(), "summary": summary, "runs": rounds}
    write_json(os.path.join(a.out, f"{a.name}.json"), res)
    md = [f"# Pull against PullInPlace over the socket ({res['date']})", "",
          f"`bench/pull_in_place.py`: leash-bench-pushpull, 1 shard x 1 worker over the loopback socket, "
          f"{a.rounds} rounds of {a.seconds} s per cell, both ops back to back in alternating order; "
          f"{res['cores']} cores, load average before each round "
          f"{loads_before(rounds)}. Medians over rounds; ratios are "
          f"in place over copied, the median of the per-round ratios (MB/s: over 1 is faster; p50 and "
          f"client CPU: under 1 is less).", "",
          "| cell | MB/s pull / in place | MB/s ratio (per round) | p50 ratio | client CPU us per request | over raw one-way: pull / in place |",
          "|---|---|---|---|---|---|"]
    for cell, row in summary.items():
        raw = row.get("over_raw_oneway")
        md.append(f"| {cell} | {row['mb_per_s']['pull']:.0f} / {row['mb_per_s']['pull_in_place']:.0f} | "
                  f"**{row['mb_per_s_ratio']:.2f}** ({spaced(row['mb_per_s_ratio_per_round'])}) | "
                  f"{row['p50_us_ratio']:.2f} | {row['client_cpu_us']['pull']:.0f} / "
                  f"{row['client_cpu_us']['pull_in_place']:.0f} | "
                  + (f"{raw['pull']:.2f} / {raw['pull_in_place']:.2f}" if raw else "-") + " |")
    with open(os.path.join(a.out, f"{a.name}.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()

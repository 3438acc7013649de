#!/usr/bin/python3
"""A/B of two Leash builds on leash-bench-pushpull's large cells, over one connection and
striped: does build B move striped (and unstriped) tensors faster, or with less shard CPU?

Per round, in the order A B B A (then B A A B, ...), each build's leash-bench-pushpull runs
the same cells against its own leash-server: 1 shard x 1 worker, `--floats` floats (4 MB by
default), push and pull, 1 and 8 in flight, over one connection (`leash`) and striped over
N (`leash striped N`). Per cell and build: MB/s, p50 and the shard's CPU per request
(user + system, all threads, from /proc); B/A ratios per round and their medians.

    /usr/bin/python3 bench/stripes_ab.py --a BUILD_A --b BUILD_B [--rounds 4] [--stripes 2]

Writes NAME.json and NAME.md (bench/results by default).
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

import stripes  # noqa: E402  (the same arguments)
from common.util import median, write_json  # noqa: E402


def run(build, out, a):
    bench = os.path.join(build, "bench", "leash-bench-pushpull")
    cmd = [bench, "--server-bin", os.path.join(build, "server", "leash-server"),
           "--sizes", str(a.floats), "--modes", f"socket,striped{a.stripes}",
           "--stripes", str(a.stripes), "--shards", "1", "--inflight", "1,8", "--ops", "push,pull",
           "--raw", "false", "--seconds", str(a.seconds), "--warmup-seconds", "0.3", "--out", out]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}")
    with open(os.path.join(out, "pushpull.json")) as f:
        return [s for s in json.load(f)["samples"] if s["system"].startswith("leash")]


def cell(s):
    return f"{s['system']} {s['op']} {s['inflight']} in flight"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="build directory A (the baseline)")
    p.add_argument("--b", required=True, help="build directory B")
    p.add_argument("--name", default="stripes_ab")
    a = stripes.parse_args(p, rounds=4)
    for build in (a.a, a.b):
        for exe in ("bench/leash-bench-pushpull", "server/leash-server"):
            if not os.access(os.path.join(build, exe), os.X_OK):
                p.error(f"{os.path.join(build, exe)} is missing: build it first")
    rounds = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = ["a", "b", "b", "a"] if r % 2 == 0 else ["b", "a", "a", "b"]
            got = {"a": [], "b": []}
            load = os.getloadavg()[0]
            for i, side in enumerate(order):
                out = os.path.join(tmp, f"r{r}-{i}")
                os.makedirs(out)
                got[side].append(run(a.a if side == "a" else a.b, out, a))
            rounds.append({"order": order, "load_before": load, "samples": got})
            print(f"[{time.strftime('%H:%M:%S')}] round {r + 1}/{a.rounds} done (load {load:.2f})", flush=True)

    cells = sorted({cell(s) for rd in rounds for runs in rd["samples"].values() for run_ in runs for s in run_})
    rows = []
    for c in cells:
        row = {"cell": c}
        for side in ("a", "b"):
            per = [[s for run_ in rd["samples"][side] for s in run_ if cell(s) == c] for rd in rounds]
            row[side] = {
                "mb_per_s": [median([s["mb_per_s"] for s in x]) for x in per],
                "p50_us": [median([s["p50_us"] for s in x]) for x in per],
                "server_cpu_us": [median([s["server_cpu_us"] for s in x if s.get("server_cpu_us", -1) >= 0])
                                  for x in per],
            }
        for k in ("mb_per_s", "p50_us", "server_cpu_us"):
            ratios = [b / a_ for a_, b in zip(row["a"][k], row["b"][k]) if a_ and b]
            row[f"b_over_a_{k}"] = ratios
            row[f"median_b_over_a_{k}"] = median(ratios)
        rows.append(row)
    result = {"benchmark": "stripes_ab", "a": os.path.abspath(a.a), "b": os.path.abspath(a.b),
              "floats": a.floats, "stripes": a.stripes, "seconds": a.seconds, "rounds": rounds,
              "cells": rows, "cores": os.cpu_count(), "minutes": (time.monotonic() - t0) / 60}
    os.makedirs(a.out, exist_ok=True)
    write_json(os.path.join(a.out, f"{a.name}.json"), result)

    def fmt(xs, spec):
        return ", ".join(format(x, spec) for x in xs)

    loads = ", ".join(f"{rd['load_before']:.2f}" for rd in rounds)
    lines = [f"# {a.name}: build B against build A on large push/pull cells ({time.strftime('%Y-%m-%d %H:%M')})", "",
             f"`bench/stripes_ab.py --rounds {a.rounds} --stripes {a.stripes}`: A = `{a.a}`, B = `{a.b}`; "
             f"{a.floats * 4 / 1e6:.1f} MB, 1 shard x 1 worker, {a.seconds:g} s per cell after 0.3 s unmeasured, "
             f"each build twice a round (A B B A, then B A A B), {os.cpu_count()} cores; load average before the "
             f"rounds {loads}. Per round the median of a build's two runs; B/A per round and its median.", "",
             "| cell | A MB/s | B MB/s | B/A MB/s (per round) | A shard CPU µs/request | B | B/A CPU (per round) |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['cell']} | {median(row['a']['mb_per_s']):.0f} | {median(row['b']['mb_per_s']):.0f} | "
            f"**{row['median_b_over_a_mb_per_s']:.2f}x** ({fmt(row['b_over_a_mb_per_s'], '.2f')}) | "
            f"{median(row['a']['server_cpu_us']):.0f} | {median(row['b']['server_cpu_us']):.0f} | "
            f"**{row['median_b_over_a_server_cpu_us']:.2f}x** ({fmt(row['b_over_a_server_cpu_us'], '.2f')}) |")
    with open(os.path.join(a.out, f"{a.name}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""A/B of two leash-server executables under the same leash-bench-pushpull client: every
round runs each server's cells back to back (A B, then B A, ...), and reports each cell's p50
and MB/s per round, their medians, and B/A per round and by median, as JSON and Markdown.

    /usr/bin/python3 bench/server_ab.py --a OLD_SERVER --b NEW_SERVER [--rounds 6]
        [--ops pull] [--sizes 1024,65536,1048576] [--inflight 1,8] [--modes socket]
        [--seconds 1] [--name server_ab] [--out bench/results]
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
from common.util import median, write_json  # noqa: E402


def cells(bench, server, a, tmp):
    out = tempfile.mkdtemp(dir=tmp)
    p = subprocess.run([bench, "--server-bin", server, "--sizes", a.sizes, "--ops", a.ops, "--modes", a.modes,
                        "--shards", a.shards, "--inflight", a.inflight, "--raw=false", "--seconds", str(a.seconds),
                        "--out", out], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"leash-bench-pushpull --server-bin {server} exited {p.returncode}: {p.stderr[-2000:]}")
    with open(os.path.join(out, "pushpull.json")) as f:
        return {f"{s['system']} {s['op']} {s['floats'] * 4 // 1024} KB {s['shards']}x{s['workers']} "
                f"{s['inflight']} in flight": s for s in json.load(f)["samples"] if s["system"].startswith("leash")}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="leash-server A (the reference)")
    p.add_argument("--b", required=True, help="leash-server B (the change)")
    p.add_argument("--bench", default=os.path.join(os.path.dirname(HERE), "build", "bench", "leash-bench-pushpull"))
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--ops", default="pull")
    p.add_argument("--sizes", default="1024,65536,1048576")
    p.add_argument("--inflight", default="1,8")
    p.add_argument("--shards", default="1")
    p.add_argument("--modes", default="socket")
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--name", default="server_ab")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    a = p.parse_args()
    for exe in (a.a, a.b, a.bench):
        if not os.access(exe, os.X_OK):
            p.error(f"{exe} is not an executable")
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            got = {"load_before": os.getloadavg()[0]}
            for which in (("a", "b") if r % 2 == 0 else ("b", "a")):
                got[which] = cells(a.bench, getattr(a, which), a, tmp)
            rounds.append(got)
            print(f"[{time.strftime('%H:%M:%S')}] round {r + 1}/{a.rounds} (load {got['load_before']:.2f})",
                  flush=True)
    rows = []
    for cell in rounds[0]["a"]:
        row = {"cell": cell}
        for k in ("p50_us", "mb_per_s"):
            av = [rd["a"][cell][k] for rd in rounds if cell in rd["a"] and cell in rd["b"]]
            bv = [rd["b"][cell][k] for rd in rounds if cell in rd["a"] and cell in rd["b"]]
            row[k] = {"a": av, "b": bv, "b_over_a": [y / x for x, y in zip(av, bv) if x > 0],
                      "median_a": median(av), "median_b": median(bv)}
            row[k]["median_b_over_a"] = median(row[k]["b_over_a"])
        rows.append(row)
    res = {"benchmark": "server_ab", "a": a.a, "b": a.b, "rounds": rounds, "cells": rows, "cores": os.cpu_count(),
           "args": vars(a), "time": time.strftime("%Y-%m-%d %H:%M")}
    os.makedirs(a.out, exist_ok=True)
    write_json(os.path.join(a.out, f"{a.name}.json"), res)
    loads = ", ".join(f"{rd['load_before']:.1f}" for rd in rounds)
    md = [f"# leash-server A/B ({res['time']})", "",
          f"A: `{a.a}`; B: `{a.b}`. `bench/server_ab.py`: leash-bench-pushpull ({a.modes}, {a.ops}), "
          f"{a.rounds} rounds of {a.seconds} s per cell, A and B back to back in alternating order; "
          f"{os.cpu_count()} cores, load average before each round {loads}. Medians over rounds; B/A is the "
          "median of the per-round ratios (p50: under 1 is faster; MB/s: over 1 is faster).", "",
          "| cell | p50 A / B (us) | p50 B/A (per round) | MB/s A / B | MB/s B/A (per round) |", "|---|---|---|---|---|"]
    for row in rows:
        pl, mb = row["p50_us"], row["mb_per_s"]
        md.append(f"| {row['cell']} | {pl['median_a']:.0f} / {pl['median_b']:.0f} | **{pl['median_b_over_a']:.2f}** "
                  f"({', '.join(f'{x:.2f}' for x in pl['b_over_a'])}) | {mb['median_a']:.0f} / {mb['median_b']:.0f} "
                  f"| **{mb['median_b_over_a']:.2f}** ({', '.join(f'{x:.2f}' for x in mb['b_over_a'])}) |")
    with open(os.path.join(a.out, f"{a.name}.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())

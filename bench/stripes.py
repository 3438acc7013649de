#!/usr/bin/python3
"""Striping against one connection: leash-bench-pushpull's 4 MB cells (1x1 and 2x2, 1 and 8
in flight, push and pull) over the socket with one connection per shard (`leash`), striped
over N (`leash striped N`: leash-worker --stripes N, the shards --io-threads N), and with
same-host shared memory (`leash shm`), back to back in every cell; beside them the raw
ZeroMQ one-way stream between two processes over one and over N connections. Several rounds
(every cell of a round one after another), medians over rounds, and each striped row as a
ratio to the one-connection row of the same cell and round.

    /usr/bin/python3 bench/stripes.py [--rounds 3] [--stripes 2] [--seconds 2]

Writes stripes.json and stripes.md (bench/results by default).
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


def key(s):
    return (s["system"], s["op"], s["shards"], s["inflight"])


def parse_args(p, rounds):
    """--out, --rounds, --stripes, --seconds and --floats added to `p`, parsed and checked
    (also bench/stripes_ab.py's)."""
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--stripes", type=int, default=2)
    p.add_argument("--seconds", type=float, default=2)
    p.add_argument("--floats", type=int, default=1048576)
    a = p.parse_args()
    if a.rounds < 1 or not 2 <= a.stripes <= 16 or a.seconds <= 0:
        p.error("need --rounds >= 1, --stripes 2..16 and --seconds > 0")
    return a


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    a = parse_args(p, rounds=3)
    bench = os.path.join(a.build, "bench", "leash-bench-pushpull")
    server = os.path.join(a.build, "server", "leash-server")
    for exe in (bench, server):
        if not os.access(exe, os.X_OK):
            p.error(f"{exe} is missing: build first (cmake --build build)")
    striped = f"leash striped {a.stripes}"
    rounds = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            out = os.path.join(tmp, f"r{r}")
            os.makedirs(out)
            load = os.getloadavg()[0]
            cmd = [bench, "--server-bin", server, "--sizes", str(a.floats),
                   "--modes", f"socket,striped{a.stripes},shm", "--raw-rows", "oneway2",
                   "--stripes", str(a.stripes), "--seconds", str(a.seconds), "--out", out]
            run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if run.returncode != 0:
                sys.exit(f"round {r + 1}: {' '.join(cmd)} failed ({run.returncode}):\n{run.stdout[-3000:]}")
            with open(os.path.join(out, "pushpull.json")) as f:
                samples = json.load(f)["samples"]
            rounds.append({"load_before": load, "samples": samples})
            print(f"[{time.strftime('%H:%M:%S')}] round {r + 1}/{a.rounds} done (load {load:.2f})", flush=True)

    cells = sorted({(s["op"], s["shards"], s["inflight"]) for rd in rounds for s in rd["samples"]
                    if s["system"] == "leash"})
    rows = []
    for op, n, inflight in cells:
        row = {"op": op, "shards": n, "inflight": inflight}
        for system in ("leash", striped, "leash shm"):
            mb = [s["mb_per_s"] for rd in rounds for s in rd["samples"] if key(s) == (system, op, n, inflight)]
            p50 = [s["p50_us"] for rd in rounds for s in rd["samples"] if key(s) == (system, op, n, inflight)]
            row[system] = {"mb_per_s": mb, "p50_us": p50, "median_mb_per_s": median(mb)}
        ratios = []
        for rd in rounds:
            by = {key(s): s for s in rd["samples"]}
            one, st = by.get(("leash", op, n, inflight)), by.get((striped, op, n, inflight))
            if one and st and one["mb_per_s"] > 0:
                ratios.append(st["mb_per_s"] / one["mb_per_s"])
        row["striped_over_one"] = ratios
        row["median_striped_over_one"] = median(ratios)
        rows.append(row)
    raw = {}
    for name in ("one-way, 2 processes", f"one-way, 2 processes, {a.stripes} connections"):
        raw[name] = [s["mb_per_s"] for rd in rounds for s in rd["samples"]
                     if s["system"] == "raw zmq" and s["op"] == name]
    raw_ratio = [b / o for o, b in zip(*raw.values()) if o > 0]
    result = {"benchmark": "stripes", "floats": a.floats, "stripes": a.stripes, "seconds": a.seconds,
              "rounds": rounds, "cells": rows, "raw_one_way_mb_per_s": raw,
              "raw_striped_over_one": raw_ratio, "cores": os.cpu_count(),
              "minutes": (time.monotonic() - t0) / 60}
    os.makedirs(a.out, exist_ok=True)
    write_json(os.path.join(a.out, "stripes.json"), result)

    mb = a.floats * 4 / 1e6
    loads = ", ".join(f"{rd['load_before']:.2f}" for rd in rounds)
    lines = [f"# Striping: {a.stripes} connections per shard against one ({time.strftime('%Y-%m-%d %H:%M')})", "",
             f"`bench/stripes.py --rounds {a.rounds} --stripes {a.stripes}`: leash-bench-pushpull's "
             f"{mb:.1f} MB cells, {a.seconds:g} s each, {a.rounds} rounds, {os.cpu_count()} cores; load average "
             f"before the rounds {loads}. MB/s medians over "
             f"rounds; 'striped / one' is the median of the per-round ratios.", "",
             f"| op | shards x workers | in flight | one connection MB/s | {a.stripes} stripes MB/s | striped / one "
             f"(per round) | shared memory MB/s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['shards']}x{r['shards']} | {r['inflight']} | "
                     f"{r['leash']['median_mb_per_s']:.0f} | {r[striped]['median_mb_per_s']:.0f} | "
                     f"**{r['median_striped_over_one']:.2f}x** ({', '.join(f'{x:.2f}' for x in r['striped_over_one'])}) | "
                     f"{r['leash shm']['median_mb_per_s']:.0f} |")
    names = list(raw)
    lines += ["", f"Raw ZeroMQ one-way between two processes: one connection {median(raw[names[0]]):.0f} MB/s, "
              f"{a.stripes} connections {median(raw[names[1]]):.0f} MB/s (median of per-round ratios "
              f"{median(raw_ratio):.2f}x)."]
    with open(os.path.join(a.out, "stripes.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

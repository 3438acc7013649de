#!/usr/bin/env python3
"""Two builds' leash-bench-optimizer, alternated: a shard's optimizer update per optimizer.

Each round runs A then B (B then A in odd rounds) with the same flags; per case the median µs
per update of each run, B/A per round and the median of those ratios (under 1: B faster).
JSON and Markdown.

Usage: bench/optimizer_ab.py --a OLD_BUILD --b NEW_BUILD [--rounds 6] [--floats 401408]
                             [--out bench/results] [--name optimizer_ab]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.util import write_json  # noqa: E402


def run(build, floats, repeats):
    exe = os.path.join(build, "bench", "leash-bench-optimizer")
    out = subprocess.run([exe, "--floats", str(floats), "--repeats", str(repeats)], check=True,
                         capture_output=True, text=True, timeout=600).stdout
    return {c["case"]: c["median_us"] for c in json.loads(out)["cases"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="build directory A (before)")
    ap.add_argument("--b", required=True, help="build directory B (after)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--floats", type=int, default=401408)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="optimizer_ab")
    a = ap.parse_args()
    if a.rounds < 1 or a.floats < 64 or a.floats % 64 or a.repeats < 1:
        ap.error("--rounds >= 1, --floats a positive multiple of 64, --repeats >= 1")
    for b in (a.a, a.b):
        if not os.access(os.path.join(b, "bench", "leash-bench-optimizer"), os.X_OK):
            ap.error(f"{b}/bench/leash-bench-optimizer is missing: build the target leash-bench-optimizer there")
    rounds = []
    started = time.time()
    for r in range(a.rounds):
        load = os.getloadavg()[0]
        order = ("a", "b") if r % 2 == 0 else ("b", "a")
        res = {k: run(getattr(a, k), a.floats, a.repeats) for k in order}
        rounds.append({"round": r + 1, "load_before": load, "a_us": res["a"], "b_us": res["b"],
                       "b_over_a": {c: res["b"][c] / res["a"][c] for c in res["a"] if c in res["b"]}})
        print(f"round {r + 1}/{a.rounds} (load {load:.1f}): " +
              ", ".join(f"{c} {v:.2f}" for c, v in rounds[-1]["b_over_a"].items()), flush=True)
    cases = list(rounds[0]["b_over_a"])
    summary = {c: {"a_median_us": statistics.median(x["a_us"][c] for x in rounds),
                   "b_median_us": statistics.median(x["b_us"][c] for x in rounds),
                   "b_over_a_per_round": [round(x["b_over_a"][c], 3) for x in rounds],
                   "b_over_a_median": statistics.median(x["b_over_a"][c] for x in rounds)} for c in cases}
    loads = [x["load_before"] for x in rounds]
    res = {"benchmark": "optimizer_ab", "a": a.a, "b": a.b, "floats": a.floats, "repeats": a.repeats,
           "cores": os.cpu_count(), "minutes": (time.time() - started) / 60, "summary": summary, "rounds": rounds}
    write_json(os.path.join(a.out, a.name + ".json"), res)
    md = [f"# A shard's optimizer update, two builds alternated ({a.rounds} rounds)", "",
          f"`bench/optimizer_ab.py --rounds {a.rounds} --floats {a.floats}`: one dense table of {a.floats} floats, "
          f"ps::Table::Apply of one gradient (Accumulate for `accumulate`), median µs of {a.repeats} updates per run; "
          f"A `{a.a}`, B `{a.b}`; {os.cpu_count()} cores, load average before the rounds "
          f"{min(loads):.1f}-{max(loads):.1f}.", "",
          "| case | A µs (median) | B µs | B/A (median) | B/A per round |", "|---|---|---|---|---|"]
    for c, s in summary.items():
        md.append(f"| {c} | {s['a_median_us']:.0f} | {s['b_median_us']:.0f} | **{s['b_over_a_median']:.2f}** | "
                  f"{', '.join(f'{v:.2f}' for v in s['b_over_a_per_round'])} |")
    with open(os.path.join(a.out, a.name + ".md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()

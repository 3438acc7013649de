#!/usr/bin/env python3
"""Pushes handed over against pushes copied, interleaved in one run.

leash::Client::Push(table, const float*) copies the gradient before it returns; the
overload that takes a std::shared_ptr<const float> sends the caller's floats themselves
(float32 wire, socket). This runs leash-bench-pushpull over the socket, 1 shard and 1
worker, 4 KB / 256 KB / 4 MB pushes at 1 and 8 in flight, once with --push-copy and once
without, in alternating order (copy first in even rounds), for several rounds. Each run
also measures the raw ZeroMQ rows the issue's targets are stated against (two-process round
trip and one-way, and the optimizer update alone), so every ratio compares figures of the
same run.

It reports, per cell: the p50 (1 in flight) or MB/s (8 in flight) and the client's CPU per
push, per round and as medians, the ratio handed-over/copied, and the network targets of
issue 19 for both. JSON, Markdown and a plot.

Usage: bench/push_handover.py [--build build] [--rounds 5] [--seconds 2]
                              [--out bench/results] [--name push_handover]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common.util import pyplot  # noqa: E402

SIZES = {1024: "4 KB", 65536: "256 KB", 1048576: "4 MB"}


def run_pushpull(build, out, seconds, copy):
    args = [os.path.join(build, "bench", "leash-bench-pushpull"), "--server-bin",
            os.path.join(build, "server", "leash-server"), "--sizes", ",".join(map(str, SIZES)),
            "--inflight", "1,8", "--shards", "1", "--modes", "socket", "--ops", "push",
            "--raw-rows", "rtt2,oneway2,update", "--stripes", "", "--seconds", str(seconds),
            "--out", out]
    if copy:
        args.append("--push-copy")
    p = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"leash-bench-pushpull exited {p.returncode}: {p.stderr[-2000:]}")
    with open(os.path.join(out, "pushpull.json")) as f:
        return json.load(f)


def cells(doc):
    """{(floats, inflight): row} of the Leash push rows."""
    return {(s["floats"], s["inflight"]): s for s in doc["samples"]
            if s["system"] == "leash" and s["op"] == "push"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="push_handover")
    a = ap.parse_args()
    started = time.time()
    tmp = tempfile.mkdtemp(prefix="leash-push-handover-")
    rounds = []
    for r in range(a.rounds):
        order = [True, False] if r % 2 == 0 else [False, True]
        got = {}
        for copy in order:
            out = os.path.join(tmp, f"r{r}-{'copy' if copy else 'owned'}")
            os.makedirs(out)
            doc = run_pushpull(a.build, out, a.seconds, copy)
            if doc.get("push_copy") != copy:
                sys.exit(f"leash-bench-pushpull did not run with push_copy={copy}: rebuild it")
            leash = cells(doc)
            got["copy" if copy else "owned"] = {"leash": leash, "ratios": doc.get("ratios", {}),
                                                "loadavg": doc["loadavg"]}
        rounds.append(got)
        print(f"round {r + 1}/{a.rounds} done ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)

    result = {"benchmark": "push_handover", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "rounds": a.rounds, "seconds_per_cell": a.seconds, "cores": os.cpu_count(), "cells": [],
              "targets": []}
    md = ["# Pushes handed over against pushes copied\n",
          f"`bench/push_handover.py`, {result['date']}, {os.cpu_count()} cores, shared and noisy; "
          f"{a.rounds} rounds, in each `leash-bench-pushpull` once with `--push-copy` (Push(const float*): "
          f"the client copies the gradient) and once without (Push of a shared_ptr: sent from the caller's "
          f"floats), in alternating order; 1 shard, 1 worker, over the socket, {a.seconds} s per cell. "
          f"Took {(time.time() - started) / 60:.1f} min. Raw numbers: `{a.name}.json`; plot: `{a.name}.png`.\n",
          "| cell | figure | copied per round | handed over per round | median copied | median handed over | "
          "handed over / copied | client CPU per push, copied → handed over (µs) |",
          "|---|---|---|---|---|---|---|---|"]
    for floats, label in SIZES.items():
        for inflight in (1, 8):
            key = "p50_us" if inflight == 1 else "mb_per_s"
            fig = "p50 µs" if inflight == 1 else "MB/s"
            vals = {m: [rd[m]["leash"][(floats, inflight)][key] for rd in rounds] for m in ("copy", "owned")}
            cpu = {m: [rd[m]["leash"][(floats, inflight)]["client_cpu_us"] for rd in rounds]
                   for m in ("copy", "owned")}
            med = {m: statistics.median(v) for m, v in vals.items()}
            cpu_med = {m: statistics.median(v) for m, v in cpu.items()}
            per_round = [o / c for o, c in zip(vals["owned"], vals["copy"])]
            cell = {"floats": floats, "size": label, "inflight": inflight, "figure": key, "copied": vals["copy"],
                    "handed_over": vals["owned"], "median_copied": med["copy"], "median_handed_over": med["owned"],
                    "ratio_per_round": per_round, "ratio": med["owned"] / med["copy"],
                    "client_cpu_us_copied": cpu["copy"], "client_cpu_us_handed_over": cpu["owned"],
                    "median_client_cpu_us_copied": cpu_med["copy"],
                    "median_client_cpu_us_handed_over": cpu_med["owned"]}
            result["cells"].append(cell)
            fmt = (lambda x: f"{x:.0f}")
            md.append(f"| {label}, {inflight} in flight | {fig} | {', '.join(map(fmt, vals['copy']))} | "
                      f"{', '.join(map(fmt, vals['owned']))} | {fmt(med['copy'])} | {fmt(med['owned'])} | "
                      f"**{cell['ratio']:.2f}x** ({', '.join(f'{x:.2f}' for x in per_round)}) | "
                      f"{cpu_med['copy']:.0f} → {cpu_med['owned']:.0f} |")

    # The socket targets, each against the raw rows of the same run.
    md += ["", "## The network targets (issue 19), each run against its own raw rows", "",
           "| target | copied per round | handed over per round | median copied | median handed over |",
           "|---|---|---|---|---|"]

    def target(name, fn):
        per = {m: [fn(rd[m]) for rd in rounds] for m in ("copy", "owned")}
        med = {m: statistics.median(v) for m, v in per.items()}
        result["targets"].append({"target": name, "copied": per["copy"], "handed_over": per["owned"],
                                  "median_copied": med["copy"], "median_handed_over": med["owned"]})
        md.append(f"| {name} | {', '.join(f'{x:.2f}' for x in per['copy'])} | "
                  f"{', '.join(f'{x:.2f}' for x in per['owned'])} | {med['copy']:.2f}x | **{med['owned']:.2f}x** |")

    # leash-bench-pushpull states each target's ratio against the raw rows of its own run.
    for name, key in (("4 KB push p50 / raw two-process round trip (target <= 1.2)", "push_4KB_p50_over_raw_rtt"),
                      ("256 KB push p50 / (raw round trip + update) (target <= 1.0)",
                       "push_256KB_p50_over_raw_rtt_plus_update"),
                      ("4 MB push MB/s at 8 in flight / raw one-way (target >= 1.5)",
                       "push_4MB_8inflight_over_raw_oneway")):
        if all(key in rd[m]["ratios"] for rd in rounds for m in ("copy", "owned")):
            target(name, lambda run, key=key: run["ratios"][key])
        else:
            md.append(f"| {name} | not stated by every run | | | |")
    loads = [rd[m]["loadavg"] for rd in rounds for m in ("copy", "owned")]
    md += ["", f"Load average at the end of each run: {min(loads):.1f} to {max(loads):.1f}.", ""]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, a.name + ".json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(a.out, a.name + ".md"), "w") as f:
        f.write("\n".join(md))
    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(8, 4))
        labels = [f"{c['size']}\n{c['inflight']} in flight\n({'p50' if c['inflight'] == 1 else 'MB/s'})"
                  for c in result["cells"]]
        ax.bar(range(len(labels)), [c["ratio"] for c in result["cells"]], color="#4a7")
        for i, c in enumerate(result["cells"]):
            ax.plot([i] * len(c["ratio_per_round"]), c["ratio_per_round"], "k.", ms=4)
        ax.axhline(1, color="grey", lw=0.8)
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylabel("handed over / copied (median; dots: rounds)")
        ax.set_title("Push of a shared_ptr against Push(const float*), same run, interleaved")
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, a.name + ".png"), dpi=110)
    print("\n".join(md))


if __name__ == "__main__":
    main()

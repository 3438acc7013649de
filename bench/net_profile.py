#!/usr/bin/env python3
"""Where the time of one push or pull over the socket goes (docs/network.md): runs one
cell of leash-bench-pushpull (1 shard, 1 worker, 1 in flight, socket only) per size and
op, and measures it three ways:
  - callgrind instruction counts of the client (the bench) and of the shard, split into
    copies (memcpy/memmove), ZeroMQ, the optimizer update, the codec, and the rest;
    instruction counts repeat on a noisy machine, times do not;
  - strace -c -f of both processes: system calls per request;
  - perf stat of both processes: context switches (wake-ups) and CPU time per request.
Writes bench/results/net_profile.json. Needs valgrind, strace and perf.
Usage: bench/net_profile.py [--build build] [--sizes 1024,65536,1048576] [--tag before]
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Self-cost buckets, by object file and function name (first match wins).
BUCKETS = [
    ("copies", lambda obj, fn: re.search(r"mem(cpy|move)|__memcpy|__memmove", fn) is not None),
    ("page zeroing / malloc", lambda obj, fn: re.search(r"malloc|free|_int_|calloc|memset|cfree", fn)
     is not None),
    ("optimizer update", lambda obj, fn: re.search(r"leash::Table::|Apply|Momentum|ApplyRow|AllFinite", fn)
     is not None),
    ("codec (FlatBuffers, wire)", lambda obj, fn: re.search(r"flatbuffers|leash::(Encode|Decode|PackBatch|"
                                                            r"UnpackBatch|Verify)|wire", fn) is not None),
    ("ZeroMQ", lambda obj, fn: "libzmq" in obj or fn.startswith("zmq::") or fn.startswith("zmq_")),
    ("syscall wrappers (libc)", lambda obj, fn: "libc" in obj),
]


def callgrind_buckets(path):
    """Self instruction counts per bucket of one callgrind output file."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=no", "--auto=no", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    total = 0
    m = re.search(r"^([\d,]+) .*PROGRAM TOTALS", out, re.M)
    if m:
        total = int(m.group(1).replace(",", ""))
    buckets = {name: 0 for name, _ in BUCKETS}
    buckets["other"] = 0
    top = []
    for line in out.splitlines():
        m = re.match(r"^\s*([\d,]+)(?: \([^)]*\))?\s+(?:\*\s+)?(.*?):(.*?)(?: \[(.*)\])?$", line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        ir = int(m.group(1).replace(",", ""))
        file_, fn, obj = m.group(2), m.group(3), m.group(4) or ""
        for name, pred in BUCKETS:
            if pred(obj + " " + file_, fn):
                buckets[name] += ir
                break
        else:
            buckets["other"] += ir
        if len(top) < 12:
            top.append({"ir": ir, "function": fn[:120], "object": os.path.basename(obj)})
    return total, buckets, top


def run_bench(build, tmp, size, op, seconds, server_bin, prefix=(), env=None):
    """One cell; op "push"/"pull" (Leash over the socket) or "raw" (the raw two-process
    ZeroMQ round trip). Returns the requests it made."""
    out = os.path.join(tmp, "out")
    os.makedirs(out, exist_ok=True)
    cmd = list(prefix) + [os.path.join(build, "bench", "leash-bench-pushpull"), "--server-bin", server_bin,
                          "--sizes", str(size), "--seconds", str(seconds), "--out", out]
    if op == "raw":
        cmd += ["--raw-rows", "rtt2", "--modes", ""]
    else:
        cmd += ["--raw=false", "--modes", "socket", "--shards", "1", "--inflight", "1", "--ops", op]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr[-2000:]}")
    with open(os.path.join(out, "pushpull.json")) as f:
        s = json.load(f)["samples"][0]
    return s["ops_per_s"] * seconds  # requests the cell made (the driver drains at the end)


def wrapper(tmp, name, line):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + line + "\n")
    os.chmod(path, 0o755)
    return path


def strace_summary(path):
    calls = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
            if m and m.group(2) != "total":
                calls[m.group(2)] = calls.get(m.group(2), 0) + int(m.group(1))
    return calls


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--sizes", default="1024,65536,1048576")
    p.add_argument("--ops", default="raw,push,pull", help="raw: the raw ZeroMQ round trip")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--tag", default="before")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--keep", default="", help="copy the callgrind files into this directory")
    p.add_argument("--only", default="callgrind,strace,perf", help="which measurements")
    a = p.parse_args()
    server = os.path.abspath(os.path.join(a.build, "server", "leash-server"))
    results = {"benchmark": "net_profile", "tag": a.tag, "loadavg": os.getloadavg()[0], "cells": []}
    for size in [int(x) for x in a.sizes.split(",")]:
        for op in a.ops.split(","):
            tmp = tempfile.mkdtemp(prefix="leash-prof-")
            keep = os.path.join(a.keep, f"{a.tag}-{size}-{op}") if a.keep else None
            try:
                cell = {"floats": size, "bytes": size * 4, "op": op}
                if "callgrind" in a.only and op != "raw":
                    # callgrind: the client (the bench under valgrind, the shard native), then
                    # the shard (under valgrind through a wrapper, the bench native).
                    cg_client = os.path.join(tmp, "client.cg")
                    ops = run_bench(a.build, tmp, size, op, a.seconds, server,
                                    ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + cg_client])
                    total, buckets, top = callgrind_buckets(cg_client)
                    cell["client"] = {"requests": ops, "ir_per_request": total / ops,
                                      "buckets_per_request": {k: v / ops for k, v in buckets.items()}, "top": top}
                    cg_server = os.path.join(tmp, "server.cg")
                    w = wrapper(tmp, "cg-server", f"exec valgrind --tool=callgrind --callgrind-out-file={cg_server} "
                                                  f'{server} "$@" 2>/dev/null')
                    ops = run_bench(a.build, tmp, size, op, a.seconds * 3, w)
                    total, buckets, top = callgrind_buckets(glob.glob(cg_server + "*")[0])
                    cell["server"] = {"requests": ops, "ir_per_request": total / ops,
                                      "buckets_per_request": {k: v / ops for k, v in buckets.items()}, "top": top}
                if "strace" in a.only:  # both processes
                    st = os.path.join(tmp, "strace.txt")
                    ops = run_bench(a.build, tmp, size, op, a.seconds, server, ["strace", "-c", "-f", "-o", st])
                    calls = strace_summary(st)
                    cell["syscalls_per_request"] = {k: round(v / ops, 2) for k, v in
                                                    sorted(calls.items(), key=lambda kv: -kv[1]) if v / ops >= 0.05}
                    cell["syscalls_total_per_request"] = round(sum(calls.values()) / ops, 1)
                if "perf" in a.only:  # both processes (children inherit the counters)
                    ps = os.path.join(tmp, "perf.txt")
                    ops = run_bench(a.build, tmp, size, op, a.seconds, server,
                                    ["perf", "stat", "-x", ",", "-o", ps, "-e", "task-clock,context-switches"])
                    with open(ps) as f:
                        for line in f:
                            parts = line.strip().split(",")
                            if len(parts) > 2 and parts[2] == "task-clock":
                                cell["cpu_us_per_request"] = float(parts[0]) * 1e3 / ops
                            if len(parts) > 2 and parts[2] == "context-switches":
                                cell["context_switches_per_request"] = float(parts[0]) / ops
                results["cells"].append(cell)
                print(json.dumps({k: v for k, v in cell.items() if k not in ("client", "server")}), flush=True)
                for side in [x for x in ("client", "server") if x in cell]:
                    c = cell[side]
                    print(f"  {side}: {c['ir_per_request']:.0f} Ir/request " +
                          ", ".join(f"{k} {v:.0f}" for k, v in c["buckets_per_request"].items()), flush=True)
            finally:
                if keep:  # the callgrind files, for callgrind_annotate by hand
                    os.makedirs(keep, exist_ok=True)
                    for f in glob.glob(os.path.join(tmp, "*.cg*")):
                        shutil.copy(f, keep)
                shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"net_profile_{a.tag}.json"), "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())

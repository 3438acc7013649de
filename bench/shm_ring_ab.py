#!/usr/bin/env python3
"""How large may a shared-memory ring grow? The 4 MB push row (8 in flight) at two ring sizes,
interleaved: does the default (64 MiB) beat the size before it (16 MiB)?

Each ring (one per direction and connection) reserves /dev/shm only as the frames in flight
need it; its size is the most it may grow to (leash-worker, leash-bench-pushpull and
leash-server --shm-ring-mb). Eight 4 MB pushes in flight need 32 MiB: a 16 MiB ring holds
about three of them, and the rest go through the socket.

Rows, each on a fresh cluster (bench/replication.py's), `leash-bench-pushpull` measuring
--seconds after --warmup unmeasured:
  r1_shm   one leash-server, the client reaching it through shared memory (its ring's size)
  r2_shm   a shard of 2 replicas (etcd; the backup answers), the client through shared memory;
           the primary reads each push in the client's ring and copies it into its backup's
  r2_sock  the same replicas, the client over the socket: only the primary's ring to its
           backup has the size
Rounds alternate which size goes first. Reports MB/s per round, medians, the 64/16 ratio per
round and its median, and R=2's cost against R=1 at each size; JSON, Markdown and a plot.

Usage: bench/shm_ring_ab.py [--rounds 5] [--seconds 2] [--warmup 0.5] [--out bench/results]
                            [--name shm_ring_size_ab]
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import replication as R  # noqa: E402
from common.util import cpu_model, pyplot, write_json  # noqa: E402

FLOATS = 1048576  # 4 MB
SIZES = (16, 64)  # MiB: the size before, the default
ROWS = {"r1_shm": "R=1, shared memory", "r2_shm": "R=2, shared memory", "r2_sock": "R=2, socket"}


def row(build, tmp, tag, name, mib, seconds, warmup):
    """One row at ring size `mib` (LEASH_SHM_RING_MB, read by every process started here)."""
    os.environ["LEASH_SHM_RING_MB"] = str(mib)
    c = {"pushpull_warmup": warmup}
    try:
        if name == "r1_shm":
            s = R.Single(build, tmp, tag)
            try:
                return R.pushpull(build, c, tmp, f"{tag}-pp", ["--servers", s.endpoint], FLOATS, 8, seconds,
                                  mode="shm")
            finally:
                s.stop()
        cl = R.Replicated(build, tmp, tag, 2, ())
        try:
            cl.primary()
            return R.pushpull(build, c, tmp, f"{tag}-pp", ["--etcd", cl.etcd.url, "--job", cl.job], FLOATS, 8,
                              seconds, mode="shm" if name == "r2_shm" else "socket")
        finally:
            cl.stop()
    finally:
        del os.environ["LEASH_SHM_RING_MB"]


def run(build, rounds, seconds, warmup, tmp, log):
    out = []
    for r in range(rounds):
        order = SIZES if r % 2 == 0 else SIZES[::-1]
        got = {}
        for name in ROWS:
            for mib in order:
                got.setdefault(name, {})[str(mib)] = row(build, tmp, f"r{r}{name}{mib}", name, mib, seconds,
                                                         warmup)["mb_per_s"]
        log(f"round {r + 1}/{rounds}: " + "; ".join(
            f"{ROWS[n]} " + ", ".join(f"{m} MiB {got[n][str(m)]:.0f}" for m in SIZES) + " MB/s" for n in ROWS)
            + f"; load {os.getloadavg()[0]:.1f}")
        out.append(got)
    return out


def summarize(rounds):
    s = {}
    for name in ROWS:
        per = {str(m): [g[name][str(m)] for g in rounds] for m in SIZES}
        ratio = [b / a for a, b in zip(per["16"], per["64"])]
        s[name] = {"mb_per_s": per, "median_mb_per_s": {m: statistics.median(v) for m, v in per.items()},
                   "ratio_64_over_16": ratio, "median_ratio": statistics.median(ratio)}
    for m in SIZES:
        cost = [1 - g["r2_shm"][str(m)] / g["r1_shm"][str(m)] for g in rounds]
        s[f"r2_shm_cost_{m}"] = {"per_round": cost, "median": statistics.median(cost)}
    return s


def write_md(res, out, name):
    s = res["summary"]
    md = ["# Shared-memory ring size: 16 against 64 MiB (the default)", "",
          f"`bench/shm_ring_ab.py`, {res['date']}, {res['cores']} cores ({res['cpu']}), shared and noisy; "
          f"{res['rounds']} rounds, each row {res['seconds']:g} s after {res['warmup']:g} s unmeasured, on a "
          "fresh cluster; the two sizes interleaved (16 first in even rounds). 4 MB pushes, 8 in flight "
          "(`leash-bench-pushpull`); the size set for every process (`LEASH_SHM_RING_MB`: the client's rings, "
          "and at R=2 the primary's rings to its backup). Raw numbers: "
          f"`{name}.json`; plot: [{name}.png]({name}.png).", "",
          "| row | 16 MiB MB/s per round | 64 MiB MB/s per round | 64/16 per round | median 64/16 |",
          "|---|---|---|---|---|"]
    for n, label in ROWS.items():
        x = s[n]
        md.append(f"| {label} | {', '.join(f'{v:.0f}' for v in x['mb_per_s']['16'])} | "
                  f"{', '.join(f'{v:.0f}' for v in x['mb_per_s']['64'])} | "
                  f"{', '.join(f'{v:.2f}' for v in x['ratio_64_over_16'])} | **{x['median_ratio']:.2f}x** |")
    md += ["", "R=2's cost against R=1 through shared memory (1 - R=2/R=1 per round, median): "
           + "; ".join(f"{m} MiB **{s[f'r2_shm_cost_{m}']['median'] * 100:.1f}%** ("
                       + ", ".join(f"{v * 100:.0f}" for v in s[f"r2_shm_cost_{m}"]["per_round"]) + ")"
                       for m in SIZES) + "."]
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    return md


def plot(res, out, name):
    plt = pyplot()
    if plt is None:
        return
    s = res["summary"]
    fig, ax = plt.subplots(figsize=(7, 4))
    x = range(len(ROWS))
    for i, m in enumerate(SIZES):
        med = [s[n]["median_mb_per_s"][str(m)] for n in ROWS]
        ax.bar([k + (i - 0.5) * 0.38 for k in x], med, 0.38, label=f"{m} MiB")
        for k, n in enumerate(ROWS):
            ax.scatter([k + (i - 0.5) * 0.38] * res["rounds"], s[n]["mb_per_s"][str(m)], color="black", s=8,
                       zorder=3)
    ax.set_xticks(list(x))
    ax.set_xticklabels([ROWS[n] for n in ROWS])
    ax.set_ylabel("4 MB push, 8 in flight: MB/s")
    ax.set_title("Ring size: medians (bars) and rounds (dots)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"{name}.png"), dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--name", default="shm_ring_size_ab")
    a = p.parse_args()
    if a.rounds < 1 or a.seconds <= 0 or a.warmup < 0:
        p.error("--rounds must be at least 1, --seconds positive and --warmup at least 0")
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="leash-shm-ring-")

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    t0 = time.time()
    try:
        rounds = run(a.build, a.rounds, a.seconds, a.warmup, tmp, log)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpu": cpu_model(), "cores": os.cpu_count(),
           "rounds": a.rounds, "seconds": a.seconds, "warmup": a.warmup, "minutes": (time.time() - t0) / 60,
           "per_round": rounds, "summary": summarize(rounds)}
    write_json(os.path.join(a.out, f"{a.name}.json"), res)
    print("\n".join(write_md(res, a.out, a.name)))
    plot(res, a.out, a.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())

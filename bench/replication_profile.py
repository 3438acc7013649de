#!/usr/bin/python3
"""Where a replicated primary's extra CPU goes: `perf record` (cpu-clock samples, no call
graphs) of R=1's shard and of R=2's primary and backup while leash-bench-pushpull pushes
4 MB at 8 in flight over the socket (replication.py's 4 MB row; `--mode shm`: through
shared memory, its 4 MB shared-memory row), R=1 and R=2 alternated round by round. Each
process's CPU per push (/proc, over the row's pushes, warm-up included) is split by the
share of its samples in each symbol, so the table reads in µs of CPU per push: what R=2's
primary spends beyond R=1's shard, function by function.

    /usr/bin/python3 bench/replication_profile.py [--rounds 3] [--seconds 3] [--mode socket|shm]
                                                  [--name replication_profile]

Writes NAME.json and NAME.md (bench/results by default).
Needs perf. Every process is started here and stopped by its handle.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import replication as R  # noqa: E402
from common.util import median, write_json  # noqa: E402


def perf_symbols(path):
    """{(dso, symbol): share of the samples} of one perf.data."""
    out = subprocess.run(["perf", "report", "-i", path, "--stdio", "--no-children", "--sort", "dso,sym",
                          "--percent-limit", "0.3", "-q"], capture_output=True, text=True).stdout
    shares = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[[^\]]+\]\s+(.*)$", line)
        if m:
            shares[(m.group(2), m.group(3).strip())] = float(m.group(1)) / 100
    return shares


def wait_for_io_thread(pid, timeout=30):
    """Until process `pid` has its ZeroMQ I/O thread: perf follows only the threads there are
    when it attaches."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/comm") as f:
                    if f.read().startswith("ZMQbg/IO"):
                        return
            except OSError:  # the thread ended meanwhile
                pass
        time.sleep(0.05)
    raise R.L.RunError(f"process {pid} started no ZeroMQ I/O thread within {timeout} s")


def profiled_row(build, c, tmp, tag, where, pids, seconds, mode):
    """The 4 MB push row with perf recording each of `pids` ({name: pid}); per process its
    CPU per push and its symbols' shares."""
    perfs = {}
    for name, pid in pids.items():
        wait_for_io_thread(pid)
        data = os.path.join(tmp, f"{tag}-{name}.perf")
        perfs[name] = (data, subprocess.Popen(["perf", "record", "-e", "cpu-clock", "-F", "1999", "-p", str(pid),
                                               "-o", data, "-q"], stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))
    cpu0 = {n: R.cpu_seconds(p) for n, p in pids.items()}
    row = R.pushpull(build, c, tmp, tag, where, 1048576, 8, seconds, mode=mode)
    cpu1 = {n: R.cpu_seconds(p) for n, p in pids.items()}
    out = {"mb_per_s": row["mb_per_s"], "client_cpu_us": row["client_cpu_us_per_iteration"], "procs": {}}
    for name, (data, proc) in perfs.items():
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        cpu_us = (cpu1[name] - cpu0[name]) / row["cpu_ops"] * 1e6
        shares = perf_symbols(data)
        out["procs"][name] = {"cpu_us_per_push": cpu_us,
                              "symbols_us": {f"{d} {s}": v * cpu_us for (d, s), v in shares.items()}}
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3)
    p.add_argument("--mode", choices=("socket", "shm"), default="socket",
                   help="the pushes over the socket, or through shared memory (the client offers every shard, "
                        "and an answering backup, a segment, as leash-worker does on one host)")
    p.add_argument("--name", default="replication_profile", help="writes NAME.json and NAME.md")
    a = p.parse_args()
    c = R.config(False)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="leash-replprof-") as tmp:
        for r in range(a.rounds):
            rnd = {"load_before": R.load()}
            for replicas in ((1, 2) if r % 2 == 0 else (2, 1)):
                tag = f"r{r}-R{replicas}"
                if replicas == 2:
                    cl = R.Replicated(a.build, tmp, tag, c["ttl"])
                    try:
                        pr = cl.primary()
                        pids = {"primary": cl.procs[pr["replica"]].pid, "backup": cl.procs[1 - pr["replica"]].pid}
                        rnd["R2"] = profiled_row(a.build, c, tmp, tag, ["--etcd", cl.etcd.url, "--job", cl.job],
                                                 pids, a.seconds, a.mode)
                    finally:
                        cl.stop()
                else:
                    cl = R.Single(a.build, tmp, tag)
                    try:
                        rnd["R1"] = profiled_row(a.build, c, tmp, tag, ["--servers", cl.endpoint],
                                                 {"shard": cl.proc.pid}, a.seconds, a.mode)
                    finally:
                        cl.stop()
            print(f"round {r + 1}/{a.rounds}: R=1 {rnd['R1']['mb_per_s']:.0f} MB/s, shard "
                  f"{rnd['R1']['procs']['shard']['cpu_us_per_push']:.0f} us/push; R=2 {rnd['R2']['mb_per_s']:.0f} MB/s, "
                  f"primary {rnd['R2']['procs']['primary']['cpu_us_per_push']:.0f}, backup "
                  f"{rnd['R2']['procs']['backup']['cpu_us_per_push']:.0f} us/push; the client "
                  f"{rnd['R1']['client_cpu_us']:.0f} -> {rnd['R2']['client_cpu_us']:.0f} us/push", flush=True)
            rounds.append(rnd)

    def med(get):
        return median([get(x) for x in rounds])

    syms = {}
    for who, proc in (("R1", "shard"), ("R2", "primary"), ("R2", "backup")):
        names = set()
        for x in rounds:
            names |= set(x[who]["procs"][proc]["symbols_us"])
        for n in names:
            syms.setdefault(n, {})[f"{who} {proc}"] = med(lambda x: x[who]["procs"][proc]["symbols_us"].get(n, 0.0))
    res = {"rounds": rounds, "seconds": a.seconds, "mode": a.mode,
           "median": {"R1_mb_per_s": med(lambda x: x["R1"]["mb_per_s"]), "R2_mb_per_s": med(lambda x: x["R2"]["mb_per_s"]),
                      "R1_shard_cpu_us": med(lambda x: x["R1"]["procs"]["shard"]["cpu_us_per_push"]),
                      "R2_primary_cpu_us": med(lambda x: x["R2"]["procs"]["primary"]["cpu_us_per_push"]),
                      "R2_backup_cpu_us": med(lambda x: x["R2"]["procs"]["backup"]["cpu_us_per_push"]),
                      "R1_client_cpu_us": med(lambda x: x["R1"]["client_cpu_us"]),
                      "R2_client_cpu_us": med(lambda x: x["R2"]["client_cpu_us"])},
           "symbols_us_per_push": syms}
    write_json(os.path.join(a.out, a.name + ".json"), res)
    m = res["median"]
    path = "over the socket" if a.mode == "socket" else "through shared memory"
    md = [f"# Where a replicated primary's CPU goes: the 4 MB push row {path}, R=1 against R=2", "",
          f"`bench/replication_profile.py --rounds {a.rounds} --seconds {a.seconds:g} --mode {a.mode}`: "
          f"leash-bench-pushpull pushing 4 MB at 8 in flight {path}, R=1's shard and R=2's primary and backup "
          "under `perf record` "
          "(cpu-clock), R=1 and R=2 alternated. Each process's CPU per push (/proc, warm-up included) split by its "
          "samples' shares; medians over rounds. perf's own sampling adds a little to every process.", "",
          f"R=1 {m['R1_mb_per_s']:.0f} MB/s, shard {m['R1_shard_cpu_us']:.0f} µs of CPU per push; R=2 "
          f"{m['R2_mb_per_s']:.0f} MB/s, primary {m['R2_primary_cpu_us']:.0f} µs, backup {m['R2_backup_cpu_us']:.0f} µs. "
          f"The pushing client (not profiled): {m['R1_client_cpu_us']:.0f} µs of CPU per push at R=1, "
          f"{m['R2_client_cpu_us']:.0f} at R=2.",
          "", "| symbol | R=1 shard µs/push | R=2 primary µs/push | primary - shard | R=2 backup µs/push |",
          "|---|---|---|---|---|"]
    order = sorted(syms.items(), key=lambda kv: -max(kv[1].values()))
    for n, v in order[:30]:
        a1, p2, b2 = (v.get(k, 0.0) for k in ("R1 shard", "R2 primary", "R2 backup"))
        md.append(f"| `{n}` | {a1:.0f} | {p2:.0f} | {p2 - a1:+.0f} | {b2:.0f} |")
    with open(os.path.join(a.out, a.name + ".md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()

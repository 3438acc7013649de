#!/usr/bin/env python3
"""Training samples/s across network namespaces (veth through a bridge) against loopback,
interleaved in the same run.

The job of the multi-host test (tests/multihost_test.cc) without its faults: 2 shards and
2 workers training the MLP on 6000 Fashion-MNIST samples in chunks of 500, staleness 1,
CURVE on. "veth": each process on a host of its own (a network namespace wired to a bridge
in a fifth, each with a private /dev/shm), real TCP between 10.231.0.x addresses. "loopback":
the same processes and flags in this namespace over 127.0.0.1, the workers with --no-shm
(the veth hosts share no /dev/shm), so the two differ only in the network path. Rounds
alternate the order (veth loopback, loopback veth, ...). The cluster's samples/s is every
worker's samples over the job's wall time (the last worker's), as bench/common/leash.py.

Needs root (ip netns, unshare, mount). Every namespace it creates is removed when it
ends, whatever happens; namespaces of an earlier run that was killed are removed first.

Usage: sudo bench/multihost.py [--build build] [--rounds 5] [--epochs 3] [--timeout 300] [--out bench/results]
Writes multihost.json and multihost.md under --out, with the load average around each run. A
job that fails or outlasts --timeout is recorded as such (its logs kept under
--out/multihost_failed/) and the rounds go on.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.leash import MODEL_FLAGS, RunError, _bin, _read_metrics  # noqa: E402
from common.util import free_port, stop, write_json  # noqa: E402

PREFIX = "lshb"  # namespaces lshb<pid>-sw, lshb<pid>-h<i>


def sh(*cmd, check=True):
    p = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and p.returncode != 0:
        raise RunError(f"{' '.join(cmd)}: {p.stdout.strip()}")
    return p.stdout


class Hosts:
    """n network namespaces with 10.231.0.<i+1>/24 on eth0, on a bridge in a fifth."""

    def __init__(self, n):
        self.n = n
        self.prefix = f"{PREFIX}{os.getpid()}-"

    def ns(self, i):
        return f"{self.prefix}h{i}"

    @staticmethod
    def address(i):
        return f"10.231.0.{i + 1}"

    def __enter__(self):
        self.remove_stale()
        sw = self.prefix + "sw"
        try:
            sh("ip", "netns", "add", sw)
            sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", sw, "link", "set", "br0", "up")
            for i in range(self.n):
                p = f"p{i}"
                sh("ip", "netns", "add", self.ns(i))
                sh("ip", "link", "add", "eth0", "netns", self.ns(i), "type", "veth", "peer", "name", p, "netns", sw)
                sh("ip", "-n", sw, "link", "set", p, "master", "br0")
                sh("ip", "-n", sw, "link", "set", p, "up")
                sh("ip", "-n", self.ns(i), "addr", "add", self.address(i) + "/24", "dev", "eth0")
                sh("ip", "-n", self.ns(i), "link", "set", "eth0", "up")
                sh("ip", "-n", self.ns(i), "link", "set", "lo", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for i in range(self.n):
            sh("ip", "netns", "del", self.ns(i), check=False)
        sh("ip", "netns", "del", self.prefix + "sw", check=False)
        left = [n for n in sh("ip", "netns", "list", check=False).split() if n.startswith(self.prefix)]
        if left:
            print(f"multihost.py: namespaces left behind: {left}", file=sys.stderr)

    def on(self, i, argv):
        """argv run on host i: its network namespace, a mount namespace with a private
        64 MB /dev/shm; each wrapper execs the next, so the Popen's pid is the program's."""
        return ["ip", "netns", "exec", self.ns(i), "unshare", "--mount", "--propagation", "private", "/bin/sh",
                "-c", 'mount -t tmpfs -o size=64m leash-shm /dev/shm && exec "$@"', "sh"] + list(argv)

    def remove_stale(self):
        for name in sh("ip", "netns", "list", check=False).split():
            if not name.startswith(PREFIX) or "-" not in name:
                continue
            pid = name[len(PREFIX):name.index("-")]
            if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
                sh("ip", "netns", "del", name, check=False)


def run_job(build, tmp, tag, keys, epochs, timeout, hosts=None):
    """2 shards and 2 workers; on `hosts` (veth) or on loopback. The cluster's samples/s."""
    if hosts:
        endpoints = [f"tcp://{Hosts.address(i)}:7000" for i in range(2)]
        wrap = hosts.on
    else:
        endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
        wrap = None
    procs, logs, metrics = [], [], []
    load_before = os.getloadavg()[0]
    try:
        for i, ep in enumerate(endpoints):
            argv = [_bin(build, "server", "leash-server"), "--shard", str(i), "--num-shards", "2", "--bind", ep,
                    "--data-dir", os.path.join(tmp, f"{tag}-shard{i}"), "--checkpoint-interval", "0", "--no-sync",
                    "--log-level", "warn", "--curve-keys", keys]
            lf = open(os.path.join(tmp, f"{tag}-shard{i}.log"), "w")
            logs.append(lf)
            procs.append(subprocess.Popen(wrap(i, argv) if wrap else argv, stdout=lf, stderr=subprocess.STDOUT))
        workers = []
        for w in range(2):
            metrics.append(os.path.join(tmp, f"{tag}-w{w}.json"))
            argv = [_bin(build, "worker", "leash-worker"), "--servers", ",".join(endpoints), "--name", f"w{w}",
                    "--curve-keys", keys, "--curve-client", f"w{w}", "--epochs", str(epochs), "--batch", "64",
                    "--threads", "1", "--device", "cpu", "--chunk-size", "500", "--train-limit", "6000",
                    "--staleness", "1", "--no-eval", "--log-every", "0", "--no-shm",
                    "--metrics-out", metrics[-1]] + MODEL_FLAGS["mlp"]
            lf = open(os.path.join(tmp, f"{tag}-w{w}.log"), "w")
            logs.append(lf)
            workers.append(subprocess.Popen(wrap(2 + w, argv) if wrap else argv, stdout=lf, stderr=subprocess.STDOUT))
            procs.append(workers[-1])
        deadline = time.monotonic() + timeout
        for w, p in enumerate(workers):
            try:
                rc = p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RunError(f"{tag}: worker {w} still running after {timeout} s")
            if rc != 0:
                raise RunError(f"{tag}: worker {w} exited {rc}")
    finally:
        for p in reversed(procs):
            stop(p)
        for lf in logs:
            lf.close()
    ms = [_read_metrics(m) for m in metrics]
    samples = sum(e["samples"] for m in ms for e in m["epochs"])
    seconds = max(m["epochs"][-1]["elapsed_seconds"] for m in ms if m["epochs"])
    return {"samples_per_second": samples / seconds, "job_seconds": seconds,
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--timeout", type=int, default=300, help="seconds a job may take before it counts as stalled")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("multihost.py: needs root (network and mount namespaces)")
    tmp = tempfile.mkdtemp(prefix="leash-multihost-")
    keys = os.path.join(tmp, "keys")
    sh(_bin(args.build, "tools", "leashctl"), "keygen", keys, "--server", "--client", "w0,w1")
    rows = {"veth": [], "loopback": []}
    try:
        with Hosts(4) as hosts:
            for r in range(args.rounds):
                order = ["veth", "loopback"] if r % 2 == 0 else ["loopback", "veth"]
                for which in order:
                    tag = f"{which}{r}"
                    load = os.getloadavg()[0]
                    try:
                        got = run_job(args.build, tmp, tag, keys, args.epochs, args.timeout,
                                      hosts if which == "veth" else None)
                    except RunError as e:
                        # Kept for the report: the logs of a job that failed or stalled.
                        kept = os.path.join(args.out, "multihost_failed", tag)
                        os.makedirs(kept, exist_ok=True)
                        for f in os.listdir(tmp):
                            if f.startswith(tag + "-") and f.endswith(".log"):
                                shutil.copy(os.path.join(tmp, f), kept)
                        got = {"failed": str(e), "logs": kept, "load_before": round(load, 2),
                               "load_after": round(os.getloadavg()[0], 2)}
                    rows[which].append(got)
                    print(f"[round {r + 1}/{args.rounds}] {which}: "
                          f"{got.get('samples_per_second', 0):.0f} samples/s {got.get('failed', '')}"
                          f"(load {got['load_before']} -> {got['load_after']})", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(x["samples_per_second"] for x in v if "failed" not in x) for k, v in rows.items()}
    per_round = [v["samples_per_second"] / l["samples_per_second"] if "failed" not in v and "failed" not in l
                 else None for v, l in zip(rows["veth"], rows["loopback"])]
    result = {"benchmark": "multihost", "job": "MLP, 2 shards + 2 workers, 6000 samples, chunks of 500, "
              f"staleness 1, CURVE, no shared memory, {args.epochs} epochs", "cores": os.cpu_count(),
              "rounds": rows, "median_samples_per_second": med, "veth_over_loopback_median": med["veth"] / med["loopback"],
              "veth_over_loopback_per_round": per_round}
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "multihost.json"), result)
    with open(os.path.join(args.out, "multihost.md"), "w") as f:
        f.write(f"# Training across network namespaces (veth) against loopback\n\n{result['job']}; "
                f"{args.rounds} interleaved rounds on {os.cpu_count()} cores.\n\n"
                "| round | veth samples/s | loopback samples/s | veth / loopback | load average (veth, loopback) |\n"
                "|---|---|---|---|---|\n")
        def cell(x):
            return f"{x['samples_per_second']:.0f}" if "failed" not in x else f"failed: {x['failed']}"

        for r, (v, l) in enumerate(zip(rows["veth"], rows["loopback"])):
            ratio = f"{per_round[r]:.2f}" if per_round[r] is not None else "-"
            f.write(f"| {r + 1} | {cell(v)} | {cell(l)} | {ratio} | "
                    f"{v['load_before']}-{v['load_after']}, {l['load_before']}-{l['load_after']} |\n")
        f.write(f"| median | {med['veth']:.0f} | {med['loopback']:.0f} | **{result['veth_over_loopback_median']:.2f}** | |\n")
    print(json.dumps({"median": med, "ratio": result["veth_over_loopback_median"]}))


if __name__ == "__main__":
    main()

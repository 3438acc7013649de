#!/usr/bin/env python3
"""Fault measurements on a real local cluster (issue 3):

  stall     how long bulk-synchronous survivors stall after a worker is killed with
            SIGKILL, against the shards' lease timeout (several runs: median and max);
  accuracy  final test accuracy of a job with one of three workers killed halfway,
            against the same job undisturbed;
  lost      updates lost when a shard is killed with SIGKILL and restarted, against its
            checkpoint interval (clocks between the kill and the recovered snapshot).

Writes bench/results/faults.json and bench/results/faults.md.
Usage: bench/faults.py [--build build] [--only stall,accuracy,lost] [--repeats 3]
"""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, build, shards, server_flags, tmp):
        self.build, self.tmp, self.flags = build, tmp, server_flags
        self.endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(shards)]
        self.servers = ",".join(self.endpoints)
        self.shards = [None] * shards
        self.workers = {}
        for i in range(shards):
            self.start_shard(i)

    def start_shard(self, i):
        log = open(os.path.join(self.tmp, f"shard{i}.log"), "a")
        self.shards[i] = subprocess.Popen(
            [os.path.join(self.build, "server", "leash-server"), f"--shard={i}", f"--num-shards={len(self.endpoints)}",
             f"--bind={self.endpoints[i]}", f"--data-dir={self.tmp}/shard{i}", "--no-sync"] + self.flags,
            stdout=log, stderr=log)

    def start_worker(self, name, flags):
        log = open(os.path.join(self.tmp, f"{name}.log"), "w")
        self.workers[name] = subprocess.Popen(
            [os.path.join(self.build, "worker", "leash-worker"), f"--servers={self.servers}", f"--name={name}",
             f"--metrics-out={self.tmp}/{name}.json", "--log-every=0"] + flags, stdout=log, stderr=log)

    def status(self):
        r = subprocess.run([os.path.join(self.build, "tools", "leashctl"), f"--servers={self.servers}", "--timeout=5",
                            "--json", "status"], capture_output=True, text=True)
        if r.returncode != 0:
            return None
        return json.loads(r.stdout)["shards"]

    def min_clock(self):
        s = self.status()
        return min(x["min_clock"] for x in s) if s else -1

    def wait(self, pred, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if pred():
                return True
            time.sleep(0.01)
        return False

    def stop(self):
        for p in list(self.workers.values()) + [s for s in self.shards if s]:
            if p.poll() is None:
                p.kill()
                p.wait()


def metric(tmp, name, key):
    with open(os.path.join(tmp, f"{name}.json")) as f:
        return json.load(f)["epochs"][-1][key]


def stall(args, leases):
    runs = {}
    for lease in leases:
        runs[lease] = []
        for r in range(args.repeats):
            tmp = tempfile.mkdtemp(prefix="leash-faults-")
            c = Cluster(args.build, 2, [f"--lease-timeout={lease}ms", "--checkpoint-interval=0"], tmp)
            try:
                for i in range(3):
                    c.start_worker(f"w{i}", ["--staleness=0", "--epochs=100", "--train-limit=6000", "--no-eval",
                                             "--chunk-size=250"])
                assert c.wait(lambda: c.min_clock() >= 30, 120), "workers did not start training"
                c.workers["w2"].kill()
                t0 = time.time()
                dead = [w["clock"] for w in c.status()[0]["workers"] if w["name"] == "w2"][0]
                assert c.wait(lambda: c.min_clock() > dead, 60), "survivors never resumed"
                ms = (time.time() - t0) * 1000
                runs[lease].append(ms)
                print(f"  lease {lease} ms run {r + 1}: survivors resumed after {ms:.0f} ms", flush=True)
            finally:
                c.stop()
                shutil.rmtree(tmp, ignore_errors=True)
    return {str(l): {"runs_ms": v, "median_ms": statistics.median(v), "max_ms": max(v),
                     "median_over_lease": statistics.median(v) / l} for l, v in runs.items()}


def accuracy(args):
    out = {"undisturbed": [], "killed_halfway": []}
    for r in range(args.repeats):
        for mode in ("undisturbed", "killed_halfway"):
            tmp = tempfile.mkdtemp(prefix="leash-faults-")
            c = Cluster(args.build, 2, ["--lease-timeout=2s", "--checkpoint-interval=0"], tmp)
            try:
                for i in range(3):
                    c.start_worker(f"w{i}", ["--staleness=2", "--epochs=3"])
                if mode == "killed_halfway":
                    def halfway():
                        s = c.status()
                        return s and (s[0]["epochs_done"] * 2 + (2 * s[0]["chunks_done"] >= s[0]["num_chunks"] > 0)) >= 3
                    assert c.wait(halfway, 300)
                    c.workers["w2"].kill()
                for name in ("w0", "w1"):
                    assert c.workers[name].wait(600) == 0
                acc = max(metric(tmp, "w0", "test_accuracy"), metric(tmp, "w1", "test_accuracy"))
                out[mode].append(acc)
                print(f"  {mode} run {r + 1}: final test accuracy {acc * 100:.2f}%", flush=True)
            finally:
                c.stop()
                shutil.rmtree(tmp, ignore_errors=True)
    return {k: {"runs": v, "median": statistics.median(v)} for k, v in out.items()}


def lost(args, intervals):
    out = {}
    for interval in intervals:
        out[interval] = []
        for r in range(args.repeats):
            tmp = tempfile.mkdtemp(prefix="leash-faults-")
            c = Cluster(args.build, 2, ["--lease-timeout=5s", f"--checkpoint-interval={interval}ms"], tmp)
            try:
                for i in range(2):
                    c.start_worker(f"w{i}", ["--staleness=1", "--epochs=100", "--train-limit=6000", "--no-eval"])
                assert c.wait(lambda: c.min_clock() >= 50, 120)
                time.sleep(interval / 1000 * (1.0 + 0.37 * r) + 0.5)  # kill at varying points of the period
                s1 = c.status()[1]
                rate_t0, rate_c0 = time.time(), s1["min_clock"]
                time.sleep(0.5)
                s1 = c.status()[1]
                rate = (s1["min_clock"] - rate_c0) / (time.time() - rate_t0)
                at_kill = s1["min_clock"]
                c.shards[1].kill()
                c.shards[1].wait()
                c.start_shard(1)
                log_path = os.path.join(tmp, "shard1.log")
                assert c.wait(lambda: "recovered snapshot" in open(log_path).read(), 30)
                rec = int(re.findall(r"recovered snapshot #\d+ from \S+ at clock (\d+)", open(log_path).read())[-1])
                lost_clocks = max(0, at_kill - rec)
                # Shard 1 holds rows of 3 tables; each clock every worker pushes to each of them.
                out[interval].append({"clock_at_kill": at_kill, "recovered_clock": rec, "lost_clocks": lost_clocks,
                                      "lost_pushes": lost_clocks * 2 * 3, "lost_seconds": lost_clocks / max(rate, 1e-9),
                                      "clocks_per_second": rate})
                print(f"  interval {interval} ms run {r + 1}: lost {lost_clocks} clocks "
                      f"({lost_clocks / max(rate, 1e-9):.2f} s of training)", flush=True)
            finally:
                c.stop()
                shutil.rmtree(tmp, ignore_errors=True)
    return {str(k): {"runs": v, "median_lost_seconds": statistics.median(x["lost_seconds"] for x in v),
                     "max_lost_seconds": max(x["lost_seconds"] for x in v)} for k, v in out.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--only", default="stall,accuracy,lost")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    res = {"benchmark": "faults", "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "nproc": os.cpu_count()}
    md = ["# Fault measurements\n", f"{os.cpu_count()} cores, {args.repeats} runs per setting.\n"]
    parts = args.only.split(",")
    if "stall" in parts:
        print("stall after a killed worker (3 workers, staleness 0):", flush=True)
        res["stall"] = stall(args, [1000, 2000, 4000])
        md.append("## Survivors' stall after SIGKILL of one of 3 bulk-synchronous workers\n")
        md.append("| lease timeout | median stall | max stall | median / lease |\n|---|---|---|---|")
        for lease, v in res["stall"].items():
            md.append(f"| {lease} ms | {v['median_ms']:.0f} ms | {v['max_ms']:.0f} ms | {v['median_over_lease']:.2f} |")
        md.append("")
    if "accuracy" in parts:
        print("accuracy with a worker killed halfway (3 workers, 3 epochs, full Fashion-MNIST):", flush=True)
        res["accuracy"] = accuracy(args)
        a = res["accuracy"]
        md.append("## Final test accuracy, 3 workers, 3 epochs, staleness 2\n")
        md.append("| job | median | runs |\n|---|---|---|")
        for k in ("undisturbed", "killed_halfway"):
            md.append(f"| {k.replace('_', ' ')} | {a[k]['median'] * 100:.2f}% | "
                      f"{', '.join(f'{x * 100:.2f}%' for x in a[k]['runs'])} |")
        md.append("")
    if "lost" in parts:
        print("updates lost when a shard is killed:", flush=True)
        res["lost"] = lost(args, [1000, 2000, 5000])
        md.append("## Updates lost when a shard is SIGKILLed and restarted (2 workers)\n")
        md.append("| checkpoint interval | median lost | max lost | lost clocks per run |\n|---|---|---|---|")
        for k, v in res["lost"].items():
            md.append(f"| {k} ms | {v['median_lost_seconds']:.2f} s of training | {v['max_lost_seconds']:.2f} s | "
                      f"{', '.join(str(x['lost_clocks']) for x in v['runs'])} |")
        md.append("")
    with open(os.path.join(args.out, "faults.json"), "w") as f:
        json.dump(res, f, indent=2)
    with open(os.path.join(args.out, "faults.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What the cores can give the persistent-straggler job: CPU per sample, solo and clustered.

Issue 17 holds the 3 workers + 1 shard cluster against the sum of the workers' solo speeds.
On a machine with fewer cores than processes that sum can exceed what the cores compute at
all. This measures the least CPU a trained sample takes and so the most samples/s the machine
can give (its cores over that CPU), against what the cluster gets and how many cores it
keeps busy.

Each round runs, in alternating order, the model (the MLP, or --model cnn) as
  solo     1 worker + 1 shard at staleness 0 (a fast worker's solo job), and
  cluster  3 workers + 1 shard, w2 at --step-delay-factor 3, the given mode (default:
           proportional work at s=0, --global-batch 192),
each for 1 and for N epochs of --samples (60,000); the CPU time of all the job's processes
(user + system, from the children's rusage) over the extra samples of the longer run is the
CPU per sample with start-up, data loading and the last evaluation taken out. Reported per
round and as medians: that CPU, the samples/s and cores kept busy of the longer run, and
the machine's limit (cores / solo CPU per sample).

Usage: bench/cpu_per_sample.py [--build build] [--rounds 3] [--epochs 5] [--mode proportional_s0]
                               [--model mlp|cnn] [--samples 60000] [--out bench/results]
                               [--name cpu_per_sample]
"""
import argparse
import os
import resource
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import leash as L  # noqa: E402
from common.util import write_json  # noqa: E402
from straggler_bench import FACTOR, MODES  # noqa: E402

SAMPLES = 60000
# The longer run's extra CPU must dwarf the start-up's spread between runs (about 0.1 s).
MIN_EXTRA_CPU_SECONDS = 2.0


def job(build, tmp, tag, model, samples, workers, staleness, wargs, sargs, epochs):
    """One job; returns (samples, CPU seconds of its processes, wall seconds, samples/s)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    out = L.run_cluster(build, tmp, model, epochs, tag, shards=1, workers=workers, staleness=staleness,
                        delay_factors=[1] * (workers - 1) + [FACTOR] if workers > 1 else [1],
                        train_limit=samples, timeout=900, worker_args=wargs, server_args=sargs,
                        per_worker_args=lambda i: ["--no-eval"])
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    trained = sum(e["samples"] for m in out["metrics"] for e in m["epochs"])
    return trained, cpu, wall, out["samples_per_second"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=5, help="the longer run's epochs (the shorter has 1)")
    ap.add_argument("--mode", default="proportional_s0", help="the cluster's straggler_bench mode")
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    ap.add_argument("--samples", type=int, default=SAMPLES, help="training samples per epoch")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="cpu_per_sample")
    a = ap.parse_args()
    if a.rounds < 1 or a.epochs < 2 or not 640 <= a.samples <= SAMPLES:
        ap.error(f"--rounds >= 1, --epochs >= 2, --samples in [640, {SAMPLES}]")
    if a.mode not in MODES:
        ap.error(f"--mode: unknown {a.mode}; known: {', '.join(MODES)}")
    label, staleness, wargs, sargs = MODES[a.mode]
    cores = os.cpu_count()
    kinds = {"solo": (1, 0, [], []), "cluster": (3, staleness, wargs, sargs)}
    rounds = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="leash-cpu-") as tmp:
        for r in range(a.rounds):
            load = os.getloadavg()[0]
            row = {"round": r + 1, "load_before": load}
            for kind in (("solo", "cluster") if r % 2 == 0 else ("cluster", "solo")):
                w, s, wa, sa = kinds[kind]
                short = job(a.build, tmp, f"{kind}-{r}-1", a.model, a.samples, w, s, wa, sa, 1)
                long_ = job(a.build, tmp, f"{kind}-{r}-{a.epochs}", a.model, a.samples, w, s, wa, sa, a.epochs)
                extra = long_[0] - short[0]
                if long_[1] - short[1] < MIN_EXTRA_CPU_SECONDS:
                    print(f"warning: {kind}'s longer run took only {long_[1] - short[1]:.2f} s more CPU: "
                          f"start-up varies by about 0.1 s, so its CPU per sample is noise; raise --samples "
                          f"or --epochs", file=sys.stderr, flush=True)
                row[kind] = {"cpu_us_per_sample": (long_[1] - short[1]) / extra * 1e6,
                             "samples_per_second": long_[3], "cores_busy": long_[1] / long_[2],
                             "samples": [short[0], long_[0]], "cpu_seconds": [short[1], long_[1]],
                             "wall_seconds": [short[2], long_[2]]}
            row["machine_limit_samples_per_second"] = cores / (row["solo"]["cpu_us_per_sample"] * 1e-6)
            row["cluster_over_limit"] = row["cluster"]["samples_per_second"] / row["machine_limit_samples_per_second"]
            rounds.append(row)
            print(f"round {r + 1}/{a.rounds} (load {load:.1f}): CPU per sample solo "
                  f"{row['solo']['cpu_us_per_sample']:.1f} us, cluster {row['cluster']['cpu_us_per_sample']:.1f} us; "
                  f"limit {row['machine_limit_samples_per_second']:.0f}/s, cluster "
                  f"{row['cluster']['samples_per_second']:.0f}/s ({row['cluster_over_limit']:.2f}x) on "
                  f"{row['cluster']['cores_busy']:.2f} cores", flush=True)

    def med(f):
        return statistics.median(f(x) for x in rounds)
    summary = {
        "solo_cpu_us_per_sample": med(lambda x: x["solo"]["cpu_us_per_sample"]),
        "cluster_cpu_us_per_sample": med(lambda x: x["cluster"]["cpu_us_per_sample"]),
        "solo_samples_per_second": med(lambda x: x["solo"]["samples_per_second"]),
        "cluster_samples_per_second": med(lambda x: x["cluster"]["samples_per_second"]),
        "solo_cores_busy": med(lambda x: x["solo"]["cores_busy"]),
        "cluster_cores_busy": med(lambda x: x["cluster"]["cores_busy"]),
        "machine_limit_samples_per_second": med(lambda x: x["machine_limit_samples_per_second"]),
        "cluster_over_limit": med(lambda x: x["cluster_over_limit"]),
    }
    res = {"benchmark": "cpu_per_sample", "model": a.model, "mode": a.mode, "label": label,
           "epochs": [1, a.epochs], "samples_per_epoch": a.samples, "cores": cores, "minutes": (time.time() - started) / 60,
           "summary": summary, "rounds": rounds}
    write_json(os.path.join(a.out, a.name + ".json"), res)
    loads = [x["load_before"] for x in rounds]
    s = summary
    per_round = ", ".join(f"{x['cluster_over_limit']:.2f}" for x in rounds)
    md = [f"# CPU per trained sample, solo and clustered ({a.rounds} rounds)", "",
          f"`bench/cpu_per_sample.py --rounds {a.rounds} --epochs {a.epochs} --mode {a.mode} --model {a.model} "
          f"--samples {a.samples}`: the {a.model.upper()}, 1 and {a.epochs} epochs of {a.samples} samples each; solo: 1 worker + 1 shard at s=0; cluster: 3 workers "
          f"+ 1 shard, w2 {FACTOR}x slower, {label}. CPU per sample: all the job's processes' CPU over the "
          f"longer run's extra samples. {cores} cores, load average before the rounds "
          f"{min(loads):.1f}-{max(loads):.1f}, {res['minutes']:.1f} min.", "",
          "| | solo | cluster |", "|---|---|---|",
          f"| CPU per sample (µs, median) | {s['solo_cpu_us_per_sample']:.1f} | {s['cluster_cpu_us_per_sample']:.1f} |",
          f"| samples/s ({a.epochs} epochs) | {s['solo_samples_per_second']:.0f} | {s['cluster_samples_per_second']:.0f} |",
          f"| cores kept busy | {s['solo_cores_busy']:.2f} | {s['cluster_cores_busy']:.2f} |", "",
          f"The machine's limit at a solo job's CPU per sample: {cores} cores / "
          f"{s['solo_cpu_us_per_sample']:.1f} µs = **{s['machine_limit_samples_per_second']:.0f} samples/s**; "
          f"the cluster reached **{s['cluster_over_limit']:.2f}x** of it (per round "
          f"{per_round})."]
    with open(os.path.join(a.out, a.name + ".md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()

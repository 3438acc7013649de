#!/usr/bin/python3
"""The Leash benchmark suite, one command:

  /usr/bin/python3 bench/run_all.py            # full (about 45 min on 2 cores)
  /usr/bin/python3 bench/run_all.py --quick    # smoke run (a few minutes), to bench/results/quick (gitignored)

Parts (--parts picks some):
  pushpull    leash-bench-pushpull against raw ZeroMQ (repeated; median ratios)
  training    Fashion-MNIST MLP and CNN: Leash 1 shard + 1 worker (staleness 0 and 1),
              the same worker in --local mode, PyTorch single-process, PyTorch DDP (gloo,
              2 processes), PyTorch Hogwild (2 processes), TensorFlow
              ParameterServerStrategy (1 PS + 2 workers); batch 64, 1 math thread per
              process; samples/s, test accuracy per epoch, time to 85%
  stragglers  bench/straggler_bench.py: 3 Leash workers (1 shard), one persistently 3x
              slower, MLP and CNN, under BSP, SSP(3), work in proportion to speed and 1
              backup worker, against the workers' solo speeds and PyTorch DDP; a transient
              straggler (a random worker 5x slower in 1 s spells); the staleness-0 cost
              against a raw ZeroMQ round trip plus the update
  durability  Leash 1 + 1 with snapshots every 1 s, every 10 s and off, runs of at least six
              10 s intervals: samples/s, each snapshot's pause, bytes per snapshot
  ctr         the click-through model on MovieLens-100k (bench/ctr_bench.py): Leash
              local, 1 + 1 and 2 + 2 against bench/torch_ctr.py: test AUC per epoch, samples/s
  replication bench/replication.py: replicated shards with a real etcd: acknowledged pushes
              lost per primary SIGKILL (R=2) against a restart from a snapshot (R=1), the
              stall from the kill to the new primary's first acknowledgement against the
              etcd lease TTL, and the cost of R=2 against R=1 (MLP 1+1, 4 KB and 4 MB
              pushes, interleaved) with the backup's CPU time per iteration (about 5 min)

Peers are interleaved (each repeat runs every system, in a rotated order) so machine
noise hits all alike; medians and ratios of medians are reported. Writes JSON per part,
suite.json, SUMMARY.md (targets with PASS/MISS) and PNG plots to --out (default
bench/results, or with --quick the gitignored bench/results/quick: a smoke run's
figures are not results; only the full run's summary, JSON and plots are checked in).
Needs a build with leash-server, leash-worker and leash-bench-pushpull (bench/run-all.sh builds them), Debian
python3-torch, numpy and matplotlib under /usr/bin/python3; TensorFlow is installed into
a venv by bench/setup-tf.sh (--no-tf skips it).
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import ctr_bench  # noqa: E402
import replication as replication_bench  # noqa: E402
import straggler_bench  # noqa: E402
from common import leash as L  # noqa: E402
from common.util import cpu_budget_us, iperf3_loopback, median, now, pyplot, time_to_accuracy, verdict, write_json  # noqa: E402

TARGET_ACC = 0.85
ALL_PARTS = ("pushpull", "training", "stragglers", "durability", "ctr", "replication")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- configuration

def config(quick):
    if quick:
        return {"repeats": 1, "pushpull_repeats": 1, "pushpull_seconds": 0.2, "pushpull_sizes": "1024,1048576",
                "mlp_epochs": 1, "cnn_epochs": 1, "train_limit": 6400, "cnn_train_limit": 1280, "test_limit": 2000,
                "durability_epochs": 2, "durability_train_limit": 12800, "durability_intervals": ["1s", "10s", "0"],
                "durability_repeats": 1,
                "ctr_epochs": 2, "timeout": 600}
    return {"repeats": 2, "pushpull_repeats": 3, "pushpull_seconds": 1.0, "pushpull_sizes": "1024,65536,1048576",
            "mlp_epochs": 3, "cnn_epochs": 1, "cnn_repeats": 1, "train_limit": 0, "cnn_train_limit": 30000, "test_limit": 0,
            # runs of at least six 10 s intervals: the epochs are set from a short calibration
            # run for about durability_seconds (the machine's speed varies with its load)
            "durability_epochs": 45, "durability_seconds": 80, "durability_train_limit": 0,
            "durability_intervals": ["1s", "10s", "0"], "durability_repeats": 2,
            "ctr_epochs": 5, "timeout": 1800}


# ---------------------------------------------------------------- part 1: push/pull

def part_pushpull(a, c, tmp):
    binary = os.path.join(a.build, "bench", "leash-bench-pushpull")
    runs = []
    for r in range(c["pushpull_repeats"]):
        out = os.path.join(tmp, f"pushpull{r}")
        os.makedirs(out, exist_ok=True)
        log(f"pushpull {r + 1}/{c['pushpull_repeats']}")
        # Every run measures Leash over the socket (one connection per shard, and the 4 MB
        # cells striped over 2) and with shared memory, raw ZeroMQ and the update alone, cell
        # by cell; the loopback TCP ceiling comes right after it.
        subprocess.run([binary, "--server-bin", os.path.join(a.build, "server", "leash-server"), "--sizes",
                        c["pushpull_sizes"], "--seconds", str(c["pushpull_seconds"]), "--modes", "socket,shm,striped2",
                        "--out", out], check=True, stdout=subprocess.DEVNULL, timeout=c["timeout"])
        with open(os.path.join(out, "pushpull.json")) as f:
            runs.append(json.load(f))
        tcp = iperf3_loopback(c["pushpull_seconds"], detail=True)
        runs[-1]["iperf3_loopback_MBps"] = tcp and tcp["mb_per_s"]
        # The CPU both ends of that stream used per 4 MiB moved: nearly all the kernel's copies.
        runs[-1]["iperf3_cpu_us_per_4MB"] = tcp and tcp["cpu_us_per_mb"] * 1048576 * 4 / 1e6
    last = os.path.join(tmp, f"pushpull{c['pushpull_repeats'] - 1}")
    for name in ("pushpull.json", "pushpull.md"):
        shutil.copy(os.path.join(last, name), os.path.join(a.out, name))

    def cell(run, system, op, floats, inflight, shards=1):
        for s in run["samples"]:
            if s["system"] == system and s["op"] == op and s["floats"] == floats and s["inflight"] == inflight \
                    and s["shards"] == shards:
                return s
        return None

    # The ceilings the targets use are a plain sender and receiver in two processes, each
    # with its own ZeroMQ context, as a worker and a shard are. The same-process figures
    # (both sockets on one context and its one I/O thread) are kept beside them: they skip
    # the second process's wake-up, which no shard can.
    def ratios(num, den):
        return [num(r) / den(r) for r in runs]

    def leash(op, floats, inflight, key, system="leash"):
        return lambda r: cell(r, system, op, floats, inflight)[key]

    def raw(op, floats, key, inflight=1):
        return lambda r: cell(r, "raw zmq", op, floats, inflight)[key]

    def update(floats):
        return lambda r: cell(r, "shard update", "momentum update", floats, 1)["p50_us"]

    leash_p50 = leash("push", 1024, 1, "p50_us")
    leash_mbps = leash("push", 1048576, 8, "mb_per_s")
    rtt2 = raw("round trip, 2 processes", 1024, "p50_us")
    rtt1 = raw("round trip", 1024, "p50_us")
    rtt256 = raw("round trip, 2 processes", 65536, "p50_us")
    one1 = raw("one-way", 1048576, "mb_per_s", 8)
    one2 = raw("one-way, 2 processes", 1048576, "mb_per_s", 8)
    res = {"runs": runs,
           "push_4KB_p50_over_raw_rtt": ratios(leash_p50, rtt2),
           "pull_4KB_p50_over_raw_rtt": ratios(leash("pull", 1024, 1, "p50_us"), rtt2),
           "push_4MB_8inflight_over_raw_oneway": ratios(leash_mbps, one2),
           "pull_4MB_8inflight_over_raw_oneway": ratios(leash("pull", 1048576, 8, "mb_per_s"), one2),
           "push_4KB_p50_over_raw_rtt_same_process": ratios(leash_p50, rtt1),
           "push_4MB_8inflight_over_raw_oneway_same_process": ratios(leash_mbps, one1),
           "leash_4KB_p50_us": median(leash_p50(r) for r in runs),
           "raw_rtt_4KB_p50_us": median(rtt2(r) for r in runs),
           "raw_rtt_4KB_p50_us_same_process": median(rtt1(r) for r in runs),
           "leash_4MB_push_MBps": median(leash_mbps(r) for r in runs),
           "raw_oneway_4MB_MBps": median(one2(r) for r in runs),
           "raw_oneway_4MB_MBps_same_process": median(one1(r) for r in runs),
           "iperf3_loopback_MBps": [r["iperf3_loopback_MBps"] for r in runs]}
    # Striped over 2 connections (leash-worker --stripes 2, the shard --io-threads 2): the
    # issue's way past one socket, against the same raw one-way and one connection.
    if all(cell(r, "leash striped 2", "push", 1048576, 8) for r in runs):
        striped = leash("push", 1048576, 8, "mb_per_s", "leash striped 2")
        res["push_4MB_8inflight_striped2_over_raw_oneway"] = ratios(striped, one2)
        res["push_4MB_8inflight_striped2_over_one_connection"] = ratios(striped, leash_mbps)
        res["pull_4MB_8inflight_striped2_over_one_connection"] = ratios(
            leash("pull", 1048576, 8, "mb_per_s", "leash striped 2"), leash("pull", 1048576, 8, "mb_per_s"))
        res["leash_4MB_push_striped2_MBps"] = median(striped(r) for r in runs)
    if all(cell(r, "shard update", "momentum update", 65536, 1) for r in runs):
        res["update_256KB_p50_us"] = median(update(65536)(r) for r in runs)
        for op in ("push", "pull"):
            upd = update(65536) if op == "push" else (lambda r: 0.0)
            res[f"{op}_256KB_p50_over_raw_rtt_plus_update"] = ratios(
                leash(op, 65536, 1, "p50_us"), lambda r, u=upd: rtt256(r) + u(r))
        # The same with the raw echo reading its payload once, as a shard must (rtt2check).
        chk256 = raw("round trip, 2 processes, payload checked", 65536, "p50_us")
        if all(cell(r, "raw zmq", "round trip, 2 processes, payload checked", 65536, 1) for r in runs):
            res["push_256KB_p50_over_raw_checked_rtt_plus_update"] = ratios(
                leash("push", 65536, 1, "p50_us"), lambda r: chk256(r) + update(65536)(r))
    if all(r["iperf3_loopback_MBps"] for r in runs):
        res["raw_oneway_4MB_over_iperf3"] = ratios(one2, lambda r: r["iperf3_loopback_MBps"])
    # The 4 MB target as a CPU budget (docs/network.md): a push's CPU per request (client and
    # shard), and what 1.5x raw one-way leaves per request at the cores the push kept busy
    # (its MB/s x its CPU per request), against bare TCP's CPU per request (iperf3).
    push4 = [cell(r, "leash", "push", 1048576, 8) for r in runs]
    if all(s and s.get("server_cpu_us", -1) >= 0 and s["client_cpu_us"] >= 0 for s in push4):
        cpu = [s["client_cpu_us"] + s["server_cpu_us"] for s in push4]
        res["push_4MB_8inflight_cpu_us"] = cpu
        res["target_4MB_cpu_budget_at_push_cores_us"] = [
            cpu_budget_us(s["mb_per_s"], u, 1.5 * one2(r)) for s, u, r in zip(push4, cpu, runs)]
        res["leash_4MB_push_cpu_us"] = median(cpu)
        res["target_4MB_cpu_budget_us"] = median(res["target_4MB_cpu_budget_at_push_cores_us"])
        if all(r.get("iperf3_cpu_us_per_4MB") for r in runs):
            res["iperf3_cpu_us_per_4MB"] = median(r["iperf3_cpu_us_per_4MB"] for r in runs)
    # Shared memory over socket, ops/s, every cell of both.
    shm = {}
    for s in runs[0]["samples"]:
        if s["system"] != "leash":
            continue
        key = f"{s['op']}_{s['floats'] * 4 // 1024}KB_{s['shards']}x{s['workers']}_{s['inflight']}inflight"
        try:
            shm[key] = median(ratios(
                lambda r, s=s: cell(r, "leash shm", s["op"], s["floats"], s["inflight"], s["shards"])["ops_per_s"],
                lambda r, s=s: cell(r, "leash", s["op"], s["floats"], s["inflight"], s["shards"])["ops_per_s"]))
        except TypeError:  # a run without that cell
            pass
    res["shm_over_socket_ops_per_s"] = shm
    for k in ("push_4KB_p50_over_raw_rtt", "pull_4KB_p50_over_raw_rtt", "push_4MB_8inflight_over_raw_oneway",
              "pull_4MB_8inflight_over_raw_oneway", "push_4KB_p50_over_raw_rtt_same_process",
              "push_4MB_8inflight_over_raw_oneway_same_process", "push_256KB_p50_over_raw_rtt_plus_update",
              "pull_256KB_p50_over_raw_rtt_plus_update", "push_256KB_p50_over_raw_checked_rtt_plus_update",
              "raw_oneway_4MB_over_iperf3", "push_4MB_8inflight_striped2_over_raw_oneway",
              "push_4MB_8inflight_striped2_over_one_connection", "pull_4MB_8inflight_striped2_over_one_connection"):
        if k in res:
            res["median_" + k] = median(res[k])
    write_json(os.path.join(a.out, "pushpull_suite.json"), res)
    return res


# ---------------------------------------------------------------- part 2: training

def tf_python(a):
    """The venv python with TensorFlow (bench/setup-tf.sh), or (None, why)."""
    if a.no_tf:
        return None, "skipped (--no-tf)"
    try:
        p = subprocess.run(["bash", os.path.join(HERE, "setup-tf.sh")], capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        return None, "bench/setup-tf.sh did not finish in 30 min"
    if p.returncode != 0:
        return None, "bench/setup-tf.sh failed: " + (p.stderr.strip().splitlines() or ["(no output)"])[-1]
    return p.stdout.strip().splitlines()[-1], None


def run_python_peer(cmd, out_json, log_path, timeout):
    with open(log_path, "w") as lf:
        rc = subprocess.run(cmd + ["--out", out_json], stdout=lf, stderr=subprocess.STDOUT, timeout=timeout).returncode
    if rc != 0:
        raise L.RunError(f"{' '.join(cmd[:3])} exited {rc} (log {log_path})")
    with open(out_json) as f:
        r = json.load(f)
    r["curve"] = [{"epoch": e["epoch"], "elapsed_seconds": e["elapsed_seconds"], "test_accuracy": e["test_accuracy"]}
                  for e in r["epochs"]]
    return r


def training_systems(a, c, model, tfpy):
    epochs = c["mlp_epochs"] if model == "mlp" else c["cnn_epochs"]
    train_limit = c["train_limit"] if model == "mlp" else c["cnn_train_limit"]
    test_limit = c["test_limit"]
    lim = (["--train-limit", str(train_limit)] if train_limit else []) + \
          (["--test-limit", str(test_limit)] if test_limit else [])
    torch_cmd = ["/usr/bin/python3", os.path.join(HERE, "torch_train.py"), "--model", model, "--epochs", str(epochs)] + lim
    systems = {}

    def leash_cluster(s, worker_args=()):
        return lambda tmp, tag: L.run_cluster(a.build, tmp, model, epochs, tag, staleness=s, train_limit=train_limit,
                                              test_limit=test_limit, timeout=c["timeout"], worker_args=worker_args)
    systems["leash 1+1 s=1"] = leash_cluster(1)
    if model == "mlp" or a.quick:
        systems["leash 1+1 s=0"] = leash_cluster(0)
        # The same with pulls and pushes in bf16 on the wire (half the bytes; the shard keeps
        # fp32 master values): shown beside the targets, which use the fp32 rows.
        systems["leash 1+1 s=1 bf16 wire"] = leash_cluster(1, ("--wire-dtype", "bf16"))
        # The worker and the shard share this host, so by default large frames go through
        # shared memory; this row sends everything through the loopback socket, as between
        # two hosts.
        systems["leash 1+1 s=1 socket"] = leash_cluster(1, ("--no-shm",))
    systems["leash local"] = lambda tmp, tag: L.run_local(a.build, tmp, model, epochs, tag, train_limit, test_limit,
                                                           timeout=c["timeout"])
    for mode, name in (("single", "torch single"), ("ddp", "torch DDP x2"), ("hogwild", "torch Hogwild x2")):
        systems[name] = (lambda m: lambda tmp, tag: run_python_peer(
            torch_cmd + ["--mode", m], os.path.join(tmp, tag + ".json"), os.path.join(tmp, tag + ".log"),
            c["timeout"]))(mode)
    if tfpy:
        systems["TF PS 1+2"] = lambda tmp, tag: run_python_peer(
            [tfpy, os.path.join(HERE, "tf_ps.py"), "--model", model, "--epochs", str(epochs)] + lim,
            os.path.join(tmp, tag + ".json"), os.path.join(tmp, tag + ".log"), c["timeout"])
    return systems, epochs


def part_training(a, c, tmp):
    tfpy, tf_why = tf_python(a)
    if tfpy:
        log(f"TensorFlow peer: {tfpy}")
    else:
        log(f"no TensorFlow peer: {tf_why}")
    res = {"tf_python": tfpy, "tf_unavailable": tf_why, "models": {}}
    models = a.models
    if len(models) < 2 and a.previous:
        # Some models only: the others keep their results from the last run in --out.
        for m, r in a.previous.get("training", {}).get("models", {}).items():
            if m not in models:
                res["models"][m] = r
                log(f"keeping the {m} training results from the last run")
    for model in models:
        systems, epochs = training_systems(a, c, model, tfpy)
        names = list(systems)
        runs = {n: [] for n in names}
        errors = {n: [] for n in names}
        repeats = c["repeats"] if model == "mlp" else c.get("cnn_repeats", c["repeats"])
        for r in range(repeats):
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                tag = f"{model}-{n.replace(' ', '_').replace('=', '').replace('+', 'p')}-{r}"
                log(f"training {model} {n} (repeat {r + 1}/{repeats})")
                try:
                    out = systems[n](tmp, tag)
                    out.pop("metrics", None)
                    runs[n].append(out)
                    accs = ", ".join(f"{p['test_accuracy']:.4f}" for p in out["curve"] if p["test_accuracy"] is not None)
                    log(f"    {out['samples_per_second']:.0f} samples/s, test accuracy per epoch {accs}")
                except Exception as e:  # keep the other systems' results
                    errors[n].append(f"{type(e).__name__}: {e}")
                    log(f"    FAILED: {e}")
        summary = {}
        for n in names:
            if not runs[n]:
                summary[n] = {"error": "; ".join(errors[n])}
                continue
            sps = [x["samples_per_second"] for x in runs[n]]
            t85 = [time_to_accuracy(x["curve"], TARGET_ACC) for x in runs[n]]
            final = [x["curve"][-1]["test_accuracy"] for x in runs[n]]
            med = median(sps)
            rep = min(runs[n], key=lambda x: abs(x["samples_per_second"] - med))  # the median run's curve
            summary[n] = {"median_samples_per_second": med, "samples_per_second": sps,
                          "median_time_to_85_seconds": median(t85) if all(t is not None for t in t85) else None,
                          "time_to_85_seconds": t85, "median_final_test_accuracy": median(final),
                          "final_test_accuracy": final, "curve": rep["curve"], "errors": errors[n]}
        limit = c["train_limit"] if model == "mlp" else c["cnn_train_limit"]
        res["models"][model] = {"epochs": epochs, "train_limit": limit, "repeats": repeats, "systems": summary,
                                "runs": runs}
        write_json(os.path.join(a.out, "training.json"), res)
    return res


# ---------------------------------------------------------------- part 3: stragglers

def part_stragglers(a, c, tmp):
    """Heterogeneous workers: persistent and transient stragglers, the solo speeds, PyTorch
    DDP beside them, and the staleness-0 cost against the physical limit
    (bench/straggler_bench.py)."""
    sc = straggler_bench.config(a.quick)
    if a.repeats is not None:
        sc["rounds"] = a.repeats
    return straggler_bench.run(a.build, sc, tmp, a.out, log)


# ---------------------------------------------------------------- part 4: durability

def part_durability(a, c, tmp):
    """Snapshot cost: 1 shard + 1 worker, MLP, runs of at least six of the longest interval,
    snapshots every 1 s, every 10 s and off, interleaved. Per run: samples/s, each
    snapshot's pause of the shard's request loop (its duration, from the shard's log) and the
    bytes the shard wrote (/proc/PID/io) per periodic snapshot."""
    intervals = c["durability_intervals"]
    if c.get("durability_seconds"):
        cal = L.run_cluster(a.build, tmp, "mlp", 2, "dur-calibration", staleness=1, checkpoint_interval="0",
                            train_limit=c["durability_train_limit"], no_eval=True, timeout=c["timeout"])
        per_epoch = c["durability_train_limit"] or 60000
        c["durability_epochs"] = max(6, min(200, int(c["durability_seconds"] * cal["samples_per_second"] / per_epoch) + 1))
        log(f"durability: calibration {cal['samples_per_second']:.0f} samples/s -> {c['durability_epochs']} epochs "
            f"for about {c['durability_seconds']} s per run")
    runs = {i: [] for i in intervals}
    errors = {i: [] for i in intervals}
    for r in range(c["durability_repeats"]):
        order = intervals[r % len(intervals):] + intervals[:r % len(intervals)]
        for i in order:
            log(f"durability: snapshots every {i} (0 = off) (repeat {r + 1}/{c['durability_repeats']})")
            load = os.getloadavg()[0]
            try:
                out = L.run_cluster(a.build, tmp, "mlp", c["durability_epochs"], f"dur-{i}-{r}", staleness=1,
                                    checkpoint_interval=i, train_limit=c["durability_train_limit"], no_eval=True,
                                    timeout=c["timeout"], shard_stats=True)
                out.pop("metrics")
                sh = out.pop("shards")[0]
                snaps = sh["snapshot_ms"]
                periodic = snaps[:-1]  # the last one is the final snapshot at exit
                out.update({"load_before": load, "periodic_snapshots": len(periodic), "snapshot_ms": periodic,
                            "exit_snapshot_ms": snaps[-1] if snaps else None,
                            "shard_write_bytes": sh["io_when_workers_done"].get("write_bytes"),
                            "shard_wchar": sh["io_when_workers_done"].get("wchar")})
                runs[i].append(out)
                log(f"    {out['samples_per_second']:.0f} samples/s over {out['job_seconds']:.1f} s, "
                    f"{len(periodic)} snapshots, pauses (ms) {[round(x, 1) for x in periodic]}, "
                    f"shard wrote {out['shard_write_bytes']} B (wchar {out['shard_wchar']})")
            except Exception as e:
                errors[i].append(f"{type(e).__name__}: {e}")
                log(f"    FAILED: {e}")
    med = {i: median(x["samples_per_second"] for x in runs[i]) for i in intervals}
    off = med.get("0")
    # Bytes per snapshot: what the shard wrote beyond the same round's run without snapshots
    # (its log), over the snapshots taken.
    off_by_round = {k: x for k, x in enumerate(runs.get("0", []))}
    summary = {}
    for i in intervals:
        per_snap = []
        for k, x in enumerate(runs[i]):
            o = off_by_round.get(k)
            if i != "0" and o and x["periodic_snapshots"] and x["shard_wchar"] is not None and o["shard_wchar"] is not None:
                per_snap.append((x["shard_wchar"] - o["shard_wchar"]) / x["periodic_snapshots"])
        pauses = [p for x in runs[i] for p in x["snapshot_ms"]]
        seconds = sum(x["job_seconds"] for x in runs[i])
        summary[i] = {"median_samples_per_second": med[i], "samples_per_second": [x["samples_per_second"] for x in runs[i]],
                      "median_job_seconds": median(x["job_seconds"] for x in runs[i]),
                      "job_seconds": [x["job_seconds"] for x in runs[i]],
                      "periodic_snapshots": [x["periodic_snapshots"] for x in runs[i]],
                      "median_snapshot_ms": median(pauses), "max_snapshot_ms": max(pauses) if pauses else None,
                      "paused_share": (sum(pauses) / 1e3 / seconds) if seconds else None,
                      "bytes_per_snapshot": per_snap, "median_bytes_per_snapshot": median(per_snap),
                      "load_before": [x["load_before"] for x in runs[i]],
                      "over_off": (med[i] / off) if med[i] and off else None,
                      "over_off_per_round": [x["samples_per_second"] / off_by_round[k]["samples_per_second"]
                                             for k, x in enumerate(runs[i]) if k in off_by_round],
                      "errors": errors[i]}
        summary[i]["median_over_off_per_round"] = median(summary[i]["over_off_per_round"])
    res = {"model": "mlp", "epochs": c["durability_epochs"], "train_limit": c["durability_train_limit"],
           "staleness": 1, "summary": summary, "runs": runs}
    write_json(os.path.join(a.out, "durability.json"), res)
    return res


# ---------------------------------------------------------------- summary and plots

def fmt(v, spec=".0f", none="—"):
    return none if v is None else format(v, spec)


def t85_median(entry, key="time_to_85_seconds"):
    """Median time to 85% over the runs that reached it, when at least half did."""
    ts = entry.get(key) or []
    reached = [t for t in ts if t is not None]
    return median(reached) if reached and 2 * len(reached) >= len(ts) else None


def part_ctr(a, c, tmp):
    """The click-through model on MovieLens-100k against its PyTorch twin (bench/ctr_bench.py)."""
    return ctr_bench.run(a.build, c["ctr_epochs"], 1, tmp, c["timeout"])


def part_replication(a, c, tmp):
    """Replicated shards through etcd (bench/replication.py): loss and stall per primary
    SIGKILL, and the cost of R=2 against R=1."""
    rc = replication_bench.config(a.quick)
    if a.repeats is not None:
        rc["rounds"] = a.repeats
    return replication_bench.run(a.build, rc, tmp, a.out, log)


def targets(res):
    rows = []
    pp = res.get("pushpull")
    if pp:
        m = pp["median_push_4KB_p50_over_raw_rtt"]
        rows.append(("4 KB push over the socket, 1 in flight: p50 <= 1.2x raw ZeroMQ RTT (2 processes)",
                     f"{m:.2f}x ({pp['leash_4KB_p50_us']:.0f} vs {pp['raw_rtt_4KB_p50_us']:.0f} us)",
                     *verdict(m, 1.2, False)))
        if "median_push_256KB_p50_over_raw_rtt_plus_update" in pp:
            m = pp["median_push_256KB_p50_over_raw_rtt_plus_update"]
            rows.append(("256 KB push over the socket, 1 in flight: p50 <= raw RTT + the shard's update "
                         f"({pp['update_256KB_p50_us']:.0f} us)", f"{m:.2f}x", *verdict(m, 1.0, False)))
        if "median_push_256KB_p50_over_raw_checked_rtt_plus_update" in pp:
            m = pp["median_push_256KB_p50_over_raw_checked_rtt_plus_update"]
            rows.append(("256 KB push, the intent: p50 <= raw RTT with the echo reading its payload once (as a shard "
                         "must, to check it) + the update (docs/network.md)", f"{m:.2f}x", *verdict(m, 1.0, False)))
        m = pp["median_push_4MB_8inflight_over_raw_oneway"]
        budget = ""
        if "target_4MB_cpu_budget_us" in pp:
            budget = (f"; CPU per push {pp['leash_4MB_push_cpu_us']:.0f} us, the target leaves "
                      f"{pp['target_4MB_cpu_budget_us']:.0f} at the cores the push keeps busy"
                      + (f", bare TCP takes {pp['iperf3_cpu_us_per_4MB']:.0f}" if "iperf3_cpu_us_per_4MB" in pp else ""))
        rows.append(("4 MB push over the socket, 8 in flight: >= 1.5x raw single-socket one-way (2 processes)",
                     f"{m:.2f}x ({pp['leash_4MB_push_MBps']:.0f} vs {pp['raw_oneway_4MB_MBps']:.0f} MB/s{budget})",
                     *verdict(m, 1.5, True)))
        if "median_push_4MB_8inflight_striped2_over_raw_oneway" in pp:
            m = pp["median_push_4MB_8inflight_striped2_over_raw_oneway"]
            rows.append(("4 MB push over the socket striped over 2 connections (--stripes 2), 8 in flight: "
                         ">= 1.5x raw single-socket one-way",
                         f"{m:.2f}x ({pp['leash_4MB_push_striped2_MBps']:.0f} MB/s; "
                         f"{pp['median_push_4MB_8inflight_striped2_over_one_connection']:.2f}x one connection)",
                         *verdict(m, 1.5, True)))
    tr = res.get("training")
    if tr:
        for model, mres in tr["models"].items():
            sy = mres["systems"]
            loc = sy.get("leash local", {}).get("median_samples_per_second")
            tor = sy.get("torch single", {}).get("median_samples_per_second")
            for n in ("leash 1+1 s=1", "leash 1+1 s=0"):
                v = sy.get(n, {}).get("median_samples_per_second")
                if v is None:
                    continue
                r = v / loc if loc else None
                rows.append((f"{model.upper()}: {n} >= 90% of local mode", fmt(r and r * 100, ".0f") + "%",
                             *verdict(r, 0.9, True)))
                r = v / tor if tor else None
                rows.append((f"{model.upper()}: {n} >= PyTorch single-process (1 thread)", fmt(r, ".2f") + "x",
                             *verdict(r, 1.0, True)))
    st = res.get("stragglers")
    if st and "summary" in st and "persistent/mlp" in st["summary"]:
        rows += straggler_bench.targets(st, verdict)
    du = res.get("durability")
    if du:
        for iv in ("10s", "1s"):
            v = du["summary"].get(iv, {})
            r = v.get("median_over_off_per_round", v.get("over_off"))
            n = min(v.get("periodic_snapshots") or [0])
            paused = v.get("paused_share")
            if paused is None or not v.get("job_seconds"):  # an older run: throughput only
                cost = "—" if r is None else f"{(1 - r) * 100:.1f}% cost" if r <= 1 else f"{r:.3f}x of off"
                rows.append((f"snapshots every {iv} cost <= 5% throughput", cost, *verdict(r, 0.95, True)))
                continue
            # The shard serves nobody while it snapshots: the paused share of the run is the
            # cost the snapshots themselves impose; the samples/s against the run without
            # snapshots is shown beside it (on a shared machine the load moves it more).
            cost = (f"{paused * 100:.2f}% of the run paused: {n}+ snapshots in runs of {min(v['job_seconds']):.0f}-"
                    f"{max(v['job_seconds']):.0f} s, each {fmt(v['median_snapshot_ms'], '.0f')} ms (median; max "
                    f"{fmt(v['max_snapshot_ms'], '.0f')}) and {fmt(v['median_bytes_per_snapshot'] and v['median_bytes_per_snapshot'] / 1e6, '.1f')} MB "
                    f"written; samples/s {fmt(r, '.2f')}x of off (per round "
                    f"{', '.join(f'{x:.2f}' for x in v.get('over_off_per_round', []))}, load moving it)")
            rows.append((f"snapshots every {iv} cost <= 5% throughput (time paused, at least six snapshots)", cost,
                         *(verdict(1 - paused, 0.95, True) if n >= 6 else ("n/a", f"only {n} snapshots in the shortest run"))))
    ct = res.get("ctr")
    if ct:
        for n in ("leash 1+1", "leash 2+2"):
            if n not in ct:
                continue
            gap, ratio = ct[n]["auc_gap"], ct[n]["speed_ratio"]
            rows.append((f"MovieLens CTR: {n} test AUC within 0.005 of PyTorch's", f"{gap:+.4f}",
                         "PASS" if abs(gap) <= 0.005 else "MISS", f"{abs(gap) / 0.005:.2f}x the allowance"))
            rows.append((f"MovieLens CTR: {n} samples/s >= PyTorch single-process", f"{ratio:.2f}x",
                         *verdict(ratio, 1.0, True)))
    if res.get("replication"):
        rows += replication_bench.targets(res["replication"], verdict)
    return rows


def write_summary(a, c, res, plots, durations):
    md = ["# Leash benchmark suite", "",
          f"{'Quick (smoke) run' if a.quick else 'Full run'} of `bench/run_all.py{' --quick' if a.quick else ''}`, "
          f"{res['time']}, {os.cpu_count()} cores ({platform.processor() or platform.machine()}), shared and noisy: "
          f"peers are interleaved and repeated ({c['repeats']}x; push/pull {c['pushpull_repeats']}x), medians reported. "
          f"Every process computes with 1 math (BLAS / intra-op) thread. Took {durations['total'] / 60:.1f} min "
          f"({', '.join(f'{k} {v / 60:.1f} min' for k, v in durations.items() if k != 'total')}).", "",
          "## Targets", "", "| target | measured | verdict | by how much |", "|---|---|---|---|"]
    for t in targets(res):
        md.append("| " + " | ".join(t) + " |")
    pp = res.get("pushpull")
    if pp:
        md += ["", "## 1. Push/pull against raw ZeroMQ", "",
               f"`build/bench/leash-bench-pushpull`, {c['pushpull_repeats']} runs of {c['pushpull_seconds']} s per cell; "
               "table of the last run in [pushpull.md](pushpull.md).", "",
               "The targets' ceilings are a plain ZeroMQ sender and receiver in two processes, each with its own "
               "context, as a worker and a shard are (the one-way figure counts delivered bytes: the time runs "
               "until the receiver has the last message). The same-process figures, both sockets on one context "
               "and its one I/O thread, are shown too: they skip the second process's wake-up, which no shard can, "
               "and the same-process one-way figure counts bytes handed to the socket. The Leash rows of the targets "
               "go through the loopback socket only, as between hosts; the same cells with same-host shared memory "
               "are measured beside them (`leash shm` in [pushpull.md](pushpull.md); ratios below). The loopback TCP "
               "ceiling (iperf3, one stream, 1 MiB writes) per run: "
               f"{', '.join(fmt(v) for v in pp.get('iperf3_loopback_MBps', [])) or 'not measured'} MB/s.", "",
               "| ratio | per run | median |", "|---|---|---|",
               f"| 4 KB push p50 / raw RTT p50, 2 processes | "
               f"{', '.join(f'{v:.2f}' for v in pp['push_4KB_p50_over_raw_rtt'])} | "
               f"{pp['median_push_4KB_p50_over_raw_rtt']:.2f}x |",
               f"| 4 MB push (8 in flight) MB/s / raw one-way MB/s, 2 processes | "
               f"{', '.join(f'{v * 100:.0f}%' for v in pp['push_4MB_8inflight_over_raw_oneway'])} | "
               f"{pp['median_push_4MB_8inflight_over_raw_oneway'] * 100:.0f}% |"]
        if "push_4KB_p50_over_raw_rtt_same_process" in pp:
            md += [f"| 4 KB push p50 / raw RTT p50, same process | "
                   f"{', '.join(f'{v:.2f}' for v in pp['push_4KB_p50_over_raw_rtt_same_process'])} | "
                   f"{pp['median_push_4KB_p50_over_raw_rtt_same_process']:.2f}x |",
                   f"| 4 MB push (8 in flight) MB/s / raw one-way MB/s, same process | "
                   f"{', '.join(f'{v * 100:.0f}%' for v in pp['push_4MB_8inflight_over_raw_oneway_same_process'])} | "
                   f"{pp['median_push_4MB_8inflight_over_raw_oneway_same_process'] * 100:.0f}% |"]
        for k in ("push_256KB_p50_over_raw_rtt_plus_update", "push_256KB_p50_over_raw_checked_rtt_plus_update",
                  "pull_256KB_p50_over_raw_rtt_plus_update", "pull_4KB_p50_over_raw_rtt", "pull_4MB_8inflight_over_raw_oneway", "raw_oneway_4MB_over_iperf3",
                  "push_4MB_8inflight_striped2_over_one_connection", "pull_4MB_8inflight_striped2_over_one_connection"):
            if k in pp:
                md.append(f"| {k.replace('_', ' ')} | {', '.join(f'{v:.2f}' for v in pp[k])} | "
                          f"{pp['median_' + k]:.2f}x |")
        if pp.get("shm_over_socket_ops_per_s"):
            md += ["", "Shared memory over socket (ops/s, median of the runs' ratios): " +
                   ", ".join(f"{k.replace('_', ' ')} {v:.2f}x" for k, v in pp["shm_over_socket_ops_per_s"].items()) + "."]
    tr = res.get("training")
    if tr:
        md += ["", "## 2. Training throughput on Fashion-MNIST", "",
               "Same model, optimizer (MLP: SGD momentum 0.9, lr 0.01; CNN: Adam 1e-3), batch 64 per step and per "
               "process, normalization ((x/255 - 0.2860)/0.3530) and data files for every system. Samples/s: training "
               "samples over training time (evaluation excluded); time to 85%: wall time since training started "
               "(evaluations included) at the first end of epoch with test accuracy >= 85% (accuracy is measured once per "
               "epoch, so this is quantized to epochs). DDP and Hogwild: 2 processes; TF PS: 1 parameter server + 2 "
               "workers + the coordinator; each of them with 1 math thread, on the same 2 cores.", ""]
        if tr.get("tf_unavailable"):
            md += [f"TensorFlow: **not run** — {tr['tf_unavailable']}.", ""]
        for model, mres in tr["models"].items():
            sy = mres["systems"]
            loc = sy.get("leash local", {}).get("median_samples_per_second")
            data = f"the first {mres['train_limit']} training samples" if mres.get("train_limit") else "60000 samples"
            md += [f"### {model.upper()}: {mres['epochs']} epoch(s) of {data}, {mres.get('repeats', c['repeats'])} "
                   "interleaved run(s) per system", "",
                   "| system | median samples/s | vs Leash local | runs | test accuracy per epoch (median run) | "
                   "time to 85% (s) |", "|---|---|---|---|---|---|"]
            for n, s in sy.items():
                if "error" in s:
                    md.append(f"| {n} | failed: {s['error']} | | | | |")
                    continue
                accs = ", ".join(f"{p['test_accuracy'] * 100:.1f}%" for p in s["curve"] if p["test_accuracy"] is not None)
                t85 = ", ".join(fmt(t, ".1f", "not reached") for t in s["time_to_85_seconds"])
                md.append(f"| {n} | {s['median_samples_per_second']:.0f} | "
                          f"{fmt(loc and s['median_samples_per_second'] / loc, '.2f')}x | "
                          f"{', '.join(f'{v:.0f}' for v in s['samples_per_second'])} | {accs} | {t85} |")
            md.append("")
            if model == "mlp" and "leash 1+1 s=0" in sy:
                md += ["Leash 1+1: an iteration is two messages each way (its pulls in one batch, its pushes with its "
                       "clock in another), and with the shard on this host the tables go through shared memory "
                       "(`socket`: everything through the loopback socket, as between two hosts). At staleness 0 the "
                       "pull for iteration c+1 can only be served once iteration c's pushes are applied, so the whole "
                       "round trip (the shard's update, the read, the transfer, two wake-ups) adds to every iteration; "
                       "a bound of 1 overlaps it with the compute. The s=0 rows are shown beside the targets for that "
                       "reason: no transport makes a bulk-synchronous round trip free.", ""]
    st = res.get("stragglers")
    if st and "summary" in st and "persistent/mlp" in st["summary"]:
        md += straggler_bench.summary_md(st, results=os.path.relpath(os.path.join(HERE, "results"), a.out),
                                         docs=os.path.relpath(os.path.join(ROOT, "docs"), a.out))
    du = res.get("durability")
    if du:
        md += ["## 4. Durability cost", "",
               f"Leash 1 shard + 1 worker, MLP, {du['epochs']} epoch(s) of {du.get('train_limit') or 60000} samples, "
               "staleness 1, no evaluation; `leash-server --checkpoint-interval` 1s / 10s / 0 (off), snapshots fsynced "
               "(the default), the configurations interleaved. A snapshot runs on the shard's request loop, so its "
               "duration (from the shard's log) is a pause of every update; bytes per snapshot: what the shard wrote "
               "(/proc/PID/io wchar) beyond the same round's run without snapshots, over the snapshots taken (the "
               "final snapshot at exit is not counted in either).", "",
               "| snapshots every | median samples/s | vs off (per round) | run lengths (s) | periodic snapshots | "
               "pause per snapshot, median / max (ms) | share of the run paused | MB written per snapshot | "
               "load average before |", "|---|---|---|---|---|---|---|---|---|"]
        for i, v in du["summary"].items():
            mb = v.get("median_bytes_per_snapshot")
            md.append(f"| {'off' if i == '0' else i} | {fmt(v['median_samples_per_second'])} | "
                      f"{fmt(v.get('median_over_off_per_round'), '.3f')} "
                      f"({', '.join(f'{x:.3f}' for x in v.get('over_off_per_round', []))}) | "
                      f"{', '.join(f'{x:.0f}' for x in v.get('job_seconds', []))} | "
                      f"{', '.join(str(x) for x in v.get('periodic_snapshots', []))} | "
                      f"{fmt(v.get('median_snapshot_ms'), '.1f')} / {fmt(v.get('max_snapshot_ms'), '.1f')} | "
                      f"{fmt(v.get('paused_share') and v['paused_share'] * 100, '.2f')}% | "
                      f"{fmt(mb and mb / 1e6, '.2f')} | {', '.join(f'{x:.1f}' for x in v.get('load_before', []))} |")
        md.append("")
    if res.get("ctr"):
        md += ["## 5. Click-through model on MovieLens-100k", "",
               "`leash-worker --model ctr` (embeddings in a sparse table, MLP 128-64-32-1, Adagrad, batch 256, "
               "staleness 1 in the clusters) against `bench/torch_ctr.py`, the same model, split and "
               "initialization in PyTorch (sparse EmbeddingBag, Adagrad, 1 thread); test AUC per epoch (a "
               "cluster's: worker 0's evaluation), log loss after the last. See docs/models.md.", ""]
        md += ctr_bench.table(res["ctr"]) + [""]
    if res.get("replication"):
        md += ["## 6. Replicated shards", "",
               "`bench/replication.py`: etcd and leash-server replicas (`--replicas 2`) on this host; details in "
               "[replication.md](replication.md).", ""]
        md += [line.replace("## ", "### ", 1) if line.startswith("## ") else line
               for line in replication_bench.summary_md(res["replication"])]
    if plots:
        md += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    if res.get("errors"):
        md += ["## Errors", ""] + [f"- {e}" for e in res["errors"]] + [""]
    md += ["Raw numbers: `suite.json` (everything), `training.json`, `stragglers.json`, `durability.json`, "
           "`pushpull_suite.json`, `pushpull.json`, `replication.json`.", ""]
    with open(os.path.join(a.out, "SUMMARY.md"), "w") as f:
        f.write("\n".join(md))


def make_plots(a, res):
    plt = pyplot()
    if plt is None:
        return []
    plots = []
    tr = res.get("training")
    if tr:
        for model, mres in tr["models"].items():
            fig, ax = plt.subplots(figsize=(7, 4.5))
            for n, s in mres["systems"].items():
                if "curve" not in s:
                    continue
                pts = [(p["elapsed_seconds"], p["test_accuracy"] * 100) for p in s["curve"] if p["test_accuracy"] is not None]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=n)
            ax.axhline(TARGET_ACC * 100, color="grey", ls="--", lw=1)
            ax.set_xlim(left=0)
            ax.set_xlabel("wall time since training started (s); a point per epoch")
            ax.set_ylabel("test accuracy (%)")
            ax.set_ylim(bottom=max(0, min([70] + [p["test_accuracy"] * 100 - 2 for s in mres["systems"].values()
                                                  for p in s.get("curve", []) if p["test_accuracy"] is not None])))
            ax.set_title(f"Fashion-MNIST {model.upper()}: test accuracy vs time (median run)")
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
            name = f"accuracy_vs_time_{model}.png"
            fig.tight_layout()
            fig.savefig(os.path.join(a.out, name), dpi=100)
            plt.close(fig)
            plots.append(name)
        fig, axes = plt.subplots(1, len(tr["models"]), figsize=(12, 4.5))
        for ax, (model, mres) in zip(list(axes) if hasattr(axes, "__len__") else [axes], tr["models"].items()):
            names = [n for n, s in mres["systems"].items() if "median_samples_per_second" in s]
            vals = [mres["systems"][n]["median_samples_per_second"] for n in names]
            colors = ["tab:blue" if n.startswith("leash") else "tab:orange" if n.startswith("torch") else "tab:green"
                      for n in names]
            ax.barh(names, vals, color=colors)
            for y, v in enumerate(vals):
                ax.text(v, y, f" {v:.0f}", va="center", fontsize=8)
            ax.set_xlabel("samples/s (median)")
            ax.set_title(f"{model.upper()}, batch 64, 1 math thread per process")
            ax.invert_yaxis()
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "training_throughput.png"), dpi=100)
        plt.close(fig)
        plots.append("training_throughput.png")
    st = res.get("stragglers")
    if st and "summary" in st and "persistent/mlp" in st["summary"]:
        made = straggler_bench.plot(st, a.out)
        if made:
            plots.append(made)
    du = res.get("durability")
    if du:
        ks = list(du["summary"])
        fig, ax = plt.subplots(figsize=(6, 4))
        vals = [du["summary"][k]["median_samples_per_second"] or 0 for k in ks]
        ax.bar([("off" if k == "0" else f"every {k}") for k in ks], vals, color="tab:red")
        for x, k in enumerate(ks):
            r = du["summary"][k]["over_off"]
            ax.text(x, vals[x], f"{r:.3f}x" if r else "", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("samples/s (median)")
        ax.set_title("Leash 1+1 MLP: snapshot interval")
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "durability.png"), dpi=100)
        plt.close(fig)
        plots.append("durability.png")
    pp = res.get("pushpull")
    if pp:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
        ax1.bar(["raw ZeroMQ RTT\n(2 processes)", "Leash push"], [pp["raw_rtt_4KB_p50_us"], pp["leash_4KB_p50_us"]],
                color=["grey", "tab:blue"])
        ax1.axhline(pp["raw_rtt_4KB_p50_us"] * 1.3, color="tab:red", ls="--", lw=1, label="target 1.3x")
        ax1.set_ylabel("p50 latency (us)")
        ax1.set_title("4 KB, 1 in flight")
        ax1.legend(fontsize=8)
        ax2.bar(["raw one-way\n(2 processes)", "Leash push x8"], [pp["raw_oneway_4MB_MBps"], pp["leash_4MB_push_MBps"]],
                color=["grey", "tab:blue"])
        ax2.axhline(pp["raw_oneway_4MB_MBps"] * 0.8, color="tab:red", ls="--", lw=1, label="target 80%")
        ax2.set_ylabel("MB/s")
        ax2.set_title("4 MB, 8 in flight")
        ax2.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "pushpull.png"), dpi=100)
        plt.close(fig)
        plots.append("pushpull.png")
    if res.get("replication") and replication_bench.plot(res["replication"], a.out):
        plots.append("replication.png")
    return plots


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: small data, 1 repeat (a few minutes)")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--out", help="results directory (default bench/results, or the gitignored bench/results/quick with --quick)")
    p.add_argument("--parts", default=",".join(ALL_PARTS),
                   help="comma-separated; with a subset, the other parts' results in --out are kept")
    p.add_argument("--repeats", type=int, help="override the repeats of the training, straggler and durability parts")
    p.add_argument("--cnn-train-limit", type=int, help="CNN training samples (0: all 60000; full default 30000, "
                   "as one CNN epoch takes 3-4 min per system on 2 busy cores)")
    p.add_argument("--cnn-epochs", type=int)
    p.add_argument("--cnn-repeats", type=int, help="repeats of the CNN training part (full default 1)")
    p.add_argument("--mlp-epochs", type=int)
    p.add_argument("--models", default="mlp,cnn",
                   help="models of the training part (mlp, cnn or both); with one, the other's results in --out are kept")
    p.add_argument("--no-tf", action="store_true", help="skip the TensorFlow peer (and its install)")
    p.add_argument("--keep-tmp", action="store_true", help="keep the processes' logs and metrics (printed path)")
    p.add_argument("--summary-only", action="store_true", help="rewrite SUMMARY.md and plots from --out/suite.json")
    a = p.parse_args()
    a.out = a.out or os.path.join(HERE, "results", "quick" if a.quick else "")
    a.out = os.path.normpath(a.out)
    os.makedirs(a.out, exist_ok=True)
    c = config(a.quick)
    for key in ("repeats", "cnn_repeats", "cnn_train_limit", "cnn_epochs", "mlp_epochs"):
        if getattr(a, key) is not None:
            c[key] = getattr(a, key)
    if a.summary_only:
        with open(os.path.join(a.out, "suite.json")) as f:
            res = json.load(f)
        c.update(res.get("config", {}))
        write_summary(a, c, res, make_plots(a, res), res["durations_seconds"])
        return 0
    parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    a.models = [m.strip() for m in a.models.split(",") if m.strip()]
    for m in a.models:
        if m not in ("mlp", "cnn"):
            p.error(f"unknown model {m!r} in --models (use mlp, cnn)")
    res = {"suite": "leash-bench", "quick": a.quick, "time": now(), "config": c, "nproc": os.cpu_count(),
           "errors": []}
    durations = {}
    previous = os.path.join(a.out, "suite.json")
    a.previous = None  # the last run in --out, when it is of the same kind (quick or full)
    if os.path.exists(previous):
        with open(previous) as f:
            old = json.load(f)
        if old.get("quick") == a.quick:
            a.previous = old
    if set(parts) != set(ALL_PARTS) and a.previous:
        # A subset of the parts: the others keep their results from the last run here.
        old = a.previous
        durations = {k: v for k, v in old.get("durations_seconds", {}).items() if k not in parts and k != "total"}
        res.update({k: old[k] for k in ALL_PARTS if k in old and k not in parts})
        res["errors"] = [e for e in old.get("errors", []) if e.split(":")[0] not in parts]
        res["time"] = f"{old.get('time')} (re-run of {', '.join(parts)}: {res['time']})"
        log(f"keeping {', '.join(k for k in ALL_PARTS if k in res)} from {previous}")
    tmp = tempfile.mkdtemp(prefix="leash-bench-")
    fns = {"pushpull": part_pushpull, "training": part_training, "stragglers": part_stragglers,
           "durability": part_durability, "ctr": part_ctr, "replication": part_replication}
    try:
        for part in parts:
            if part not in fns:
                p.error(f"unknown part {part!r} (use {', '.join(fns)})")
            t0 = time.monotonic()
            log(f"=== {part}")
            try:
                res[part] = fns[part](a, c, tmp)
            except Exception as e:
                traceback.print_exc()
                res["errors"].append(f"{part}: {type(e).__name__}: {e}")
            durations[part] = time.monotonic() - t0
            log(f"=== {part} took {durations[part] / 60:.1f} min")
    finally:
        if a.keep_tmp:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    durations["total"] = sum(v for k, v in durations.items() if k != "total")
    res["durations_seconds"] = durations
    write_json(os.path.join(a.out, "suite.json"), res)
    plots = make_plots(a, res)
    write_summary(a, c, res, plots, durations)
    log(f"wrote {a.out}/SUMMARY.md, suite.json and {', '.join(plots)}; total {durations['total'] / 60:.1f} min")
    with open(os.path.join(a.out, "SUMMARY.md")) as f:
        print(f.read().split("## 1.")[0])
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())

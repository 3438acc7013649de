"""Runs Leash for the benchmark suite: leash-server shards and leash-worker processes on
loopback (ports from the suite's range), or one worker in --local mode, and reads the
workers' --metrics-out JSON. Every process is started here and stopped by its Popen
handle. Not thread-safe."""
import json
import os
import re
import subprocess
import time

from .util import free_port, stop

MODEL_FLAGS = {
    # the optimizers the Leash docs use for each model
    "mlp": ["--model", "mlp", "--optimizer", "momentum", "--momentum", "0.9", "--lr", "0.01"],
    "cnn": ["--model", "cnn", "--optimizer", "adam", "--lr", "0.001"],
    # the click-through model on MovieLens-100k (docs/models.md); bench/torch_ctr.py's twin
    "ctr": ["--model", "ctr", "--optimizer", "adagrad", "--lr", "0.05", "--sparse-optimizer", "adagrad",
            "--hidden", "64,32", "--embedding-dim", "16", "--batch", "256", "--chunk-size", "4096"],
}


class RunError(RuntimeError):
    pass


def _bin(build, *parts):
    path = os.path.join(build, *parts)
    if not os.access(path, os.X_OK):
        raise RunError(f"{path} is missing: build it (cmake --build {build} --target leash-server leash-worker)")
    return path


def _worker_cmd(build, model, epochs, metrics, train_limit, test_limit, no_eval, extra):
    cmd = [_bin(build, "worker", "leash-worker"), "--epochs", str(epochs), "--batch", "64", "--threads", "1",
           "--device", "cpu", "--log-every", "0", "--metrics-out", metrics] + MODEL_FLAGS[model]
    if train_limit:
        cmd += ["--train-limit", str(train_limit)]
    if test_limit:
        cmd += ["--test-limit", str(test_limit)]
    if no_eval:
        cmd += ["--no-eval"]
    return cmd + list(extra)


def _proc_io(pid):
    """/proc/PID/io as a dict of ints (empty where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            return {k: int(v) for k, v in (line.split(":") for line in f if ":" in line)}
    except OSError:
        return {}


def _read_metrics(path):
    with open(path) as f:
        return json.load(f)


def _curve(epochs):
    return [{"epoch": e["epoch"], "elapsed_seconds": e["elapsed_seconds"],
             "test_accuracy": e["test_accuracy"] if e["test_accuracy"] >= 0 else None} for e in epochs]


def _fine_curve(metrics):
    """The points of leash-worker --eval-every (empty without it, or from a worker that
    predates it): step, samples trained by that worker, elapsed_seconds since training
    started (wall time, earlier evaluations included), test_accuracy, eval_seconds."""
    return [{"step": p["step"], "samples": p["samples"], "elapsed_seconds": p["elapsed_seconds"],
             "test_accuracy": p["test_accuracy"], "eval_seconds": p["eval_seconds"]}
            for p in metrics.get("evaluations", [])]


def run_local(build, tmp, model, epochs, tag, train_limit=0, test_limit=0, timeout=3600):
    """leash-worker --local: the same model and loop with no server."""
    metrics = os.path.join(tmp, f"{tag}.json")
    cmd = _worker_cmd(build, model, epochs, metrics, train_limit, test_limit, False, ["--local"])
    log = os.path.join(tmp, f"{tag}.log")
    with open(log, "w") as lf:
        rc = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT, timeout=timeout).returncode
    if rc != 0:
        raise RunError(f"leash-worker --local exited {rc} (log {log})")
    m = _read_metrics(metrics)
    samples = sum(e["samples"] for e in m["epochs"])
    seconds = sum(e["train_seconds"] for e in m["epochs"])
    return {"samples_per_second": samples / seconds, "curve": _curve(m["epochs"]), "metrics": m}


def run_cluster(build, tmp, model, epochs, tag, shards=1, workers=1, staleness=0, delay_factors=None,
                checkpoint_interval="0", train_limit=0, test_limit=0, no_eval=False, timeout=3600, worker_args=(),
                w0_args=(), server_args=(), per_worker_args=None, shard_stats=False):
    """`shards` leash-server processes and `workers` leash-worker processes training one
    job. delay_factors[i] is worker i's --step-delay-factor. Returns the cluster's
    samples/s (all workers' samples over the job's wall time, and for one worker its
    samples over its step time, as bench/ps_cost.py), worker 0's accuracy curve (per job
    epoch), with w0_args' --eval-every worker 0's points ("fine_curve") and the time it
    spent evaluating ("w0_eval_seconds", epoch ends included), and every worker's
    metrics. worker_args: more leash-worker flags for every worker; w0_args: for worker 0
    only (after worker_args, so they win), e.g. ["--eval-every", "64"]; server_args: more
    leash-server flags for every shard, e.g. ["--backup-workers", "1"]; per_worker_args(i):
    more flags of worker i (after the others), e.g. its --slow-spells. shard_stats: the
    shards log at info level, and "shards" holds per shard the bytes it had written when the
    workers were done (/proc/PID/io: write_bytes to storage, wchar through write calls) and
    every snapshot's duration in ms from its log (the request loop pauses for it), the
    final one at exit included, those taken when a table is created apart."""
    delay_factors = delay_factors or [1.0] * workers
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(shards)]
    procs, logs = [], []
    try:
        for i, ep in enumerate(endpoints):
            lf = open(os.path.join(tmp, f"{tag}-shard{i}.log"), "w")
            logs.append(lf)
            procs.append(subprocess.Popen(
                [_bin(build, "server", "leash-server"), "--shard", str(i), "--num-shards", str(shards), "--bind", ep,
                 "--data-dir", os.path.join(tmp, f"{tag}-shard{i}"), "--checkpoint-interval", checkpoint_interval,
                 "--log-level", "info" if shard_stats else "warn"] + list(server_args), stdout=lf,
                stderr=subprocess.STDOUT))
        workers_p, metrics = [], []
        for w in range(workers):
            metrics.append(os.path.join(tmp, f"{tag}-w{w}.json"))
            lf = open(os.path.join(tmp, f"{tag}-w{w}.log"), "w")
            logs.append(lf)
            extra = ["--servers", ",".join(endpoints), "--staleness", str(staleness), "--name", f"w{w}",
                     "--step-delay-factor", str(delay_factors[w])] + list(worker_args) + (list(w0_args) if w == 0 else []) + \
                (list(per_worker_args(w)) if per_worker_args else [])
            workers_p.append(subprocess.Popen(
                _worker_cmd(build, model, epochs, metrics[-1], train_limit, test_limit, no_eval, extra),
                stdout=lf, stderr=subprocess.STDOUT))
            procs.append(workers_p[-1])
        deadline = time.monotonic() + timeout
        for w, p in enumerate(workers_p):
            try:
                rc = p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RunError(f"{tag}: worker {w} still running after {timeout} s (logs in {tmp})")
            if rc != 0:
                raise RunError(f"{tag}: worker {w} exited {rc} (log {tmp}/{tag}-w{w}.log)")
        shard_io = [_proc_io(p.pid) for p in procs[:shards]] if shard_stats else None
    finally:
        for p in reversed(procs):
            stop(p)
        for lf in logs:
            lf.close()
    ms = [_read_metrics(m) for m in metrics]
    samples = sum(e["samples"] for m in ms for e in m["epochs"])
    if workers == 1:
        seconds = sum(e["train_seconds"] for e in ms[0]["epochs"])
    else:
        seconds = max(m["epochs"][-1]["elapsed_seconds"] for m in ms if m["epochs"])
    out = {"samples_per_second": samples / seconds, "curve": _curve(ms[0]["epochs"]), "job_seconds":
           max(m["epochs"][-1]["elapsed_seconds"] for m in ms if m["epochs"]), "metrics": ms}
    if shard_stats:
        out["shards"] = []
        for i in range(shards):
            snaps, created, after_create = [], [], False
            with open(os.path.join(tmp, f"{tag}-shard{i}.log")) as f:
                for line in f:
                    m = re.search(r"snapshot #\d+ at clock -?\d+ written to .* in ([0-9.]+) ms", line)
                    if m:  # the snapshot a shard takes when a table is created is not periodic
                        (created if after_create else snaps).append(float(m.group(1)))
                    after_create = bool(re.search(r"created (sparse )?table", line))
            out["shards"].append({"io_when_workers_done": shard_io[i], "snapshot_ms": snaps,
                                  "table_creation_snapshot_ms": created})
    fine = _fine_curve(ms[0])
    if fine:
        out.update({"fine_curve": fine, "w0_eval_seconds": ms[0].get("eval_seconds")})
    return out

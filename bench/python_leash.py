#!/usr/bin/python3
"""A PyTorch worker through Leash against the same loop with no server, and the time the
Python binding takes per iteration. The bench/common MLP and CNN (the optimizers the Leash
docs use: momentum SGD for the MLP, Adam for the CNN; batch 64; --threads, default 1, for
torch and OpenBLAS in both loops) train
(a) alone with torch.optim and (b) through leash.torch against one leash-server shard,
one worker, staleness 1 (the optimizer on the shard); runs are interleaved, a, b, a, b,
in this one process, so both see the same machine. Per run: samples/s and test accuracy;
for Leash also, per iteration: the time inside pull() and push(), the part of it waiting
with the GIL released, the part in the C++ binding with the GIL held (array checks, the
client's copies/encoding, taking the GIL back) and the rest (the Python layer). Also
per run, for every thread of the process and of the shard: context switches, CPU time and
time runnable without a CPU per iteration (/proc schedstat), and the training thread's page
faults. On a machine shared with other work, run it as `chrt -f 10 /usr/bin/python3 ...`
(both loops alike then keep the cores they get). Writes
one JSON object to --out (default bench/results/python_leash.json):
  {"config", "runs": [...], "models": {model: {"local_sps", "leash_sps", "ratio",
   "binding_us_per_iter", ...}}, "pairs": {...}}
With --pairs MODELS, also two-process runs, interleaved: 2 Python workers
(examples/torch_fashion_mnist.py) on one shard, staleness 1, against PyTorch DDP x2 and
Hogwild x2 (bench/torch_train.py); cluster samples/s (train time only for the PyTorch peers,
each Leash worker's loop from connecting to its last chunk for Leash: connecting and
creating the tables count against Leash).
Run under /usr/bin/python3 with the package on the path (PYTHONPATH=build/python).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _early_threads():
    """--threads, read before torch loads: Debian's torch calls the system BLAS (OpenBLAS,
    pthread variant), whose own thread pool torch.set_num_threads() does not bound; it
    reads OPENBLAS_NUM_THREADS when it loads."""
    for i, arg in enumerate(sys.argv):
        if arg.startswith("--threads="):
            return int(arg.split("=", 1)[1])
        if arg == "--threads" and i + 1 < len(sys.argv):
            return int(sys.argv[i + 1])
    return 1


if _early_threads() > 0:
    os.environ["OPENBLAS_NUM_THREADS"] = str(_early_threads())

# common first: it sets OPENBLAS_CORETYPE where needed, before numpy or torch loads OpenBLAS
# (numpy links it too: imported first, it fixed the pre-AVX kernels for the whole process).
import common  # noqa: E402,F401
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from common import fmnist  # noqa: E402
from common.torch_models import accuracy, make_model, make_optimizer  # noqa: E402
from common.util import free_port  # noqa: E402

LEASH_OPT = {"mlp": dict(optimizer="momentum", lr=0.01, momentum=0.9),
             "cnn": dict(optimizer="adam", lr=1e-3)}


def thread_switches(pid):
    """{tid: (name, voluntary, involuntary context switches, ns on a CPU, ns runnable
    waiting for one)} of every thread of `pid` (/proc status and schedstat)."""
    out = {}
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"{base}/{tid}/status") as f:
                st = dict(line.split(":", 1) for line in f if "ctxt_switches" in line)
            with open(f"{base}/{tid}/schedstat") as f:
                run_ns, wait_ns, _ = (int(v) for v in f.read().split())
        except OSError:
            continue  # the thread ended
        out[int(tid)] = (name, int(st["voluntary_ctxt_switches"]),
                         int(st["nonvoluntary_ctxt_switches"]), run_ns, wait_ns)
    return out


def switches_per_iteration(before, after, steps, roles):
    """Per iteration and thread role, from two thread_switches() snapshots: voluntary and
    involuntary context switches, microseconds on a CPU and runnable without one; `roles`
    maps a tid to its role (other tids: their thread name, summed)."""
    res = {}
    for tid, now in after.items():
        b = before.get(tid, (now[0], 0, 0, 0, 0))
        role = roles.get(tid, now[0])
        acc = res.setdefault(role, [0.0, 0.0, 0.0, 0.0])
        for j in range(4):
            acc[j] += (now[j + 1] - b[j + 1]) / steps
    return {k: {"voluntary": round(v[0], 2), "involuntary": round(v[1], 2),
                "cpu_us": round(v[2] / 1e3, 1), "runnable_waiting_us": round(v[3] / 1e3, 1)}
            for k, v in sorted(res.items())}


SHARD_PID = 0  # the leash-server of the single-worker runs (its threads' switches)


def batches(n, batch, seed):
    order = torch.from_numpy(np.random.default_rng(seed).permutation(n))
    return [order[i:i + batch] for i in range(0, n, batch)]


def run_local(model_name, x, y, tx, ty, epochs, batch, seed):
    torch.manual_seed(seed)
    model = make_model(model_name)
    opt = make_optimizer(model_name, model.parameters())
    steps = 0
    fb_s = step_s = 0.0
    me = {threading.get_native_id(): "training thread"}
    sw0 = thread_switches(os.getpid())
    flt0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    t0 = time.perf_counter()
    cpu0 = time.thread_time()
    for e in range(epochs):
        for idx in batches(x.shape[0], batch, seed * 1000 + e):
            opt.zero_grad(set_to_none=True)
            a = time.perf_counter()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            b = time.perf_counter()
            opt.step()
            step_s += time.perf_counter() - b
            fb_s += b - a
            steps += 1
    secs = time.perf_counter() - t0
    cpu = time.thread_time() - cpu0
    sw = switches_per_iteration(sw0, thread_switches(os.getpid()), steps, me)
    faults = (resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - flt0) / steps
    return {"system": "local", "model": model_name, "steps": steps, "seconds": secs,
            "context_switches_per_iteration": sw,
            "training_thread_page_faults_per_iteration": faults,
            "training_thread_cpu_us_per_iteration": cpu / steps * 1e6,
            "samples_per_second": epochs * x.shape[0] / secs, "test_accuracy": accuracy(model, tx, ty),
            "per_iteration_us": {"forward_backward": fb_s / steps * 1e6,
                                 "optimizer_step": step_s / steps * 1e6}}


PUSH_IN_BACKWARD = None  # leash.torch's default; --no-push-in-backward: False
PULL_IN_PLACE = None  # leash.torch's default; --no-pull-in-place: False
SHARED_MEMORY = True  # --no-shm: False


def run_leash(leash, model_name, servers, tag, x, y, tx, ty, epochs, batch, seed, staleness):
    import leash.torch
    torch.manual_seed(seed)
    model = make_model(model_name)
    before_client = set(thread_switches(os.getpid()))
    with leash.Client(servers, name=f"bench-{tag}", staleness=staleness,
                      shared_memory=SHARED_MEMORY) as client:
        roles = {threading.get_native_id(): "training thread"}
        for tid, (name, *_) in thread_switches(os.getpid()).items():
            if tid not in before_client:  # the client's threads: the sender is named
                roles[tid] = (name if name.startswith(("leash", "ZMQ")) else
                              "client I/O thread")
        params = leash.torch.Parameters(client, model, prefix=f"{tag}/", seed=seed,
                                        push_in_backward=PUSH_IN_BACKWARD,
                                        **({} if PULL_IN_PLACE is None else
                                           {"pull_in_place": PULL_IN_PLACE}),
                                        **LEASH_OPT[model_name])
        params.pull()  # the first pull (tables just created) is not timed
        client.reset_binding_times()
        pull_s = push_s = fb_s = 0.0
        steps = 0
        sw0 = thread_switches(os.getpid())
        shard0 = thread_switches(SHARD_PID) if SHARD_PID else {}
        flt0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        t0 = time.perf_counter()
        cpu0 = time.thread_time()
        for e in range(epochs):
            for idx in batches(x.shape[0], batch, seed * 1000 + e):
                a = time.perf_counter()
                if steps:
                    params.pull()
                b = time.perf_counter()
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                c = time.perf_counter()
                params.push()
                d = time.perf_counter()
                pull_s += b - a
                fb_s += c - b
                push_s += d - c
                steps += 1
        secs = time.perf_counter() - t0
        cpu = time.thread_time() - cpu0
        sw = switches_per_iteration(sw0, thread_switches(os.getpid()), steps, roles)
        faults = (resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - flt0) / steps
        if SHARD_PID:
            for k, v in switches_per_iteration(shard0, thread_switches(SHARD_PID), steps,
                                               {}).items():
                sw[f"shard: {k}"] = v
        bt = client.binding_times()
        params.sync()
        acc = accuracy(model, tx, ty)
    calls_us = (pull_s + push_s) / steps * 1e6
    wait_us = bt["wait_ns"] / steps / 1e3
    gil_us = bt["gil_ns"] / steps / 1e3
    binding_us = (bt["total_ns"] - bt["wait_ns"]) / steps / 1e3  # GIL held, in C++
    hooks_us = bt["tensor_ns"] / steps / 1e3  # of which in push_tensor, inside backward()
    return {"system": "leash", "model": model_name, "steps": steps, "seconds": secs,
            "context_switches_per_iteration": sw,
            "training_thread_page_faults_per_iteration": faults,
            "training_thread_cpu_us_per_iteration": cpu / steps * 1e6,
            "samples_per_second": epochs * x.shape[0] / secs, "test_accuracy": acc,
            "per_iteration_us": {
                "forward_backward": fb_s / steps * 1e6,
                "pull_and_push_calls": calls_us,
                "pull_call": pull_s / steps * 1e6,
                "push_call": push_s / steps * 1e6,
                "waiting_gil_released": wait_us,
                "binding_gil_held": binding_us,
                "of_which_in_gradient_hooks": hooks_us,
                "of_which_client_copies_encoding": bt["client_ns"] / steps / 1e3,
                "of_which_taking_gil_back": gil_us,
                "python_layer_of_pull_push": calls_us - wait_us - (binding_us - hooks_us),
                "sender_thread_busy": bt["sender_ns"] / steps / 1e3,
            },
            "values_per_iteration": (bt["values_pulled"] + bt["values_pushed"]) / steps,
            "pushes_handed_over": bt.get("pushes_handed_over")}


def start_shard(build, data_dir):
    port = free_port()
    proc = subprocess.Popen(
        [os.path.join(build, "server", "leash-server"), "--shard=0", "--num-shards=1",
         f"--bind=tcp://127.0.0.1:{port}", f"--data-dir={data_dir}", "--no-sync",
         "--checkpoint-interval=0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"tcp://127.0.0.1:{port}"


def run_pairs(a, model_name):
    """2 Leash Python workers vs DDP x2 vs Hogwild x2, `a.rounds` interleaved rounds."""
    env = dict(os.environ, PYTHONPATH=os.path.join(a.build, "python"))
    example = os.path.join(os.path.dirname(HERE), "examples", "torch_fashion_mnist.py")
    opt = LEASH_OPT[model_name]
    shared_flags = [f"--model={model_name}", f"--epochs={a.epochs}", f"--train-limit={a.pairs_train_limit}",
              f"--test-limit={a.test_limit}", f"--batch={a.batch}", "--threads=1"]
    tmp = f"/tmp/leash-bench-pairs-{os.getpid()}"
    os.makedirs(tmp, exist_ok=True)
    res = {"leash_x2": [], "ddp_x2": [], "hogwild_x2": []}
    try:
        for r in range(a.rounds):
            shard, servers = start_shard(a.build, f"{tmp}/shard{r}")
            try:
                procs = [subprocess.Popen(
                    ["/usr/bin/python3", example, f"--servers={servers}", f"--name=p{i}",
                     f"--optimizer={opt['optimizer']}", f"--lr={opt['lr']}",
                     f"--staleness={a.staleness}", f"--metrics-out={tmp}/p{i}.json"] + shared_flags,
                    env=env, stdout=subprocess.DEVNULL) for i in range(2)]
                if any(p.wait() != 0 for p in procs):
                    raise RuntimeError("a Leash Python worker failed")
            finally:
                shard.terminate()
                shard.wait()
            w = [json.load(open(f"{tmp}/p{i}.json")) for i in range(2)]
            res["leash_x2"].append({"samples_per_second": sum(x["samples"] for x in w) /
                                    max(x["train_seconds"] for x in w),
                                    "test_accuracy": w[0]["test_accuracy"]})
            for mode in ("ddp", "hogwild"):
                out = f"{tmp}/{mode}.json"
                subprocess.run(["/usr/bin/python3", os.path.join(HERE, "torch_train.py"),
                                f"--mode={mode}", "--procs=2", f"--out={out}"] +
                               [f for f in shared_flags if not f.startswith("--threads")],
                               check=True, stdout=subprocess.DEVNULL)
                j = json.load(open(out))
                res[f"{mode}_x2"].append({"samples_per_second": j["samples_per_second"],
                                          "test_accuracy": j["epochs"][-1]["test_accuracy"]})
            print(f"[{model_name} pairs round {r}] " + ", ".join(
                f"{k} {v[-1]['samples_per_second']:.0f} samples/s" for k, v in res.items()), flush=True)
    finally:
        subprocess.run(["rm", "-rf", tmp], check=False)
    med = {k: statistics.median(x["samples_per_second"] for x in v) for k, v in res.items()}
    return {"runs": res, "median_samples_per_second": med,
            "leash_x2_over_ddp_x2": med["leash_x2"] / med["ddp_x2"],
            "leash_x2_over_hogwild_x2": med["leash_x2"] / med["hogwild_x2"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--train-limit", type=int, default=6000)
    ap.add_argument("--test-limit", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved local/leash pairs per model")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--staleness", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1,
                    help="threads of both loops: torch.set_num_threads and OPENBLAS_NUM_THREADS; "
                         "0: the defaults (every core)")
    ap.add_argument("--no-push-in-backward", action="store_true",
                    help="push the gradients after backward (leash.torch push_in_backward=False)")
    ap.add_argument("--no-shm", action="store_true",
                    help="the client reaches the shard over the socket only (shared_memory=False), "
                         "as between hosts")
    ap.add_argument("--no-pull-in-place", action="store_true",
                    help="pull into the module's own buffers (leash.torch pull_in_place=False)")
    ap.add_argument("--package", default="",
                    help="directory holding the leash package (default: BUILD/python); "
                         "bench/python_ab.py compares two")
    ap.add_argument("--pairs", default="", help="models for the 2-process comparison (e.g. mlp)")
    ap.add_argument("--pairs-train-limit", type=int, default=30000)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "python_leash.json"))
    a = ap.parse_args()
    global PUSH_IN_BACKWARD
    if a.no_push_in_backward:
        PUSH_IN_BACKWARD = False
    global PULL_IN_PLACE
    if a.no_pull_in_place:
        PULL_IN_PLACE = False
    global SHARED_MEMORY
    SHARED_MEMORY = not a.no_shm
    sys.path.insert(0, a.package or os.path.join(a.build, "python"))
    import leash

    if a.threads > 0:
        torch.set_num_threads(a.threads)
        torch.set_num_interop_threads(1)
    x, y = fmnist.load(True, limit=a.train_limit)
    tx, ty = fmnist.load(False, limit=a.test_limit)
    x, y, tx, ty = map(torch.from_numpy, (x, y, tx, ty))

    port = free_port()
    data_dir = f"/tmp/leash-bench-python-{os.getpid()}"
    server = subprocess.Popen(
        [os.path.join(a.build, "server", "leash-server"), "--shard=0", "--num-shards=1",
         f"--bind=tcp://127.0.0.1:{port}", f"--data-dir={data_dir}", "--no-sync",
         "--checkpoint-interval=0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    servers = f"tcp://127.0.0.1:{port}"
    global SHARD_PID
    SHARD_PID = server.pid
    runs = []
    try:
        for model_name in a.models.split(","):
            for r in range(a.rounds):
                for system in ("local", "leash"):
                    if system == "local":
                        res = run_local(model_name, x, y, tx, ty, a.epochs, a.batch, a.seed)
                    else:
                        res = run_leash(leash, model_name, servers, f"{model_name}{r}", x, y, tx,
                                        ty, a.epochs, a.batch, a.seed, a.staleness)
                    res["round"] = r
                    runs.append(res)
                    extra = ""
                    if system == "leash":
                        pi = res["per_iteration_us"]
                        extra = (f", binding {pi['binding_gil_held']:.0f} us/iter GIL held "
                                 f"({pi['of_which_in_gradient_hooks']:.0f} in hooks) + "
                                 f"{pi['python_layer_of_pull_push']:.0f} us Python in pull/push, "
                                 f"{pi['waiting_gil_released']:.0f} us waiting, sender "
                                 f"{pi['sender_thread_busy']:.0f} us")
                    extra += f", fwd+bwd {res['per_iteration_us']['forward_backward']:.0f} us"
                    extra += ", switches/iter " + ", ".join(
                        f"{k} {v['voluntary']:.1f}+{v['involuntary']:.1f} "
                        f"({v['cpu_us']:.0f} us CPU, {v['runnable_waiting_us']:.0f} us runnable)"
                        for k, v in res["context_switches_per_iteration"].items()
                        if v["voluntary"] + v["involuntary"] >= 0.05 or v["cpu_us"] >= 5)
                    extra += f", thread CPU {res['training_thread_cpu_us_per_iteration']:.0f} us/iter"
                    extra += (f", {res['training_thread_page_faults_per_iteration']:.0f} page "
                              "faults/iter")
                    print(f"[{model_name} {system} round {r}] {res['samples_per_second']:.0f} samples/s, "
                          f"test accuracy {res['test_accuracy']:.4f}{extra}", flush=True)
    finally:
        server.terminate()
        server.wait()
        subprocess.run(["rm", "-rf", data_dir], check=False)

    models = {}
    for model_name in a.models.split(","):
        loc = [r for r in runs if r["model"] == model_name and r["system"] == "local"]
        lea = [r for r in runs if r["model"] == model_name and r["system"] == "leash"]
        local_sps = statistics.median(r["samples_per_second"] for r in loc)
        leash_sps = statistics.median(r["samples_per_second"] for r in lea)
        keys = lea[0]["per_iteration_us"].keys()
        # Each round's Leash run against the local run just before it (the machine is shared:
        # its load drifts between rounds, less within one).
        ratios = [b["samples_per_second"] / a["samples_per_second"] for a, b in zip(loc, lea)]
        models[model_name] = {
            "local_samples_per_second": local_sps,
            "leash_samples_per_second": leash_sps,
            "ratio_leash_over_local": leash_sps / local_sps,
            "ratio_per_round": ratios,
            "median_ratio_per_round": statistics.median(ratios),
            "local_per_iteration_us": {k: statistics.median(r["per_iteration_us"][k] for r in loc)
                                       for k in loc[0]["per_iteration_us"]},
            # CPU time of the training thread per iteration: what the step costs the core it
            # runs on, without the time it waits for a core on a loaded machine.
            "training_thread_cpu_us": {
                "local": statistics.median(r["training_thread_cpu_us_per_iteration"] for r in loc),
                "leash": statistics.median(r["training_thread_cpu_us_per_iteration"] for r in lea)},
            "local_step_us": 1e6 * a.batch / local_sps,
            "leash_step_us": 1e6 * a.batch / leash_sps,
            "per_iteration_us": {k: statistics.median(r["per_iteration_us"][k] for r in lea)
                                 for k in keys},
            "values_per_iteration": lea[0]["values_per_iteration"],
            # voluntary + involuntary context switches per iteration, by thread, medians
            "context_switches_per_iteration": {
                system: {k: {kind: statistics.median(r["context_switches_per_iteration"]
                                                     .get(k, {}).get(kind, 0.0) for r in rs)
                             for kind in ("voluntary", "involuntary", "cpu_us",
                                          "runnable_waiting_us")}
                         for k in rs[0]["context_switches_per_iteration"]}
                for system, rs in (("local", loc), ("leash", lea))},
            "local_test_accuracy": [r["test_accuracy"] for r in loc],
            "leash_test_accuracy": [r["test_accuracy"] for r in lea],
        }
        m = models[model_name]
        print(f"{model_name}: Leash/local = {m['ratio_leash_over_local']:.3f} "
              f"({leash_sps:.0f} vs {local_sps:.0f} samples/s), per round "
              f"{' '.join(f'{r:.2f}' for r in ratios)}; binding "
              f"{m['per_iteration_us']['binding_gil_held']:.0f} us + Python in pull/push "
              f"{m['per_iteration_us']['python_layer_of_pull_push']:.0f} us per iteration of "
              f"{m['leash_step_us']:.0f} us; training thread CPU per iteration "
              f"{m['training_thread_cpu_us']['leash']:.0f} us against "
              f"{m['training_thread_cpu_us']['local']:.0f} us", flush=True)
    pairs = {}
    for model_name in filter(None, a.pairs.split(",")):
        pairs[model_name] = run_pairs(a, model_name)
    out = {"config": vars(a) | {"torch": torch.__version__, "cpus": os.cpu_count(),
                                "torch_threads": torch.get_num_threads(),
                                "note": "1 shard + 1 worker on loopback, staleness "
                                        f"{a.staleness}; medians over rounds"},
           "runs": runs, "models": models, "pairs": pairs}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()

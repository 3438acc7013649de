"""PyTorch training through leash.torch on real shards: two Python workers reach the
accuracy of the same loop without Leash; a worker killed mid-run is evicted and the other
finishes the job; a Python worker and a C++ leash-worker train the same tables in one job.
Workers are subprocesses (examples/torch_fashion_mnist.py and tests/scripts)."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

import leash
from conftest import ROOT, wait_for

pytest.importorskip("torch")
DATA = "/usr/share/datasets/fashion-mnist"
if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
    pytest.skip(f"Fashion-MNIST is not in {DATA} (apt-get install dataset-fashion-mnist)",
                allow_module_level=True)
EXAMPLE = os.path.join(ROOT, "examples", "torch_fashion_mnist.py")
MIXED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "kernel_mlp_worker.py")
MLP = ["--model=mlp", "--optimizer=momentum", "--lr=0.01", "--train-limit=6000",
       "--test-limit=2000", "--chunk-size=500"]


def summary(tmp_path, name):
    with open(tmp_path / f"{name}.json") as f:
        return json.load(f)


def test_two_python_workers_on_two_shards_reach_the_accuracy_of_the_local_loop(
        cluster2, workers, tmp_path):
    # Staleness 0: every step reads the values after both workers' previous steps, so the
    # comparison is of the training, not of the delay. At staleness 1 each step's values miss
    # up to 3 updates, which after these 288 updates costs 0.01-0.11 of accuracy from run to
    # run (12 runs: median 0.033, 3 above 0.07); at 0 the gap was 0.000-0.021 in 8 runs (1
    # worker: 0.004-0.015, i.e. the shards' Adam is the loop's). Staleness 1 is checked
    # exactly in test_torch (the prefetch) and for accuracy in test_movielens.
    flags = MLP + ["--epochs=3", "--staleness=0", "--optimizer=adam", "--lr=0.001"]
    ps = [workers.python(f"w{i}", EXAMPLE, f"--servers={cluster2.servers}", f"--name=w{i}",
                         f"--metrics-out={tmp_path}/w{i}.json", *flags) for i in range(2)]
    local = workers.python("local", EXAMPLE, "--local", f"--metrics-out={tmp_path}/local.json",
                           *flags)
    for p in ps + [local]:
        assert p.wait(timeout=120) == 0, workers.log(p)
    w = [summary(tmp_path, f"w{i}") for i in range(2)]
    base = summary(tmp_path, "local")["test_accuracy"]
    # Exact coverage: every sample of every epoch trained once, by one of the two.
    assert w[0]["samples"] + w[1]["samples"] == 3 * 6000
    assert min(w[0]["samples"], w[1]["samples"]) > 0
    assert base > 0.8
    # The two workers make as many updates as the local loop, from other initial values
    # (drawn on the shards) and in another order of the samples.
    for s in w:
        assert s["test_accuracy"] >= base - 0.07, (s, base)
        assert s["test_accuracy"] > 0.76, s


def test_a_killed_worker_is_evicted_and_the_other_finishes(cluster_factory, workers, tmp_path):
    cluster = cluster_factory(2, ["--lease-timeout=1s"])
    flags = MLP + ["--epochs=4", "--staleness=1", "--step-delay=0.01"]
    survivor = workers.python("w0", EXAMPLE, f"--servers={cluster.servers}", "--name=w0",
                              f"--metrics-out={tmp_path}/w0.json", *flags)
    victim = workers.python("w1", EXAMPLE, f"--servers={cluster.servers}", "--name=w1", *flags)
    wait_for(lambda: "chunk" in workers.log(victim) or victim.poll() is not None, 60,
             "the victim to train a chunk")
    assert victim.poll() is None, workers.log(victim)
    victim.send_signal(signal.SIGKILL)  # no leave: the shards must evict it
    victim.wait()
    assert survivor.wait(timeout=120) == 0, workers.log(survivor)
    with leash.Client(cluster.servers, register=False) as observer:
        st = observer.status()
    assert st["coverage"]["epochs_done"] == 4, st["coverage"]
    assert st["workers"] == [], st["workers"]  # the survivor left, the victim was evicted
    assert summary(tmp_path, "w0")["test_accuracy"] > 0.7


def test_a_python_worker_and_a_cpp_worker_train_the_same_tables(cluster2, workers, tmp_path):
    cpp = workers.cpp("cpp", f"--servers={cluster2.servers}", "--name=cpp", "--model=mlp",
                      "--staleness=1", "--epochs=3", "--train-limit=6000", "--test-limit=2000",
                      "--chunk-size=500", "--log-every=1000", "--step-delay-factor=30",
                      f"--metrics-out={tmp_path}/cpp.json")
    # The C++ worker computes 30x slower, so that the Python one (which takes a second or
    # two to import torch) joins well before the job ends.
    py = workers.python("py", MIXED, cluster2.servers, 6000, 500, 3, tmp_path / "py.json")
    assert cpp.wait(timeout=120) == 0, workers.log(cpp)
    assert py.wait(timeout=120) == 0, workers.log(py)
    py_summary = summary(tmp_path, "py")
    cpp_log = workers.log(cpp)
    trained = re.findall(r"this worker trained (\d+) samples", cpp_log)
    assert trained, cpp_log
    cpp_samples = sum(int(n) for n in trained)
    assert py_summary["samples"] > 0 and cpp_samples > 0, (py_summary, cpp_log)
    assert py_summary["samples"] + cpp_samples == 3 * 6000
    cpp_acc = float(re.search(r"final test accuracy ([\d.]+)%", cpp_log).group(1)) / 100
    assert cpp_acc > 0.7, cpp_log
    assert py_summary["test_accuracy"] > 0.7, py_summary


def test_a_worker_paused_past_its_lease_rejoins_and_the_job_finishes(cluster_factory, workers,
                                                                    tmp_path):
    cluster = cluster_factory(1, ["--lease-timeout=500ms"])
    flags = MLP + ["--epochs=2", "--staleness=1", "--step-delay=0.005"]
    w = workers.python("w0", EXAMPLE, f"--servers={cluster.servers}", "--name=w0",
                       f"--metrics-out={tmp_path}/w0.json", *flags)
    wait_for(lambda: "chunk" in workers.log(w) or w.poll() is not None, 60, "a trained chunk")
    assert w.poll() is None, workers.log(w)
    w.send_signal(signal.SIGSTOP)
    with leash.Client(cluster.servers, register=False) as observer:
        wait_for(lambda: observer.status()["workers"] == [], 10, "the eviction")
        w.send_signal(signal.SIGCONT)
        try:
            rc = w.wait(timeout=60)
        except subprocess.TimeoutExpired:
            w.send_signal(signal.SIGUSR1)  # the example dumps its threads' stacks
            time.sleep(1)
            raise AssertionError("the resumed worker did not finish: " + workers.log(w))
        assert rc == 0, workers.log(w)
        assert observer.status()["coverage"]["epochs_done"] == 2
    s = summary(tmp_path, "w0")
    assert s["rejoins"] >= 1, s
    assert s["samples"] >= 2 * 6000  # a chunk cut short by the eviction is trained again

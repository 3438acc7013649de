#!/usr/bin/python3
"""MovieLens-100k click-through benchmark: leash-worker --model ctr in --local mode, with
1 shard + 1 worker and with 2 shards + 2 workers, against bench/torch_ctr.py (the same
model, split, initialization and Adagrad, one process, 1 thread) in the same run. Reports
test AUC and log loss per epoch and samples/s, against the targets: AUC within 0.005 of
PyTorch, samples/s at least PyTorch's. Writes --out (JSON) and prints a Markdown table.
Run under /usr/bin/python3 after building leash-server and leash-worker."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import leash as L  # noqa: E402


def torch_run(epochs, tmp, timeout):
    out = os.path.join(tmp, "torch.json")
    with open(os.path.join(tmp, "torch.log"), "w") as lf:
        rc = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "torch_ctr.py"), "--epochs", str(epochs),
                             "--out", out], stdout=lf, stderr=subprocess.STDOUT, timeout=timeout).returncode
    if rc != 0:
        raise L.RunError(f"torch_ctr.py exited {rc} (log {tmp}/torch.log)")
    with open(out) as f:
        r = json.load(f)
    n = sum(e["samples_per_second"] * e["train_seconds"] for e in r["epochs"])
    return {"samples_per_second": n / sum(e["train_seconds"] for e in r["epochs"]),
            "epochs": [{k: e[k] for k in ("epoch", "test_auc", "test_loss", "test_accuracy")} for e in r["epochs"]]}


def leash_epochs(metrics):
    return [{"epoch": e["epoch"], "test_auc": e["test_auc"], "test_loss": e["test_loss"],
             "test_accuracy": e["test_accuracy"]} for e in metrics["epochs"]]


def run(build, epochs, staleness, tmp, timeout):
    """Every system in turn; returns {system: {"samples_per_second", "epochs": [...],
    "auc_gap" (last epoch's AUC minus PyTorch's), "speed_ratio" (over PyTorch's)}}."""
    res = {"pytorch": torch_run(epochs, tmp, timeout)}
    r = L.run_local(build, tmp, "ctr", epochs, "ctr-local", timeout=timeout)
    res["leash local"] = {"samples_per_second": r["samples_per_second"], "epochs": leash_epochs(r["metrics"])}
    for shards in (1, 2):
        r = L.run_cluster(build, tmp, "ctr", epochs, f"ctr-{shards}x{shards}", shards=shards, workers=shards,
                          staleness=staleness, timeout=timeout)
        res[f"leash {shards}+{shards}"] = {"samples_per_second": r["samples_per_second"],
                                            "epochs": leash_epochs(r["metrics"][0])}
    base = res["pytorch"]
    for r in res.values():
        r["auc_gap"] = r["epochs"][-1]["test_auc"] - base["epochs"][-1]["test_auc"]
        r["speed_ratio"] = r["samples_per_second"] / base["samples_per_second"]
    return res


def table(res):
    """The results as Markdown table lines."""
    epochs = len(res["pytorch"]["epochs"])
    lines = ["| system | " + " | ".join(f"AUC e{e + 1}" for e in range(epochs)) +
             " | log loss | samples/s | AUC - PyTorch | samples/s / PyTorch |", "|---" * (epochs + 5) + "|"]
    for name, r in res.items():
        lines.append(f"| {name} | " + " | ".join(f"{e['test_auc']:.4f}" for e in r["epochs"]) +
                     f" | {r['epochs'][-1]['test_loss']:.4f} | {r['samples_per_second']:.0f} | {r['auc_gap']:+.4f} |"
                     f" {r['speed_ratio']:.2f} |")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--staleness", type=int, default=1)
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--out", default="ctr_bench.json")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="leash-ctr-") as tmp:
        res = run(a.build, a.epochs, a.staleness, tmp, a.timeout)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print("\n".join(table(res)))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""A/B of two builds of the Python package, interleaved: a PyTorch loop through leash.torch
with package A against the same loop with package B, in alternate invocations of
bench/python_leash.py (A B B A, then B A A B, ...), each with its own local (torch.optim)
run as the peer of that moment. The shard is the same binary for both (--build).

Per invocation: Leash samples/s, Leash/local, the training thread's CPU per iteration, the
sender thread's CPU per iteration (/proc schedstat) and its busy time, the binding's
GIL-held time. Reports per-round figures, medians and B/A ratios, as JSON, Markdown and a
plot.

Usage: /usr/bin/python3 bench/python_ab.py --a PKG_A --b PKG_B [--rounds 6] [--no-shm]
       [--no-push-in-backward] [--a-args ARGS] [--b-args ARGS] [--model mlp] [--epochs 3]
       [--train-limit 30000] [--name python_ab] [--out DIR]
Each PKG is a directory holding the leash package (a build's python/ directory). --a-args
and --b-args pass more python_leash.py flags to one side: the same package with and without
an option (e.g. --a PKG --b PKG --a-args=--no-pull-in-place).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common.util import pyplot  # noqa: E402


def one(a, side, tmp, tag):
    pkg = a.a if side == "a" else a.b
    out = os.path.join(tmp, f"{tag}.json")
    argv = ["/usr/bin/python3", os.path.join(HERE, "python_leash.py"), "--build", a.build,
            "--package", pkg, "--models", a.model, "--rounds", "1", "--epochs", str(a.epochs),
            "--train-limit", str(a.train_limit), "--threads", "1", "--out", out]
    if a.no_shm:
        argv.append("--no-shm")
    if a.no_push_in_backward:
        argv.append("--no-push-in-backward")
    argv += (a.a_args if side == "a" else a.b_args).split()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"python_leash.py with {pkg} exited {p.returncode}: {p.stderr[-2000:]}")
    j = json.load(open(out))
    lea = next(r for r in j["runs"] if r["system"] == "leash")
    loc = next(r for r in j["runs"] if r["system"] == "local")
    sw = lea["context_switches_per_iteration"]
    sender = next((v for k, v in sw.items() if k.startswith("leash-sender")), {})
    return {
        "leash_samples_per_second": lea["samples_per_second"],
        "local_samples_per_second": loc["samples_per_second"],
        "leash_over_local": lea["samples_per_second"] / loc["samples_per_second"],
        "training_thread_cpu_us": lea["training_thread_cpu_us_per_iteration"],
        "sender_cpu_us": sender.get("cpu_us"),
        "sender_busy_us": lea["per_iteration_us"]["sender_thread_busy"],
        "binding_gil_held_us": lea["per_iteration_us"]["binding_gil_held"],
        "forward_backward_us": lea["per_iteration_us"]["forward_backward"],
        "pushes_handed_over": lea.get("pushes_handed_over"),
        "load_average": os.getloadavg()[0],
    }


FIGURES = [("leash_samples_per_second", "Leash samples/s"),
           ("leash_over_local", "Leash/local"),
           ("training_thread_cpu_us", "training thread CPU per iteration, us"),
           ("sender_cpu_us", "sender thread CPU per iteration, us"),
           ("sender_busy_us", "sender busy per iteration, us"),
           ("binding_gil_held_us", "binding GIL held per iteration, us")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="package directory A (before)")
    ap.add_argument("--b", required=True, help="package directory B (after)")
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"),
                    help="build with server/leash-server (both use it)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--train-limit", type=int, default=30000)
    ap.add_argument("--no-shm", action="store_true", help="socket only, as between hosts")
    ap.add_argument("--no-push-in-backward", action="store_true",
                    help="leash.torch pushes the gradients in push(), not from backward's hooks")
    ap.add_argument("--a-args", default="", help="more python_leash.py flags for A")
    ap.add_argument("--b-args", default="", help="more python_leash.py flags for B")
    ap.add_argument("--name", default="python_ab")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    a = ap.parse_args()
    for pkg in (a.a, a.b):
        if not os.path.isdir(os.path.join(pkg, "leash")):
            sys.exit(f"python_ab.py: {pkg} holds no leash package (expected {pkg}/leash/)")
    t0 = time.time()
    runs = {"a": [], "b": []}
    with tempfile.TemporaryDirectory(prefix="leash-python-ab-") as tmp:
        for r in range(a.rounds):
            order = ("a", "b", "b", "a") if r % 2 == 0 else ("b", "a", "a", "b")
            for i, side in enumerate(order):
                res = one(a, side, tmp, f"{r}{i}{side}")
                res["round"] = r
                runs[side].append(res)
                print(f"[round {r} {side.upper()}] {res['leash_samples_per_second']:.0f} samples/s "
                      f"({res['leash_over_local']:.2f}x local), training thread "
                      f"{res['training_thread_cpu_us']:.0f} us, sender "
                      f"{res['sender_cpu_us'] or 0:.0f} us CPU per iteration, load "
                      f"{res['load_average']:.1f}", flush=True)
    med = {s: {k: statistics.median(x[k] for x in v if x[k] is not None) for k, _ in FIGURES}
           for s, v in runs.items()}
    ratio = {k: med["b"][k] / med["a"][k] for k, _ in FIGURES if med["a"][k]}
    out = {"config": vars(a) | {"cpus": os.cpu_count(), "minutes": (time.time() - t0) / 60},
           "runs": runs, "medians": med, "b_over_a": ratio}
    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.out, a.name)
    with open(base + ".json", "w") as f:
        json.dump(out, f, indent=1)
    lines = [f"# Python package A/B: {a.a} (A) against {a.b} (B)", "",
             f"`bench/python_ab.py`, {time.strftime('%Y-%m-%dT%H:%M:%S%z')}, {os.cpu_count()} cores, "
             f"{a.rounds} rounds (A B B A, B A A B, ...), {a.model}, {a.epochs} epochs of "
             f"{a.train_limit} samples, 1 worker + 1 shard, staleness 1, threads 1, "
             f"{'socket only' if a.no_shm else 'shared memory where offered'}"
             f"{', pushes in push() (no hooks)' if a.no_push_in_backward else ''}"
             f"{f'; A with `{a.a_args}`' if a.a_args else ''}"
             f"{f'; B with `{a.b_args}`' if a.b_args else ''}; took "
             f"{out['config']['minutes']:.1f} min. Raw: `{a.name}.json`.", "",
             "| figure | A (median) | B (median) | B/A | A per invocation | B per invocation |",
             "|---|---|---|---|---|---|"]
    for k, label in FIGURES:
        fa = ", ".join(f"{x[k]:.3g}" for x in runs["a"] if x[k] is not None)
        fb = ", ".join(f"{x[k]:.3g}" for x in runs["b"] if x[k] is not None)
        lines.append(f"| {label} | {med['a'][k]:.4g} | {med['b'][k]:.4g} | "
                     f"{ratio.get(k, float('nan')):.3f} | {fa} | {fb} |")
    lines.append("")
    lines.append("Load average (1 min) per invocation: A " +
                 ", ".join(f"{x['load_average']:.1f}" for x in runs["a"]) + "; B " +
                 ", ".join(f"{x['load_average']:.1f}" for x in runs["b"]) + ".")
    with open(base + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    plt = pyplot()
    if plt is not None:
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
        for ax, (k, label) in zip(axes, [FIGURES[0], FIGURES[2], FIGURES[3]]):
            for s, c in (("a", "tab:gray"), ("b", "tab:blue")):
                xs = [x["round"] for x in runs[s] if x[k] is not None]
                ys = [x[k] for x in runs[s] if x[k] is not None]
                ax.scatter(xs, ys, color=c, label=s.upper(), s=14)
            ax.set_title(label, fontsize=9)
            ax.set_xlabel("round")
        axes[0].legend()
        fig.tight_layout()
        fig.savefig(base + ".png", dpi=90)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Clock steps against a step per push, under work in proportion to speed (issue 17): the
straggler part's persistent 3x straggler (3 leash-worker processes, 1 leash-server shard, w2
at --step-delay-factor 3, --global-batch 192, --staleness 0), run with `leash-worker
--clock-steps` true and false alternately in each round (A B B A, B A A B, ...), BSP beside
them once per round (a step per push is the default; --clock-steps turns clock steps on).
Timed runs only (no evaluation before the end), so every figure is the
cluster's samples/s and the accuracy on the whole test set after the same samples.

  python3 bench/clock_steps_ab.py --out DIR [--models mlp,cnn] [--rounds 4]

Writes DIR/clock_steps_ab.json and DIR/clock_steps_ab.md: per model the medians and the
per-round ratios (clock steps / a step per push) and accuracy differences; and, where
matplotlib is installed, DIR/clock_steps_ab.png. `--plot OUT.png A.json [B.json ...]` draws
the plot of earlier results only (several models' files together).
"""
import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import straggler_bench as S  # noqa: E402
from common.util import median, pyplot, write_json  # noqa: E402

MODES = {"clock": "proportional_s0_clock_steps", "push": "proportional_s0", "bsp": "bsp"}


LABELS = (("push", "a step per push"), ("clock", "clock steps"), ("bsp", "BSP"))


def plot(runs, path):
    """Samples/s and accuracy of every run, by model and mode (a dot per run, a bar at the
    median). Returns False without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    models = list(runs)
    fig, axes = plt.subplots(2, len(models), figsize=(4.5 * len(models), 6.5), squeeze=False)
    for col, model in enumerate(models):
        for row, (key, title, scale) in enumerate((("samples_per_second", "samples/s", 1),
                                                  ("final_test_accuracy", "test accuracy (%)", 100))):
            ax = axes[row][col]
            for i, (k, label) in enumerate(LABELS):
                ys = [scale * x[key] for x in runs[model].get(k, []) if x.get(key) is not None]
                if not ys:
                    continue
                ax.bar(i, median(ys), color="#c8d8ea", width=0.6)
                ax.plot([i] * len(ys), ys, "o", color="#1f4e79", markersize=4)
            ax.set_xticks(range(len(LABELS)), [label for _, label in LABELS])
            ax.set_title(f"{model}: {title}")
            if row == 1:
                vals = [scale * x[key] for k, _ in LABELS for x in runs[model].get(k, [])]
                ax.set_ylim(min(vals) - 1, max(vals) + 0.5)
    fig.suptitle("3 workers (one 3x slower) + 1 shard, --global-batch 192, s=0: bars at the median")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--plot":
        runs = {}
        for f in sys.argv[3:]:
            with open(f) as fh:
                runs.update(json.load(fh)["runs"])
        sys.exit(0 if plot(runs, sys.argv[2]) else "matplotlib is not installed (scripts/install-deps.sh bench)")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--no-bsp", action="store_true", help="leave BSP out (half the time for the CNN)")
    a = ap.parse_args()
    c = S.config(False)
    os.makedirs(a.out, exist_ok=True)
    runs = {m: {k: [] for k in MODES} for m in a.models.split(",")}
    with tempfile.TemporaryDirectory(prefix="leash-clock-steps-") as tmp:
        for r in range(a.rounds):
            for model in runs:
                order = ["clock", "push", "push", "clock"] if r % 2 == 0 else ["push", "clock", "clock", "push"]
                order = order[:2] + ([] if a.no_bsp else ["bsp"]) + order[2:]
                for i, k in enumerate(order):
                    tag = f"cs-{model}-{k}-{r}-{i}"
                    load = os.getloadavg()[0]
                    out = S._cluster(a.build, tmp, c, model, MODES[k], tag, [1, 1, S.FACTOR], curve=False)
                    out.update({"round": r, "load_before": load})
                    out.pop("fine_curve", None)
                    runs[model][k].append(out)
                    print(f"{model} round {r + 1}/{a.rounds} {k}: {out['samples_per_second']:.0f} samples/s, "
                          f"accuracy {out['final_test_accuracy']}, load {load:.1f}", flush=True)
                write_json(os.path.join(a.out, "clock_steps_ab.json"), {"runs": runs, "rounds_done": r + 1})
    md = ["# Clock steps against a step per push (persistent 3x straggler, --global-batch 192, s=0)", "",
          f"`python3 bench/clock_steps_ab.py --rounds {a.rounds}`: 3 workers + 1 shard, timed runs (no evaluation "
          "before the end), clock steps (`--clock-steps`) and a step per push (the default) alternated "
          "within each round, BSP once per round.", "",
          "| model | mode | median samples/s | median accuracy | runs (samples/s) | runs (accuracy) |",
          "|---|---|---|---|---|---|"]
    summary = {}
    for model, by in runs.items():
        for k, label in LABELS:
            xs = by[k]
            if not xs:
                continue
            sps = [x["samples_per_second"] for x in xs]
            acc = [x["final_test_accuracy"] for x in xs]
            md.append(f"| {model} | {label} | {median(sps):.0f} | {100 * median(acc):.2f}% | "
                      f"{', '.join(f'{v:.0f}' for v in sps)} | {', '.join(f'{100 * v:.2f}' for v in acc)} |")
        # Per round: the round's two runs of each mode, by their means.
        ratios, diffs = [], []
        for r in range(a.rounds):
            cl = [x for x in by["clock"] if x["round"] == r]
            pu = [x for x in by["push"] if x["round"] == r]
            if cl and pu:
                ratios.append(sum(x["samples_per_second"] for x in cl) / sum(x["samples_per_second"] for x in pu))
                diffs.append(100 * (sum(x["final_test_accuracy"] for x in cl) / len(cl) -
                                    sum(x["final_test_accuracy"] for x in pu) / len(pu)))
        summary[model] = {"speed_ratio_per_round": ratios, "speed_ratio_median": median(ratios),
                          "accuracy_diff_points_per_round": diffs, "accuracy_diff_median": median(diffs)}
        md += ["", f"{model}: clock steps / a step per push, samples/s per round "
               f"{', '.join(f'{v:.3f}' for v in ratios)} (median **{median(ratios):.3f}x**); accuracy difference "
               f"per round {', '.join(f'{v:+.2f}' for v in diffs)} points (median **{median(diffs):+.2f}**)."]
        md.append("")
    write_json(os.path.join(a.out, "clock_steps_ab.json"), {"runs": runs, "rounds_done": a.rounds, "summary": summary})
    with open(os.path.join(a.out, "clock_steps_ab.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    if plot(runs, os.path.join(a.out, "clock_steps_ab.png")):
        print(f"plot: {os.path.join(a.out, 'clock_steps_ab.png')}")


if __name__ == "__main__":
    main()

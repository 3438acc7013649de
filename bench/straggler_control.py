"""Issue 17's control: what the 3 + 1 cluster trains with equal workers beside what it trains
with w2 3x slower, in the same rounds, so that the straggler's cost is told apart from the
cost of the cluster itself (one shard that every worker waits for at s=0).

Each round runs bench/straggler_bench.py once per factor (--factor 1: equal workers, the
control; --factor 3: the suite's persistent straggler), alternating which goes first, each
with BSP and work in proportion to speed at s=0 and the solo speeds of its workers (alone:
one 1 worker + 1 shard job at a time; contended: the three jobs at once). Reported per round
and by median:
  - the cluster's samples/s over its workers' summed solo speeds (issue 17's 0.9x target is
    this ratio for the 3x straggler);
  - the straggler's cost: the straggler cluster's ratio over the control's BSP ratio, paired
    in the round (1.0: the slow worker costs the cluster only the work it does not do);
  - the straggler cluster's samples/s over the control's BSP samples/s times the capacity
    left, (2 + 1/3) / 3;
  - the control's BSP over 0.9x the straggler's solo sum: whether a cluster with no straggler
    at all reaches the target asked of the cluster with one;
  - the time each worker waits at the clock (its pull) per iteration: the fast workers' wait
    beside the straggler's. What a fast worker waits beyond the straggler's own wait is time
    spent waiting for the straggler; what both wait is the clock's turnaround.

Usage: /usr/bin/python3 bench/straggler_control.py --out DIR [--rounds 5] [--models mlp,cnn]
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common.util import cpu_model, median, now, pyplot, spaced, write_json  # noqa: E402

FACTORS = (1, 3)
MODES = ("bsp", "proportional_s0")
CAPACITY = (2 + 1 / 3) / 3  # the straggler cluster's compute over the control's
TARGET = 0.9


def one_run(build, out, model, factor, r, modes, timeout, epochs):
    """One straggler_bench.py invocation: its stragglers.json, or {"error": ...}."""
    d = os.path.join(out, "raw", f"{model}_f{factor}_r{r}")
    only = ",".join([f"persistent/{model}/{m}" for m in modes] +
                    [f"persistent/{model}/solo_alone", f"persistent/{model}/solo_contended"])
    cmd = [sys.executable, os.path.join(HERE, "straggler_bench.py"), "--build", build, "--out", d, "--factor",
           str(factor), "--only", only, "--modes", ",".join(modes), "--rounds", "1"]
    cmd += ["--epochs", str(epochs)] if epochs else []
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "log"), "w") as lf:
        try:
            rc = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout} s (log {d}/log)"}
    path = os.path.join(d, "stragglers.json")
    if rc != 0 or not os.path.exists(path):
        return {"error": f"straggler_bench.py exited {rc} (log {d}/log)"}
    with open(path) as f:
        return json.load(f)


def extract(res, model, modes):
    """The figures of one invocation: solo sums, and per mode samples/s, accuracy and waits."""
    s = res["summary"][f"persistent/{model}"]
    row = {"solo_sum_alone": s.get("solo_sum_alone"), "solo_sum_contended": s.get("solo_sum_contended"),
           "load_before": res["summary"].get("median_load_before")}
    for m in modes:
        runs = [x for x in res["runs"].get(f"persistent/{model}/{m}", []) if "error" not in x]
        if not runs:
            row[m] = None
            continue
        x = runs[0]
        it = x["per_iteration_us"]
        row[m] = {"samples_per_second": x["samples_per_second"], "accuracy": x["final_test_accuracy"],
                  "samples_per_worker": x["samples_per_worker"],
                  "step_us": [w["step"] for w in it], "compute_us": [w["compute"] for w in it],
                  "delay_us": [w["delay"] for w in it], "pull_us": [w["pull"] for w in it]}
    return row


def ratios(round_rows):
    """Per round: {factor: row}. The figures the summary reports, per round."""
    out = {}
    for m in MODES:
        for f in FACTORS:
            k = f"f{f}/{m}"
            out[k] = {"over_solo_alone": [], "over_solo_contended": [], "accuracy": [], "samples_per_second": [],
                      "fast_wait_us": [], "slow_wait_us": [], "accuracy_minus_bsp_points": []}
        out[f"f3/{m}"].update({"straggler_cost": [], "straggler_cost_contended": [], "over_capacity": []})
    out["control_bsp_over_target"] = []
    for rr in round_rows:
        if any(rr.get(f) is None or "error" in rr[f] for f in FACTORS):
            continue
        ctl = rr[1].get("bsp")
        for f in FACTORS:
            row = rr[f]
            for m in MODES:
                v = row.get(m)
                if v is None:
                    continue
                o = out[f"f{f}/{m}"]
                sps = v["samples_per_second"]
                o["samples_per_second"].append(sps)
                o["accuracy"].append(v["accuracy"])
                bsp = row.get("bsp")
                if bsp and bsp["accuracy"] is not None and v["accuracy"] is not None:
                    o["accuracy_minus_bsp_points"].append((v["accuracy"] - bsp["accuracy"]) * 100)
                if row["solo_sum_alone"]:
                    o["over_solo_alone"].append(sps / row["solo_sum_alone"])
                if row["solo_sum_contended"]:
                    o["over_solo_contended"].append(sps / row["solo_sum_contended"])
                o["fast_wait_us"].append(sum(v["pull_us"][:2]) / 2)
                o["slow_wait_us"].append(v["pull_us"][2])
                if f == 3 and ctl and rr[1]["solo_sum_alone"] and row["solo_sum_alone"]:
                    o["straggler_cost"].append((sps / row["solo_sum_alone"]) /
                                               (ctl["samples_per_second"] / rr[1]["solo_sum_alone"]))
                    o["over_capacity"].append(sps / (ctl["samples_per_second"] * CAPACITY))
                    if row["solo_sum_contended"] and rr[1]["solo_sum_contended"]:
                        o["straggler_cost_contended"].append(
                            (sps / row["solo_sum_contended"]) /
                            (ctl["samples_per_second"] / rr[1]["solo_sum_contended"]))
        if ctl and rr[3].get("solo_sum_alone"):
            out["control_bsp_over_target"].append(ctl["samples_per_second"] / (TARGET * rr[3]["solo_sum_alone"]))
    return out


def med(xs, spec=".2f"):
    m = median(xs)
    return "—" if m is None else format(m, spec)


def summary_md(res):
    lines = [f"# Issue 17's control: equal workers beside a 3x straggler ({res['date']})", "",
             f"`bench/straggler_control.py --rounds {res['rounds']} --models {','.join(res['models'])}"
             f"{' --epochs ' + str(res['epochs']) if res.get('epochs') else ''}` on "
             f"{res['cpu']} ({res['cores']} cores), load before the rounds {res['loads']}. Each round runs "
             "`straggler_bench.py` with `--factor 1` (w2 as fast as the others: the control) and `--factor 3` "
             "(the suite's persistent straggler), in alternating order, 3 workers + 1 shard, BSP and "
             "proportional work at s=0, with the workers' solo speeds measured in the same invocation "
             "(alone: one 1 + 1 job at a time; contended: the three at once). Medians, per round in brackets.", ""]
    for model in res["models"]:
        r = res["figures"][model]
        lines += [f"## {model.upper()}", "",
                  "| w2 | mode | samples/s | over the solo sum, alone | contended | accuracy | fast workers' wait per "
                  "iteration, µs | the straggler's wait, µs |", "|---|---|---|---|---|---|---|---|"]
        for f in FACTORS:
            for m in MODES:
                o = r[f"f{f}/{m}"]
                lines.append(
                    f"| {'as fast' if f == 1 else f'{f}x slower'} | {m} | {med(o['samples_per_second'], '.0f')} | "
                    f"**{med(o['over_solo_alone'])}** ({spaced(o['over_solo_alone'])}) | "
                    f"{med(o['over_solo_contended'])} ({spaced(o['over_solo_contended'])}) | "
                    f"{med([a * 100 for a in o['accuracy'] if a is not None])}% | {med(o['fast_wait_us'], '.0f')} | "
                    f"{med(o['slow_wait_us'], '.0f')} |")
        p = r["f3/proportional_s0"]
        b = r["f3/bsp"]
        lines += ["",
                  f"- **The straggler's cost** (the 3x cluster's share of its solo sum over the control BSP's share of "
                  f"its own, paired per round): proportional work at s=0 **{med(p['straggler_cost'])}** "
                  f"({spaced(p['straggler_cost'])}), BSP {med(b['straggler_cost'])} ({spaced(b['straggler_cost'])}). "
                  "1.0: the slow worker costs the cluster only the work it does not do. The same against the "
                  f"contended solo sums: proportional s=0 {med(p['straggler_cost_contended'])} "
                  f"({spaced(p['straggler_cost_contended'])}), BSP {med(b['straggler_cost_contended'])}. Where the "
                  "workers share cores, the straggler's injected sleep (2/3 of its time) leaves its core to the "
                  "others, which the alone sums credit to the cluster; the contended sums (the three solo jobs at "
                  "once, sleeping alike) do not.",
                  f"- The 3x cluster over the control's BSP times the capacity left ((2 + 1/3) / 3): proportional s=0 "
                  f"{med(p['over_capacity'])} ({spaced(p['over_capacity'])}), BSP {med(b['over_capacity'])}.",
                  f"- **The control's BSP over the target** (0.9x the 3x cluster's solo sum, alone): "
                  f"**{med(r['control_bsp_over_target'])}** ({spaced(r['control_bsp_over_target'])}): below 1, "
                  "three workers at full speed, with no straggler and more compute, train less than the target asks "
                  "of the cluster with a straggler.",
                  f"- Accuracy after equal samples, proportional s=0 minus BSP in the same invocation: with the "
                  f"straggler {med(p['accuracy_minus_bsp_points'])} points ({spaced(p['accuracy_minus_bsp_points'])}), "
                  f"with equal workers {med(r['f1/proportional_s0']['accuracy_minus_bsp_points'])} "
                  f"({spaced(r['f1/proportional_s0']['accuracy_minus_bsp_points'])}).",
                  f"- Waiting for the straggler: under BSP the fast workers wait {med(b['fast_wait_us'], '.0f')} µs "
                  f"per iteration against its {med(b['slow_wait_us'], '.0f')}; under proportional work "
                  f"{med(p['fast_wait_us'], '.0f')} against {med(p['slow_wait_us'], '.0f')}.", ""]
    return "\n".join(lines)


def plot(res, out_dir):
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(res["models"]), figsize=(5 * len(res["models"]), 4), squeeze=False)
    for ax, model in zip(axes[0], res["models"]):
        r = res["figures"][model]
        names = [f"w2 {'as fast' if f == 1 else f'{f}x'}\n{m.replace('proportional_s0', 'prop. s=0')}"
                 for f in FACTORS for m in MODES]
        vals = [median(r[f"f{f}/{m}"]["over_solo_alone"]) or 0 for f in FACTORS for m in MODES]
        ax.bar(range(len(vals)), vals, color=["#888", "#4a7", "#888", "#4a7"])
        ax.axhline(TARGET, ls="--", color="r", label="issue 17's target (0.9x)")
        ax.set_xticks(range(len(vals)))
        ax.set_xticklabels(names, fontsize=8)
        ax.set_ylabel("cluster samples/s over the solo sum (alone)")
        ax.set_title(model.upper())
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "straggler_control.png"), dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--models", default="mlp")
    ap.add_argument("--epochs", type=int, help="straggler_bench.py --epochs (default: its own, 1)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per straggler_bench.py invocation")
    ap.add_argument("--summary-only", action="store_true", help="rewrite the summary from OUT/straggler_control.json")
    a = ap.parse_args()
    models = a.models.split(",")
    if any(m not in ("mlp", "cnn") for m in models):
        ap.error(f"--models: mlp and/or cnn, got {a.models}")
    path = os.path.join(a.out, "straggler_control.json")
    if a.summary_only:
        with open(path) as f:
            res = json.load(f)
    else:
        res = {"date": now(), "cpu": cpu_model(), "cores": os.cpu_count(), "rounds": a.rounds, "models": models,
               "epochs": a.epochs, "rows": {m: [] for m in models}}
        for r in range(a.rounds):
            for model in models:
                rr = {}
                for f in (FACTORS if r % 2 == 0 else FACTORS[::-1]):
                    t0 = time.monotonic()
                    got = one_run(a.build, a.out, model, f, r, MODES, a.timeout, a.epochs)
                    rr[f] = got if "error" in got else extract(got, model, MODES)
                    print(f"round {r + 1}/{a.rounds} {model} factor {f}: {time.monotonic() - t0:.0f} s "
                          f"{rr[f].get('error', '')}", flush=True)
                res["rows"][model].append({str(k): v for k, v in rr.items()})
                write_json(path, res)
    res["figures"] = {m: ratios([{int(k): v for k, v in rr.items()} for rr in res["rows"][m]]) for m in models}
    loads = [rr[k].get("load_before") for m in models for rr in res["rows"][m] for k in rr if "error" not in rr[k]]
    res["loads"] = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "unknown"
    write_json(path, res)
    md = summary_md(res)
    with open(os.path.join(a.out, "straggler_control.md"), "w") as f:
        f.write(md)
    plot(res, a.out)
    print(md)


if __name__ == "__main__":
    main()

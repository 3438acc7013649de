#!/usr/bin/python3
"""The cost of R=2 against R=1 pooled over several `bench/replication.py --only cost` runs:
every round's R=2/R=1 ratio of each figure, from each run's replication.json, and their
median, as one run of that many rounds would give it. A single run of 5 rounds on 2 shared
cores moves by several points; the pooled median is the firmer figure.

    /usr/bin/python3 bench/replication_pool.py RUN.json [RUN.json ...] [--md OUT.md]

Prints a Markdown table (and writes it to --md): per figure, the rounds, the median cost
and the runs' own medians; for the 4 KB socket push also its least cost, one hop (half the
raw shared-memory round trip each round measured) over R=1's round trip, pooled the same
way. Costs: 1 - R2/R1 for throughputs, R2/R1 - 1 for latencies, as replication.py reports
them. A run's --versus rows are not pooled.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.util import median  # noqa: E402

FIGURES = (("mlp_samples_per_second", "MLP 1+1 s=1 samples/s"),
           ("push_4KB_p50_us", "4 KB push p50, socket"),
           ("push_4MB_mb_per_s", "4 MB push MB/s, 8 in flight, socket"),
           ("push_4KB_shm_p50_us", "4 KB push p50, shared memory"),
           ("push_4MB_shm_mb_per_s", "4 MB push MB/s, 8 in flight, shared memory"))


def cost(ratio, higher_is_better):
    return 1 - ratio if higher_is_better else ratio - 1


def hop_floors(runs):
    """The 4 KB push's least cost per round (backup answering: one hop more than R=1's round
    trip, the hop half a raw round trip through shared memory), from each run's floor rows."""
    out = []
    for _, res in runs:
        f = res.get("cost", {}).get("summary", {}).get("push_4KB_floor") or {}
        out += [r["shm_rtt_us"] / 2 / r["r1_us"] for r in f.get("per_round", []) if r.get("r1_us")]
    return out


def pool(runs):
    rows = []
    for key, label in FIGURES:
        ratios, run_costs, higher = [], [], None
        for path, res in runs:
            s = res.get("cost", {}).get("summary", {}).get(key)
            if not s:
                continue
            higher = s["higher_is_better"]
            ratios += s["r2_over_r1_per_round"]
            run_costs.append(s["median_cost"])
        if ratios:
            floors = hop_floors(runs) if key == "push_4KB_p50_us" else []
            rows.append({"figure": label, "rounds": len(ratios), "median_cost": cost(median(ratios), higher),
                         "least": median(floors) if floors else None, "run_costs": run_costs})
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="replication.json files of --only cost runs")
    p.add_argument("--md", help="also write the table here")
    a = p.parse_args()
    runs = []
    for path in a.runs:
        try:
            with open(path) as f:
                runs.append((path, json.load(f)))
        except (OSError, ValueError) as e:
            sys.exit(f"replication_pool.py: cannot read {path}: {e}")
    rows = pool(runs)
    if not rows:
        sys.exit("replication_pool.py: no cost rounds in " + ", ".join(a.runs)
                 + " (runs of bench/replication.py with the cost part)")
    md = [f"R=2 against R=1 pooled over {len(runs)} run(s) of `bench/replication.py` "
          f"({', '.join(os.path.relpath(x) for x, _ in runs)}): every round's R=2/R=1, median.", "",
          "| figure | rounds | pooled median cost | the runs' own medians | least possible (pooled) |",
          "|---|---|---|---|---|"]
    for r in rows:
        least = "" if r["least"] is None else f"{r['least'] * 100:.1f}% (one hop)"
        md.append(f"| {r['figure']} | {r['rounds']} | **{r['median_cost'] * 100:.1f}%** | "
                  + ", ".join(f"{c * 100:.1f}%" for c in r["run_costs"]) + f" | {least} |")
    text = "\n".join(md) + "\n"
    print(text, end="")
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

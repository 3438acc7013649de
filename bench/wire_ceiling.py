#!/usr/bin/python3
"""Issue 19's 4 MB target against the wire it runs on: Leash's 4 MB push and pulls at 8 in
flight over the loopback socket, raw ZeroMQ one-way between two processes over one and two
connections, and the kernel's loopback TCP ceiling (iperf3, 1 MiB writes, one stream and
several), all in each round, the Leash and TCP halves in alternating order. Reports MB/s per
round and by median, each Leash op over raw one-way (the target: 1.5x) and over the TCP
ceiling, and where 1.5x raw one-way lies against that ceiling: above 1, the target asks more
than the kernel's loopback moves with any stream count measured. JSON, Markdown and a plot.

    /usr/bin/python3 bench/wire_ceiling.py [--rounds 6] [--seconds 2] [--streams 1,2,4]
        [--modes socket] [--name wire_ceiling] [--out bench/results] [--from-json OLD.json]

Needs iperf3 (scripts/install-deps.sh bench).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common.util import cpu_budget_us, iperf3_loopback, loads_before, median, pyplot, spaced, write_json  # noqa: E402

OPS = ("push", "pull", "pull_in_place")
FLOATS = 1048576  # 4 MiB of float32 per request
MB = FLOATS * 4 / 1e6  # a request in MB
TARGET = 1.5  # issue 19: 4 MB at 8 in flight >= 1.5x single-socket raw ZeroMQ one-way


def leash_half(a, tmp):
    """One leash-bench-pushpull run: {row: {mb_per_s, cpu_us}} for the Leash ops and the raw
    rows; cpu_us: both processes' CPU per 4 MB request (client and shards; sender and
    receiver), None where not measured."""
    out = tempfile.mkdtemp(dir=tmp)
    p = subprocess.run([a.bench, "--server-bin", a.server, "--sizes", str(FLOATS), "--ops", ",".join(OPS),
                        "--modes", a.modes, "--shards", "1", "--inflight", "8", "--raw-rows", "oneway2",
                        "--stripes", "2", "--seconds", str(a.seconds), "--out", out],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"leash-bench-pushpull exited {p.returncode}: {p.stderr[-2000:]}")
    with open(os.path.join(out, "pushpull.json")) as f:
        samples = json.load(f)["samples"]
    rows = {}
    for s in samples:
        if s["floats"] != FLOATS:
            continue
        cpu = s["client_cpu_us"] + s["server_cpu_us"] if min(s["client_cpu_us"], s.get("server_cpu_us", -1)) >= 0 else None
        if s["system"] == "raw zmq" and s["op"].startswith("one-way, 2 processes"):
            rows["raw one-way" + s["op"][len("one-way, 2 processes"):]] = {"mb_per_s": s["mb_per_s"], "cpu_us": cpu}
        elif s["system"].startswith("leash") and s["op"] in OPS and s["inflight"] == 8:
            mode = s["system"][len("leash"):].strip()
            rows[s["op"] + (f" ({mode})" if mode else "")] = {"mb_per_s": s["mb_per_s"], "cpu_us": cpu}
    return rows


def tcp_half(a):
    rows = {}
    for n in a.streams:
        r = iperf3_loopback(a.seconds, streams=n, detail=True)
        if r is None:
            sys.exit(f"iperf3 did not connect on loopback ({n} streams)")
        rows[f"iperf3 {n} stream{'s' if n > 1 else ''}"] = {"mb_per_s": r["mb_per_s"], "cpu_us": r["cpu_us_per_mb"] * MB}
    return rows


def measure(p, a):
    """The rounds: each the Leash half and the TCP half, in alternating order."""
    for exe in (a.bench, a.server):
        if not os.access(exe, os.X_OK):
            p.error(f"{exe} is not an executable: build first (bash scripts/build.sh)")
    if not shutil.which("iperf3"):
        p.error("iperf3 is not installed: bash scripts/install-deps.sh bench")
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            load = os.getloadavg()[0]
            if r % 2 == 0:
                tcp = tcp_half(a)
                rows = leash_half(a, tmp)
            else:
                rows = leash_half(a, tmp)
                tcp = tcp_half(a)
            rows.update(tcp)
            rounds.append({"load_before": load, "rows": rows})
            print(f"[{time.strftime('%H:%M:%S')}] round {r + 1}/{a.rounds} (load {load:.2f}): "
                  + ", ".join(f"{k} {v['mb_per_s']:.0f}" for k, v in rows.items()), flush=True)
    return rounds


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    build = os.path.join(os.path.dirname(HERE), "build")
    p.add_argument("--bench", default=os.path.join(build, "bench", "leash-bench-pushpull"))
    p.add_argument("--server", default=os.path.join(build, "server", "leash-server"))
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--streams", default="1,2,4", help="iperf3 stream counts (comma-separated)")
    p.add_argument("--modes", default="socket", help="leash-bench-pushpull --modes (e.g. socket,striped2)")
    p.add_argument("--name", default="wire_ceiling")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--from-json", help="re-render this earlier result's rounds instead of measuring")
    a = p.parse_args()
    try:
        a.streams = [int(n) for n in a.streams.split(",")]
    except ValueError:
        p.error(f"--streams {a.streams!r}: expected comma-separated stream counts, e.g. 1,2,4")
    if not a.streams or min(a.streams) < 1 or a.rounds < 1 or a.seconds <= 0:
        p.error("--streams, --rounds and --seconds must be positive")
    if a.from_json:
        # Re-renders a run's rounds (e.g. one from a lent machine) with this script's summary.
        with open(a.from_json) as f:
            old = json.load(f)
        rounds, cores, date = old["runs"], old["cores"], old["date"]
        a.rounds, a.seconds = len(rounds), old["seconds"]
        a.modes, a.streams = old.get("modes", a.modes), old.get("streams", a.streams)
    else:
        rounds, cores, date = measure(p, a), os.cpu_count(), time.strftime("%Y-%m-%d %H:%M")

    names = list(rounds[0]["rows"])
    tcp_names = [n for n in names if n.startswith("iperf3")]
    leash_names = [n for n in names if n.split(" ")[0] in OPS]

    def per_round(fn):
        vals = [fn(rd["rows"]) for rd in rounds]
        vals = [v for v in vals if v is not None]
        if not vals:
            return None
        return {"per_round": vals, "median": median(vals), "min": min(vals), "max": max(vals)}

    mbs = lambda m, n: m[n]["mb_per_s"]  # noqa: E731
    ceiling = lambda m: max(mbs(m, n) for n in tcp_names)  # noqa: E731
    summary = {
        "mb_per_s": {n: per_round(lambda m, n=n: mbs(m, n)) for n in names},
        # Both ends' CPU per 4 MB request, and what that allows on this machine's cores were
        # they all busy with it and nothing else: cores x request / CPU per request.
        "cpu_us": {n: per_round(lambda m, n=n: m[n]["cpu_us"]) for n in names},
        "cpu_bound_mb_per_s": {n: per_round(lambda m, n=n: cores * MB * 1e6 / m[n]["cpu_us"] if m[n]["cpu_us"] else None)
                               for n in names},
        # The cores the row kept busy on average (MB/s x CPU per request): how much of the
        # bound above it reached.
        "cores_busy": {n: per_round(lambda m, n=n: mbs(m, n) * m[n]["cpu_us"] / (MB * 1e6) if m[n]["cpu_us"] else None)
                       for n in names},
        "over_raw_oneway": {n: per_round(lambda m, n=n: mbs(m, n) / mbs(m, "raw one-way")) for n in leash_names},
        "over_tcp_ceiling": {n: per_round(lambda m, n=n: mbs(m, n) / ceiling(m))
                             for n in leash_names + ["raw one-way"]},
        # Where the target lies: 1.5x raw one-way over the best TCP figure of the same round,
        # and the CPU per request it leaves were every core busy with it.
        "target_over_tcp_ceiling": per_round(lambda m: TARGET * mbs(m, "raw one-way") / ceiling(m)),
        "target_cpu_budget_us": per_round(lambda m: cores * MB * 1e6 / (TARGET * mbs(m, "raw one-way"))),
        # The same at the cores the push kept busy in that round.
        "target_cpu_budget_at_push_cores_us": per_round(
            lambda m: cpu_budget_us(m["push"]["mb_per_s"], m["push"]["cpu_us"], TARGET * mbs(m, "raw one-way"))
            if "push" in m and m["push"]["cpu_us"] else None),
    }
    res = {"benchmark": "wire_ceiling", "date": date, "rounds": a.rounds, "modes": a.modes, "streams": a.streams,
           "seconds": a.seconds, "cores": cores, "request_bytes": FLOATS * 4, "inflight": 8,
           "target_over_raw_oneway": TARGET, "summary": summary, "runs": rounds}
    write_json(os.path.join(a.out, f"{a.name}.json"), res)

    md = [f"# 4 MB at 8 in flight against the loopback wire ({res['date']})", "",
          f"`bench/wire_ceiling.py`: {a.rounds} rounds; each runs leash-bench-pushpull (1 shard x 1 worker, "
          f"4 MiB requests, 8 in flight, {a.seconds} s per row, modes {a.modes}; raw ZeroMQ one-way between two "
          f"processes over 1 and 2 connections) and iperf3 on loopback (1 MiB writes, "
          f"{', '.join(map(str, a.streams))} streams, {a.seconds} s each), the two halves in alternating order. "
          f"{res['cores']} cores; load average before each round "
          f"{loads_before(rounds)}. Medians over rounds; ratios are the "
          f"medians of per-round ratios. The TCP ceiling of a round is its best iperf3 figure.", "",
          "| row | MB/s median (min-max) | over raw one-way (per round) | over the TCP ceiling | "
          f"CPU us per 4 MB (both ends) | most on {cores} cores, MB/s | cores busy |",
          "|---|---|---|---|---|---|---|"]
    for n in names:
        mb = summary["mb_per_s"][n]
        raw = summary["over_raw_oneway"].get(n)
        tcp = summary["over_tcp_ceiling"].get(n)
        cpu = summary["cpu_us"][n]
        bound = summary["cpu_bound_mb_per_s"][n]
        md.append(f"| {n} | {mb['median']:.0f} ({mb['min']:.0f}-{mb['max']:.0f}) | "
                  + (f"**{raw['median']:.2f}x** ({spaced(raw['per_round'])})" if raw else "-") + " | "
                  + (f"{tcp['median']:.2f}x" if tcp else "-") + " | "
                  + (f"{cpu['median']:.0f}" if cpu else "-") + " | "
                  + (f"{bound['median']:.0f}" if bound else "-") + " | "
                  + (f"{summary['cores_busy'][n]['median']:.2f}" if summary["cores_busy"][n] else "-") + " |")
    t = summary["target_over_tcp_ceiling"]
    b = summary["target_cpu_budget_us"]
    md += ["", f"The target, {TARGET}x raw one-way, is **{t['median']:.2f}x** the round's TCP ceiling by median "
           f"(per round {spaced(t['per_round'])}); with all {cores} cores busy with it, it leaves "
           f"**{b['median']:.0f} us** of CPU per 4 MB request (per round "
           f"{spaced(b['per_round'], '.0f')}), both ends together."]
    bp = summary["target_cpu_budget_at_push_cores_us"]
    if bp:
        md[-1] += (f" At the cores the push kept busy ({summary['cores_busy']['push']['median']:.2f} by median), "
                   f"**{bp['median']:.0f} us** (per round {spaced(bp['per_round'], '.0f')}).")
    with open(os.path.join(a.out, f"{a.name}.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))

    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    meds = [summary["mb_per_s"][n]["median"] for n in names]
    bounds = [(summary["cpu_bound_mb_per_s"][n] or {}).get("median") for n in names]
    lo = [m - summary["mb_per_s"][n]["min"] for n, m in zip(names, meds)]
    hi = [summary["mb_per_s"][n]["max"] - m for n, m in zip(names, meds)]
    colors = ["tab:blue" if n in leash_names else "tab:gray" if n.startswith("raw") else "tab:green" for n in names]
    ax.bar(range(len(names)), meds, yerr=[lo, hi], color=colors, capsize=3)
    ax.scatter([i for i, v in enumerate(bounds) if v], [v for v in bounds if v], marker="_", s=300,
               color="black", label=f"most its CPU per request allows on {cores} cores")
    target = TARGET * summary["mb_per_s"]["raw one-way"]["median"]
    ax.axhline(target, color="tab:red", linestyle="--", label=f"target: {TARGET}x raw one-way")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("MB/s (median, min-max)")
    ax.set_title(f"4 MB at 8 in flight over loopback, {res['cores']} cores, {a.rounds} rounds")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, f"{a.name}.png"), dpi=110)


if __name__ == "__main__":
    main()

"""Process, port and result helpers of the benchmark suite. Ports come from the suite's
range (17500-17699 unless LEASH_BENCH_PORTS=lo-hi says otherwise) and are checked free
before use. Not thread-safe (the port cursor is module state)."""
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

_lo, _hi = (int(v) for v in os.environ.get("LEASH_BENCH_PORTS", "17500-17699").split("-"))
_next = _lo


def free_port():
    """The next port of the range that nobody listens on (wraps around)."""
    global _next
    for _ in range(_hi - _lo + 1):
        port = _next
        _next = _lo if _next >= _hi else _next + 1
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_lo}-{_hi}")


def stop(proc, timeout=30):
    """SIGTERM, then SIGKILL after `timeout` s, a process this suite started."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def iperf3_loopback(seconds, streams=1, length=1 << 20, detail=False):
    """The loopback TCP ceiling: iperf3 to a server on this host for `seconds` over `streams`
    connections, writing `length` bytes per call (iperf3's most, 1 MiB; its default of 128 KiB
    measured 0.66x of it on a 2-core machine), MB/s received; None when iperf3 is missing
    (install-deps.sh bench installs it) or never connected. With `detail`, a dict: mb_per_s
    and cpu_us_per_mb, the CPU both ends used per MB moved (nearly all of it the kernel's
    copies)."""
    if not shutil.which("iperf3"):
        return None
    port = str(free_port())
    srv = subprocess.Popen(["iperf3", "-s", "-1", "-p", port], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            p = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", port, "-t", str(max(1, round(seconds))),
                                "-P", str(streams), "-l", str(length), "-J"],
                               capture_output=True, text=True, timeout=120)
            # iperf3 3.12 exits 0 with -J also when it could not connect (the server not
            # listening yet): its JSON then has an "error" and an empty "end".
            try:
                doc = json.loads(p.stdout)
            except ValueError:
                doc = {}
            end = doc.get("end", {})
            if p.returncode == 0 and "error" not in doc and "sum_received" in end:
                mb_per_s = end["sum_received"]["bits_per_second"] / 8e6
                if not detail:
                    return mb_per_s
                cpu = end["cpu_utilization_percent"]
                # host_total and remote_total: each end's CPU time over the run's, in percent.
                cores = (cpu["host_total"] + cpu["remote_total"]) / 100
                return {"mb_per_s": mb_per_s, "cpu_us_per_mb": cores * 1e6 / mb_per_s}
            time.sleep(0.1)
        return None
    finally:
        stop(srv)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def time_to_accuracy(curve, target):
    """First elapsed time at which the test accuracy reached `target`; curve: list of
    {"elapsed_seconds", "test_accuracy"} in time order. None when never reached."""
    for point in curve:
        if point.get("test_accuracy") is not None and point["test_accuracy"] >= target:
            return point["elapsed_seconds"]
    return None


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (said once on stderr) where matplotlib is
    not installed: the figures are in the JSON and Markdown already, the plots are extra."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        if not getattr(pyplot, "said", False):
            pyplot.said = True
            print("matplotlib is not installed (bash scripts/install-deps.sh bench): no plots",
                  file=sys.stderr)
        return None


def write_json(path, obj):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)


def cpu_budget_us(mb_per_s, cpu_us, target_mb_per_s):
    """The CPU per request a row could spend and still reach target_mb_per_s, were it to keep
    as many cores busy as it did (mb_per_s at cpu_us per request)."""
    return mb_per_s * cpu_us / target_mb_per_s


def spaced(values, spec=".2f"):
    """Per-round figures for a Markdown cell: "0.91 1.05 0.98"."""
    return " ".join(format(v, spec) for v in values)


def loads_before(rounds):
    """The load averages before each round ({"load_before": ...} each), for a Markdown line."""
    return ", ".join(format(rd["load_before"], ".1f") for rd in rounds)


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def cpu_model():
    """The CPU's model name (/proc/cpuinfo), or "unknown": figures on this shared machine
    change with the CPU it lands on, so results name it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def verdict(measured, target, higher_is_better):
    """A target row's verdict: ("PASS"|"MISS"|"n/a", by how much), for the summaries."""
    if measured is None:
        return "n/a", "not measured"
    ok = measured >= target if higher_is_better else measured <= target
    if higher_is_better:
        by = f"{measured / target:.2f}x the target" + ("" if ok else f" (short by {(1 - measured / target) * 100:.1f}%)")
    else:
        by = f"{measured / target:.2f}x the limit" + ("" if ok else f" (over by {(measured / target - 1) * 100:.1f}%)")
    return ("PASS" if ok else "MISS"), by


def iteration_breakdown(metrics):
    """A worker's mean iteration in µs, from its --metrics-out: its whole step (the epochs'
    train_seconds), forward/backward (compute), the injected delay, the pull (the staleness
    bound's wait and loading the values) and the push with the clock."""
    it = max(1, metrics.get("iterations") or 1)
    step = sum(e["train_seconds"] for e in metrics["epochs"])
    return {k: v / it * 1e6 for k, v in (
        ("step", step), ("compute", metrics.get("compute_seconds", 0)),
        ("delay", metrics.get("injected_delay_seconds", 0)), ("pull", metrics.get("pull_seconds", 0)),
        ("push", metrics.get("push_seconds", 0)))}

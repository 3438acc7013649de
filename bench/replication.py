#!/usr/bin/python3
"""Replicated shards (issue 16), measured with real processes and a real etcd:

  lost   acknowledged pushes lost per primary SIGKILL with 2 replicas (leash-bench-failover:
         SGD at lr 1, push k adds 1 to element k mod 1024, the final table against the exact
         sum of the acknowledged pushes), against 1 replica restarted from its last snapshot
         (the same probe, and bench/faults.py's `lost` figure: clocks of training lost);
  stall  from the SIGKILL of the primary to the first push the new primary acknowledges,
         against the etcd lease TTL (leash-server --etcd-ttl), over several kills: median and
         max, and where the time goes (the primary key's deletion by etcd, the new primary's
         key, its first log line as primary, the client's retarget, its first acknowledgement);
  cost   R=2 against R=1, interleaved pair by pair: MLP 1 worker + 1 shard at staleness 1
         (samples/s) and leash-bench-pushpull's 4 KB push p50 (1 in flight) and 4 MB push
         MB/s (8 in flight) against the primary; the backup's and the primary's CPU time per
         iteration (/proc/PID/stat), and the load average with each figure.

Writes replication.json, replication.md and replication.png to --out (default bench/results).
Standalone: bench/replication.py [--build build] [--quick] [--only lost,stall,cost]; in the
suite: bench/run_all.py --parts replication. Every process is started here and stopped by
its handle. Not thread-safe (one watcher thread reads etcd's watch stream).
"""
import argparse
import base64
import datetime
import json
import resource
import os
import re
import shutil
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import faults  # noqa: E402  (the snapshot-only loss figure, measured in the same run)
from common import leash as L  # noqa: E402
from common.util import cpu_model, free_port, median, pyplot, stop, verdict, write_json  # noqa: E402

ETCD = os.environ.get("LEASH_ETCD_BIN", "/usr/bin/etcd")
TICK = os.sysconf("SC_CLK_TCK")


def config(quick):
    if quick:
        return {"ttl": 2, "rate": 1000, "kills": 3, "r1_kills": 1, "faults_repeats": 1, "rounds": 1, "mlp_epochs": 1,
                "mlp_train_limit": 12800, "pushpull_seconds": 0.5, "pushpull_warmup": 0.1}
    # rate: the probe's pushes per second (a backup restarted after a kill catches up from
    # the log, so the log's growth is kept modest)
    return {"ttl": 2, "rate": 1000, "kills": 10, "r1_kills": 3, "faults_repeats": 2, "rounds": 3, "mlp_epochs": 2,
            "mlp_train_limit": 0, "pushpull_seconds": 1.0,
            # each push row first runs 0.5 s unmeasured: a fresh cluster's first pushes touch the
            # table, its momentum and (R=2) the backup's ring for the first time
            "pushpull_warmup": 0.5}


def load():
    return os.getloadavg()[0]


def pin(pid, cpu):
    """Every thread of `pid` onto CPU `cpu` (taskset -a)."""
    subprocess.run(["taskset", "-a", "-c", "-p", str(cpu), str(pid)], check=True, stdout=subprocess.DEVNULL)


def pinned(cmd, c):
    """`cmd` on CPU 0 when the cost part places processes (--backup-apart, --worker-apart; see cost_one)."""
    return (["taskset", "-c", "0"] + cmd) if c.get("backup_apart") or c.get("worker_apart") else cmd


def cpu_seconds(pid):
    """utime + stime of a process (/proc/PID/stat), in seconds; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return None


def children_cpu_seconds():
    """utime + stime of every child waited for so far (getrusage(RUSAGE_CHILDREN)); the
    difference around one subprocess.run is that child's."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def log_time(line):
    """The wall-clock time (s) of a spdlog line "[YYYY-MM-DD HH:MM:SS.mmm] ...", or None."""
    m = re.match(r"\[?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)", line)
    return datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp() if m else None


def first_line_after(path, pattern, after):
    """Time of the first line of `path` matching `pattern` logged at or after `after`."""
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if re.search(pattern, line):
                    t = log_time(line)
                    if t is not None and t >= after - 0.002:
                        return t
    except OSError:
        pass
    return None


# ---------------------------------------------------------------- etcd

def b64(s):
    return base64.b64encode(s.encode()).decode()


def prefix_end(prefix):
    return b64(prefix[:-1] + chr(ord(prefix[-1]) + 1))


class Etcd:
    """An etcd on free loopback ports with a temporary data directory, and a thread that
    timestamps every change under /leash/ (the watch stream of the JSON gateway)."""

    def __init__(self, tmp):
        if not os.access(ETCD, os.X_OK):
            raise L.RunError(f"{ETCD} is missing: install etcd-server (scripts/install-deps.sh)")
        self.url = f"http://127.0.0.1:{free_port()}"
        peer = f"http://127.0.0.1:{free_port()}"
        # etcd's data in memory where the host has a tmpfs: on a busy shared disk its fsyncs
        # stall for seconds, longer than the 2 s leases (every replica's lease then expires
        # at once); the log and the data go with the run's temporary directory.
        self.dir = tempfile.mkdtemp(dir=tmp, prefix="etcd-")
        self.data = tempfile.mkdtemp(dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else self.dir,
                                     prefix="leash-bench-etcd-")
        self.log = open(os.path.join(self.dir, "etcd.log"), "w")
        self.proc = subprocess.Popen(
            [ETCD, "--name", "bench", "--data-dir", os.path.join(self.data, "data"), "--listen-client-urls", self.url,
             "--advertise-client-urls", self.url, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"bench={peer}", "--logger", "zap", "--log-outputs", "stderr"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.events = []  # (wall time, "PUT"/"DELETE", key, value)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                self.get("/leash/")
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise L.RunError(f"etcd did not start (log {self.log.name})")
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()

    def post(self, path, body, timeout=5):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        return urllib.request.urlopen(req, timeout=timeout)

    def get(self, prefix):
        with self.post("/v3/kv/range", {"key": b64(prefix), "range_end": prefix_end(prefix)}) as r:
            kvs = json.load(r).get("kvs", [])
        return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode() for kv in kvs}

    def _watch(self):
        try:
            body = {"create_request": {"key": b64("/leash/"), "range_end": prefix_end("/leash/")}}
            with self.post("/v3/watch", body, timeout=None) as r:
                for line in r:
                    t = time.time()
                    for e in json.loads(line).get("result", {}).get("events", []):
                        kv = e.get("kv", {})
                        self.events.append((t, e.get("type", "PUT"), base64.b64decode(kv.get("key", "")).decode(),
                                            base64.b64decode(kv.get("value", "")).decode()))
        except Exception:  # etcd stopped
            pass

    def shard(self, job):
        """(primary dict or None, in-sync list) of shard 0 of `job`."""
        kv = self.get(f"/leash/{job}/shards/0/")
        p = kv.get(f"/leash/{job}/shards/0/primary")
        s = kv.get(f"/leash/{job}/shards/0/in_sync")
        return (json.loads(p) if p else None), (json.loads(s) if s else [])

    def stop(self):
        stop(self.proc)
        self.log.close()
        shutil.rmtree(self.data, ignore_errors=True)


# ---------------------------------------------------------------- clusters

class Replicated:
    """etcd + one shard served by 2 leash-server replicas (--replicas 2)."""

    def __init__(self, build, tmp, tag, ttl, extra=()):
        self.build, self.tmp, self.tag, self.ttl, self.extra = build, tmp, tag, ttl, list(extra)
        self.job = re.sub(r"[^A-Za-z0-9_.-]", "_", tag)
        self.etcd = Etcd(tmp)
        self.endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
        self.procs = [None, None]
        for r in range(2):
            self.start(r)
        self.wait_in_sync()

    def logpath(self, r):
        return os.path.join(self.tmp, f"{self.tag}-r{r}.log")

    def start(self, r):
        lf = open(self.logpath(r), "a")
        self.procs[r] = subprocess.Popen(
            [L._bin(self.build, "server", "leash-server"), f"--bind={self.endpoints[r]}",
             f"--data-dir={self.tmp}/{self.tag}-r{r}", "--replicas=2", f"--replica={r}",
             f"--peers={','.join(self.endpoints)}", f"--etcd={self.etcd.url}", f"--job={self.job}",
             f"--etcd-ttl={self.ttl}", "--no-sync", "--lease-timeout=10s", "--checkpoint-interval=0",
             "--log-level=info"] + self.extra, stdout=lf, stderr=subprocess.STDOUT)
        lf.close()

    def wait_in_sync(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            p, s = self.etcd.shard(self.job)
            if p and sorted(s) == [0, 1]:
                return p
            time.sleep(0.05)
        raise L.RunError(f"{self.tag}: the replicas never got in sync (logs {self.tmp}/{self.tag}-r*.log)")

    def primary(self):
        return self.etcd.shard(self.job)[0]

    def stop(self):
        for p in self.procs:
            if p:
                stop(p)
        self.etcd.stop()


class Single:
    """One unreplicated leash-server (R=1, today's mode)."""

    def __init__(self, build, tmp, tag, checkpoint_interval="0", extra=()):
        self.build, self.tmp, self.tag, self.interval = build, tmp, tag, checkpoint_interval
        self.extra = list(extra)
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.proc = None
        self.start()

    def start(self):
        lf = open(os.path.join(self.tmp, f"{self.tag}-shard.log"), "a")
        self.proc = subprocess.Popen(
            [L._bin(self.build, "server", "leash-server"), "--shard=0", "--num-shards=1", f"--bind={self.endpoint}",
             f"--data-dir={self.tmp}/{self.tag}-shard", "--no-sync", f"--checkpoint-interval={self.interval}",
             "--log-level=info"] + self.extra, stdout=lf, stderr=subprocess.STDOUT)
        lf.close()

    def stop(self):
        stop(self.proc)


class Probe:
    """leash-bench-failover, its "gap FROM TO" lines read as they come."""

    def __init__(self, build, tmp, tag, where):
        self.out = os.path.join(tmp, f"{tag}-probe.json")
        self.log = os.path.join(tmp, f"{tag}-probe.log")
        self.gaps = []
        self.started = threading.Event()
        lf = open(self.log, "w")
        self.proc = subprocess.Popen([L._bin(build, "bench", "leash-bench-failover"), "--out", self.out] + where, stdout=subprocess.PIPE, stderr=lf, text=True)
        lf.close()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if not self.started.wait(60):
            raise L.RunError(f"leash-bench-failover did not start pushing (log {self.log})")

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("pushing"):
                self.started.set()
            elif line.startswith("gap "):
                a, b = line.split()[1:3]
                self.gaps.append((int(a) / 1000, int(b) / 1000))

    def resumed_after(self, t, timeout):
        """Waits for the first acknowledgement after `t` that ends a gap holding `t`."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for a, b in self.gaps:
                if a <= t <= b:
                    return a, b
            if self.proc.poll() is not None:
                raise L.RunError(f"leash-bench-failover exited {self.proc.returncode} (log {self.log})")
            time.sleep(0.02)
        raise L.RunError(f"pushes did not resume within {timeout} s of the kill (log {self.log})")

    def finish(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(120)
        self.reader.join(10)
        if rc != 0:
            raise L.RunError(f"leash-bench-failover exited {rc} (log {self.log})")
        with open(self.out) as f:
            return json.load(f)


# ---------------------------------------------------------------- lost and stall, R=2

def replicated_kills(build, c, tmp, log):
    """Kills the primary c["kills"] times under the probe, restarting it as a backup each
    time; returns the probe's totals and per kill the stall and its parts."""
    ttl = c["ttl"]
    cl = Replicated(build, tmp, "kills", ttl)
    kills = []
    try:
        probe = Probe(build, tmp, "kills", [f"--etcd={cl.etcd.url}", f"--job={cl.job}", f"--rate={c['rate']}"])
        try:
            for k in range(c["kills"]):
                p = cl.wait_in_sync()
                time.sleep(0.7 + 0.13 * k)  # pushes replicated in sync; the kill at varying points
                r = p["replica"]
                before = load()
                t_kill = time.time()
                cl.procs[r].kill()
                cl.procs[r].wait()
                # An acknowledgement already on its way when the signal landed may arrive
                # after t_kill: the stall is the gap that holds the moment the primary was dead.
                _, t_first = probe.resumed_after(time.time(), 60)
                stall = t_first - t_kill
                time.sleep(0.3)  # the watcher thread's last events
                ev = cl.etcd.events
                key = f"/leash/{cl.job}/shards/0/primary"
                t_del = next((t for t, typ, kk, _ in ev if kk == key and typ == "DELETE" and t >= t_kill), None)
                t_put = next((t for t, typ, kk, _ in ev if kk == key and typ == "PUT" and t >= t_kill), None)
                new = 1 - r
                t_leads = first_line_after(cl.logpath(new), r"leads in term", t_kill)
                t_retarget = first_line_after(probe.log, r"shard 0: primary is", t_kill)
                rel = lambda t: None if t is None else round((t - t_kill) * 1000)  # noqa: E731
                kills.append({"killed_replica": r, "stall_ms": round(stall * 1000), "load_before": before,
                              "primary_key_deleted_ms": rel(t_del), "new_primary_key_ms": rel(t_put),
                              "new_primary_leads_ms": rel(t_leads), "client_retargeted_ms": rel(t_retarget),
                              "first_ack_ms": rel(t_first)})
                log(f"  kill {k + 1}/{c['kills']}: replica {r}; stall {stall * 1000:.0f} ms (TTL {ttl} s): key deleted "
                    f"+{rel(t_del)}, new primary +{rel(t_put)}, leads +{rel(t_leads)}, client retargeted "
                    f"+{rel(t_retarget)} ms; load {before:.1f}")
                cl.start(r)  # back as a backup: caught up from the new primary
            totals = probe.finish()
        finally:
            if probe.proc.poll() is None:
                probe.proc.kill()
    finally:
        cl.stop()
    stalls = [k["stall_ms"] for k in kills]
    return {"ttl_s": ttl, "kills": kills, "probe": {k: v for k, v in totals.items() if k != "gaps_ms"},
            "lost_per_kill": totals["lost"] / len(kills), "doubled_per_kill": totals["doubled"] / len(kills),
            "median_stall_ms": median(stalls), "max_stall_ms": max(stalls),
            "median_parts_ms": {p: median(k[p] for k in kills) for p in
                                ("primary_key_deleted_ms", "new_primary_key_ms", "new_primary_leads_ms",
                                 "client_retargeted_ms", "first_ack_ms")}}


def single_kills(build, c, tmp, log, extra=(), tag="r1kills", kills=None):
    """R=1 with snapshots every 1 s: the shard SIGKILLed under the probe and restarted from
    its last snapshot (and, with `extra` --durable-log, its log), c["r1_kills"] times (or
    `kills`)."""
    cl = Single(build, tmp, tag, "1s", extra)
    runs = []
    kills = c["r1_kills"] if kills is None else kills
    try:
        probe = Probe(build, tmp, tag, [f"--servers={cl.endpoint}", f"--rate={c['rate']}"])
        try:
            for k in range(kills):
                time.sleep(1.5 + 0.37 * k)  # the kill at varying points of the snapshot period
                t_kill = time.time()
                cl.proc.kill()
                cl.proc.wait()
                t_dead = time.time()
                cl.start()
                _, t_first = probe.resumed_after(t_dead, 60)
                runs.append({"down_ms": round((t_first - t_kill) * 1000)})
                log(f"  R=1 kill {k + 1}/{kills}: pushes resumed after {(t_first - t_kill) * 1000:.0f} ms "
                    f"(restart from the snapshot{' and the log' if extra else ''})")
            time.sleep(0.5)
            totals = probe.finish()
        finally:
            if probe.proc.poll() is None:
                probe.proc.kill()
    finally:
        cl.stop()
    return {"checkpoint_interval_ms": 1000, "kills": runs,
            "probe": {k: v for k, v in totals.items() if k != "gaps_ms"},
            "lost_per_kill": totals["lost"] / len(runs), "doubled_per_kill": totals["doubled"] / len(runs)}


def part_lost_stall(build, c, tmp, log, with_r1=True):
    log(f"R=2: {c['kills']} primary SIGKILLs under leash-bench-failover (etcd TTL {c['ttl']} s)")
    r2 = replicated_kills(build, c, tmp, log)
    if not with_r1:
        return {"r2": r2}
    log(f"R=1: {c['r1_kills']} SIGKILLs of the shard, restarted from its snapshot (every 1 s)")
    r1 = single_kills(build, c, tmp, log)
    log("R=1: bench/faults.py's `lost` (2 workers, MLP, snapshot every 1 s)")
    fa = faults.lost(argparse.Namespace(build=build, repeats=c["faults_repeats"]), [1000])["1000"]
    return {"r2": r2, "r1": r1, "faults_lost_1s": fa}


# ---------------------------------------------------------------- cost

def mlp(build, tmp, tag, c, where):
    metrics = os.path.join(tmp, f"{tag}.json")
    cmd = pinned(L._worker_cmd(build, "mlp", c["mlp_epochs"], metrics, c["mlp_train_limit"], 0, True,
                               where + ["--staleness", "1", "--name", "w0", "--wire-dtype",
                                        c.get("wire_dtype", "fp32")]), c)
    before = children_cpu_seconds()
    with open(os.path.join(tmp, f"{tag}.log"), "w") as lf:
        rc = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT, timeout=600).returncode
    worker_cpu = children_cpu_seconds() - before  # the worker's, the only child waited for
    if rc != 0:
        raise L.RunError(f"{tag}: leash-worker exited {rc} (log {tmp}/{tag}.log)")
    with open(metrics) as f:
        m = json.load(f)
    samples = sum(e["samples"] for e in m["epochs"])
    seconds = sum(e["train_seconds"] for e in m["epochs"])
    return {"samples_per_second": samples / seconds, "iterations": samples / 64,
            # the whole run's (data loading and evaluation too) per training iteration: an upper bound
            "worker_cpu_us_per_iteration": worker_cpu / (samples / 64) * 1e6}


def pushpull(build, c, tmp, tag, where, floats, inflight, seconds, mode="socket"):
    """`where`: ["--servers", EP] or, for replicated shards, ["--etcd", URL, "--job", JOB] (the client
    follows the directory as leash-worker does, and reaches a backup that answers). `mode`: socket, or
    shm (the client offers every shard, and an answering backup, shared memory, as leash-worker does
    on one host)."""
    out = os.path.join(tmp, tag)
    os.makedirs(out, exist_ok=True)
    before = children_cpu_seconds()
    p = subprocess.run(pinned([L._bin(build, "bench", "leash-bench-pushpull")] + where + ["--sizes",
                               str(floats), "--inflight", str(inflight), "--ops", "push", "--modes", mode,
                               "--raw=false", "--seconds", str(seconds), "--out", out]
                              + (["--warmup-seconds", str(c["pushpull_warmup"])] if c.get("pushpull_warmup") else []),
                              c),
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300)
    client = children_cpu_seconds() - before  # the pushing client's (its start and connect too)
    if p.returncode != 0:
        raise L.RunError(f"leash-bench-pushpull {' '.join(where)} exited {p.returncode}: {p.stderr[-1000:]}")
    with open(os.path.join(out, "pushpull.json")) as f:
        s = json.load(f)["samples"][0]
    ops = s["ops_per_s"] * seconds
    # CPU figures are per op over every op the run made, the unmeasured warm-up's too
    cpu_ops = ops + s.get("warmup_ops", 0)
    return {"p50_us": s["p50_us"], "mb_per_s": s["mb_per_s"], "ops": ops, "ops_per_s": s["ops_per_s"],
            "cpu_ops": cpu_ops, "client_cpu_us_per_iteration": client / cpu_ops * 1e6 if cpu_ops else None}


def least_work(build, tmp, tag, floats=1048576, socket=False):
    """What any R=2 must add to one push of `floats` values, measured alone on this machine: the
    backup's optimizer update (momentum, as the pushed table's; leash-bench-pushpull's update row,
    p50; and the same on state out of the caches, the update_cold row) and one copy of the push
    into memory the backup can read (leash-bench-crosscore, the copy's median). The backup's receive and its NaN check, the acknowledgement and every wake-up
    are left out, so it is a lower bound. And for a 4 KB push's latency, the raw round trip
    between two processes through a shared-memory segment's queues (as a primary reaches a
    same-host backup; the shm2 row, p50), or with `socket` (shards at --no-shm, as between hosts)
    over loopback TCP (the rtt2 row): a push acknowledged once the backup holds it waits for
    at least that."""
    out = os.path.join(tmp, tag)
    os.makedirs(out, exist_ok=True)
    p = subprocess.run([L._bin(build, "bench", "leash-bench-pushpull"), "--sizes", f"1024,{floats}", "--raw-rows",
                        "update,update_cold," + ("rtt2" if socket else "shm2"), "--modes", "", "--seconds", "1",
                        "--out", out],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120)
    if p.returncode != 0:
        raise L.RunError(f"leash-bench-pushpull (update and raw shm rows) exited {p.returncode}: {p.stderr[-1000:]}")
    with open(os.path.join(out, "pushpull.json")) as f:
        rows = json.load(f)["samples"]
    update = [x for x in rows if x.get("op") == "momentum update" and x.get("floats") == floats]
    cold = [x for x in rows if x.get("op") == "momentum update, out of cache" and x.get("floats") == floats]
    shm = [x for x in rows if x.get("floats") == 1024 and (
        (x.get("system"), x.get("op")) == ("raw zmq", "round trip, 2 processes") if socket
        else x.get("system") == "raw shm")]
    if not update or not shm:
        raise L.RunError(f"leash-bench-pushpull wrote no update or raw shm row ({out}/pushpull.json)")
    q = subprocess.run([L._bin(build, "bench", "leash-bench-crosscore"), "--bytes", str(floats * 4),
                        "--rounds", "100"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    if q.returncode != 0:
        raise L.RunError(f"leash-bench-crosscore exited {q.returncode}: {q.stderr[-1000:]}")
    copy = json.loads(q.stdout)
    return {"floats": floats, "update_us": update[0]["p50_us"], "copy_us": copy["same_core_copy_us"],
            "shm_rtt_4KB_us": shm[0]["p50_us"], "update_cold_us": cold[0]["p50_us"] if cold else None,
            "raw_rtt_path": "loopback TCP" if socket else "shared memory"}


# The cost rows: each figure's row of cost_one's result, its key, and whether higher is better.
COST_FIGURES = {"mlp_samples_per_second": ("mlp", "samples_per_second", True),
                "push_4KB_p50_us": ("push_4KB", "p50_us", False),
                "push_4MB_mb_per_s": ("push_4MB", "mb_per_s", True),
                # only where the shards have shared memory (not --no-shm)
                "push_4KB_shm_p50_us": ("push_4KB_shm", "p50_us", False),
                "push_4MB_shm_mb_per_s": ("push_4MB_shm", "mb_per_s", True)}
# The figures' names in the tables.
COST_NAMES = {"mlp_samples_per_second": "MLP 1+1 s=1 samples/s", "push_4KB_p50_us": "4 KB push p50 (1 in flight)",
              "push_4MB_mb_per_s": "4 MB push MB/s (8 in flight)",
              "push_4KB_shm_p50_us": "4 KB push p50 through shared memory (1 in flight)",
              "push_4MB_shm_mb_per_s": "4 MB push MB/s through shared memory (8 in flight)"}


def per_round(rounds, new, base, row, key, higher):
    """Configuration `new` against `base` in each round: the ratios, and the costs (throughput
    lost, or latency added)."""
    ratios = [g[new][row][key] / g[base][row][key] for g in rounds]
    return ratios, [(1 - x) if higher else (x - 1) for x in ratios]


def third_config(rounds, cfg, row, key, higher):
    """The figures of a third configuration of the cost part (`cfg`: r2a, r2v) on `row` against
    R=1 in the same rounds, with its replicas' CPU per iteration and the load."""
    ratios, costs = per_round(rounds, cfg, "r1", row, key, higher)
    return {cfg: [g[cfg][row][key] for g in rounds], f"{cfg}_over_r1_per_round": ratios,
            f"median_cost_{cfg}": median(costs), f"load_{cfg}": [g[cfg][row]["load_before"] for g in rounds],
            f"backup_cpu_us_per_iteration_{cfg}": median(g[cfg][row].get("backup_cpu_us_per_iteration")
                                                         for g in rounds),
            f"primary_cpu_us_per_iteration_{cfg}": median(g[cfg][row].get("primary_cpu_us_per_iteration")
                                                          for g in rounds)}


def third_config_table(s, names, cfg, intro, runs_header, vs_header, vs_cell):
    """The Markdown table of a third configuration of the cost part (`cfg`: r2a, r2v; third_config's
    figures): its runs, against R=1, `vs_cell(figures)` against R=2, its replicas' CPU and the load."""
    md = ["", intro, "", f"| figure | {runs_header} | its/R=1 per round | median cost | {vs_header} | "
          "backup CPU per iteration | primary CPU per iteration | load |", "|---|---|---|---|---|---|---|---|"]
    for k, text in names.items():
        v = s[k]
        md.append(f"| {text} | {', '.join(f'{x:.0f}' for x in v[cfg])} | "
                  f"{', '.join(f'{x:.2f}' for x in v[f'{cfg}_over_r1_per_round'])} | "
                  f"**{v[f'median_cost_{cfg}'] * 100:.1f}%** | {vs_cell(v)} | "
                  f"{v[f'backup_cpu_us_per_iteration_{cfg}'] or 0:.0f} us | "
                  f"{v[f'primary_cpu_us_per_iteration_{cfg}'] or 0:.0f} us | "
                  f"{', '.join(f'{x:.1f}' for x in v[f'load_{cfg}'])} |")
    return md


def rows_line(g):
    """One configuration's cost rows, for a round's progress line."""
    return (f"MLP {g['mlp']['samples_per_second']:.0f} samples/s, 4 KB push p50 {g['push_4KB']['p50_us']:.0f} us, "
            f"4 MB push {g['push_4MB']['mb_per_s']:.0f} MB/s"
            + (f", 4 KB push through shared memory p50 {g['push_4KB_shm']['p50_us']:.0f} us" if "push_4KB_shm" in g else "")
            + (f", 4 MB push through shared memory {g['push_4MB_shm']['mb_per_s']:.0f} MB/s" if "push_4MB_shm" in g else ""))


def cost_one(build, c, tmp, tag, replicas, extra=()):
    """One configuration's figures: the MLP, then the two push rows, on one cluster (`extra`:
    more flags for its shard processes)."""
    cl = Replicated(build, tmp, tag, c["ttl"], extra) if replicas == 2 else Single(build, tmp, tag, extra=extra)
    try:
        if replicas == 2:
            p = cl.primary()
            primary, backup = cl.procs[p["replica"]], cl.procs[1 - p["replica"]]
            where = ["--etcd", cl.etcd.url, "--job", cl.job]
        else:
            primary, backup, where = cl.proc, None, ["--servers", cl.endpoint]
        if c.get("backup_apart") or c.get("worker_apart"):
            # Backup apart (as on another host): the worker, the primary and the pushing
            # client share CPU 0; the backup and etcd have CPU 1. R=1 uses CPU 0 only.
            # Worker apart: the worker and the pushing client on CPU 0, every shard process
            # (R=1's shard; R=2's primary, backup and etcd) on CPU 1, so the training thread
            # never shares its core with a shard woken by its own sends.
            pin(primary.pid, 1 if c.get("worker_apart") else 0)
            if backup:
                pin(backup.pid, 1)
                pin(cl.etcd.proc.pid, 1)
        out = {}
        # What the replicas burn with no request (a backup's heartbeats and its polls of the
        # directory), over 1 s, so the per-iteration figures below can be read net of it.
        idle0 = [cpu_seconds(x.pid) if x else None for x in (primary, backup)]
        time.sleep(1.0)
        idle1 = [cpu_seconds(x.pid) if x else None for x in (primary, backup)]
        for who, a, b in zip(("primary", "backup"), idle0, idle1):
            if a is not None and b is not None:
                out[f"{who}_idle_cpu_ms_per_s"] = (b - a) * 1000

        def measured(name, fn, per):
            before = load()
            cpu0 = [cpu_seconds(x.pid) if x else None for x in (primary, backup)]
            r = fn()
            cpu1 = [cpu_seconds(x.pid) if x else None for x in (primary, backup)]
            n = r[per]
            for who, a, b in zip(("primary", "backup"), cpu0, cpu1):
                if a is not None and b is not None and n:
                    r[f"{who}_cpu_us_per_iteration"] = (b - a) / n * 1e6
            r["load_before"] = before
            out[name] = r

        measured("mlp", lambda: mlp(build, tmp, f"{tag}-mlp", c, where), "iterations")
        measured("push_4KB", lambda: pushpull(build, c, tmp, f"{tag}-pp4k", where, 1024, 1,
                                              c["pushpull_seconds"]), "cpu_ops")
        measured("push_4MB", lambda: pushpull(build, c, tmp, f"{tag}-pp4m", where, 1048576, 8,
                                              c["pushpull_seconds"]), "cpu_ops")
        if "--no-shm" not in extra:
            # The same 4 KB push through shared memory, as leash-worker sends it on one host.
            measured("push_4KB_shm", lambda: pushpull(build, c, tmp, f"{tag}-pp4kshm", where, 1024, 1,
                                                      c["pushpull_seconds"], mode="shm"), "cpu_ops")
            # And the 4 MB push: the worker's ring read in place by the primary, which copies each
            # push once, into the backup's ring (--primary-copies-once).
            measured("push_4MB_shm", lambda: pushpull(build, c, tmp, f"{tag}-pp4mshm", where, 1048576, 8,
                                                      c["pushpull_seconds"], mode="shm"), "cpu_ops")
        return out
    finally:
        cl.stop()


def part_cost(build, c, tmp, log):
    rounds = []
    # With --worker-apart each round also runs R=1 with no placement: the fastest R=1 here,
    # which R=2 with the worker apart is compared with as well.
    # leash-server's backups answer by default: the plain R=2 beside an answering one turns it off.
    plain = dict(c, shard_args=(c.get("shard_args") or "") + " --backup-answers=false") if c.get("answers") else c
    configs = [("r1", 1, c), ("r2", 2, plain)]
    if c.get("worker_apart"):
        configs.append(("r1_free", 1, {k: v for k, v in c.items() if k != "worker_apart"}))
    if c.get("answers"):
        # R=2 whose backup answers the pushes and clocks itself (leash-server --backup-answers).
        configs.append(("r2a", 2, dict(c, shard_args=(c.get("shard_args") or "") + " --backup-answers=true")))
    if c.get("versus"):
        # R=2 with other leash-server flags (--versus), e.g. the design a change replaced.
        configs.append(("r2v", 2, dict(c, shard_args=(c.get("shard_args") or "") + " " + c["versus"])))
    placed = c.get("backup_apart") or c.get("worker_apart")
    for r in range(c["rounds"]):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        # The floors below assume every process shares both cores: measured only then.
        got = {} if placed else {"least_work": least_work(
            build, tmp, f"least{r}", socket="--no-shm" in shlex.split(c.get("shard_args") or ""))}
        for key, replicas, cc in order:
            got[key] = cost_one(build, cc, tmp, f"cost{r}{key}", replicas, shlex.split(cc.get("shard_args", "")))
            g = got[key]
            name = {"r1": "R=1", "r2": "R=2", "r1_free": "R=1 free", "r2a": "R=2 answering",
                    "r2v": f"R=2 {c.get('versus')}"}[key]
            log(f"  round {r + 1}/{c['rounds']} {name}: {rows_line(g)}; backup CPU/iteration {g['mlp'].get('backup_cpu_us_per_iteration', 0):.0f} us; "
                f"load {g['mlp']['load_before']:.1f}")
        rounds.append(got)
    summary = {}
    for name, (row, key, higher) in COST_FIGURES.items():
        if any(row not in g["r1"] for g in rounds):
            continue
        # cost: how much worse R=2 is than R=1 in the same round (throughput lost, latency added)
        ratios, costs = per_round(rounds, "r2", "r1", row, key, higher)
        summary[name] = {"r1": [g["r1"][row][key] for g in rounds], "r2": [g["r2"][row][key] for g in rounds],
                         "r2_over_r1_per_round": ratios, "median_r2_over_r1": median(ratios),
                         "cost_per_round": costs, "median_cost": median(costs), "higher_is_better": higher,
                         "load_r1": [g["r1"][row]["load_before"] for g in rounds],
                         "load_r2": [g["r2"][row]["load_before"] for g in rounds],
                         "backup_cpu_us_per_iteration": median(g["r2"][row].get("backup_cpu_us_per_iteration")
                                                               for g in rounds),
                         "primary_cpu_us_per_iteration_r2": median(g["r2"][row].get("primary_cpu_us_per_iteration")
                                                                   for g in rounds),
                         "primary_cpu_us_per_iteration_r1": median(g["r1"][row].get("primary_cpu_us_per_iteration")
                                                                   for g in rounds),
                         "backup_idle_cpu_ms_per_s": median(g["r2"].get("backup_idle_cpu_ms_per_s") for g in rounds)}
        if c.get("answers"):
            vs_r2, _ = per_round(rounds, "r2a", "r2", row, key, higher)
            summary[name].update(third_config(rounds, "r2a", row, key, higher))
            summary[name].update({"r2a_over_r2_per_round": vs_r2, "median_r2a_over_r2": median(vs_r2)})
        if c.get("versus"):
            # R=2 at the defaults against it as a speed-up: above 1 is better, latency or throughput
            vs_r2 = per_round(rounds, "r2", "r2v", row, key, higher)[0] if higher else \
                per_round(rounds, "r2v", "r2", row, key, higher)[0]
            summary[name].update(third_config(rounds, "r2v", row, key, higher))
            summary[name].update({"r2_over_r2v_per_round": vs_r2, "median_r2_over_r2v": median(vs_r2)})
        if c.get("worker_apart"):
            free, free_costs = per_round(rounds, "r2", "r1_free", row, key, higher)
            summary[name]["r1_free"] = [g["r1_free"][row][key] for g in rounds]
            summary[name]["r2_over_r1_free_per_round"] = free
            summary[name]["median_cost_vs_r1_free"] = median(free_costs)
    if not placed:
        set_cpu_floors(summary, rounds, os.cpu_count())
        lat = [{"r1_us": g["r1"]["push_4KB"]["p50_us"], "r2_us": g["r2"]["push_4KB"]["p50_us"],
                "shm_rtt_us": g["least_work"]["shm_rtt_4KB_us"],
                "path": g["least_work"].get("raw_rtt_path", "shared memory")} for g in rounds if g.get("least_work")]
        if lat:
            summary["push_4KB_floor"] = {
                "per_round": lat, "r1_us": median(x["r1_us"] for x in lat), "r2_us": median(x["r2_us"] for x in lat),
                "shm_rtt_us": median(x["shm_rtt_us"] for x in lat), "path": lat[0]["path"],
                # R=1's push plus one raw round trip to the backup, against R=1's push
                "floor_cost": median(x["shm_rtt_us"] / x["r1_us"] for x in lat),
                # a backup that answers: R=1's push plus one raw hop (half a round trip) to the backup
                "floor_cost_answers": median(x["shm_rtt_us"] / 2 / x["r1_us"] for x in lat)}
            if c.get("answers"):
                summary["push_4KB_floor"]["r2a_us"] = median(g["r2a"]["push_4KB"]["p50_us"] for g in rounds)
    return {"rounds": rounds, "summary": summary}


def push_floor(rounds, cores=2, row="push_4MB"):
    """The least R=2 can cost the 4 MB push row (`row`) on this machine, from CPU. R=1's pushes already
    take the pushing client's and the shard's CPU per push (measured); R=2 adds at least the
    backup's update and one copy of the push (least_work, measured in the same round). With the
    cores busy, a push then takes at least all of that CPU over the cores, so R=2's time per push
    is at least max(R=1's, (client + shard + update + copy) / cores). Also what R=2 measured: its
    CPU per push (client + primary + backup) over the cores against its time per push, which says
    how CPU-bound it ran, and the CPU it added beyond the least. R=1's CPU is capped at the cores'
    time (the client's figure includes its start). Through shared memory (`row` push_4MB_shm) R=2
    adds no copy: R=1's shard copies each push out of the client's ring, and R=2's primary copies
    it once, into its backup's ring, instead; only the backup's update is added."""
    out = {"cores": cores, "per_round": [], "row": row}
    for g in rounds:
        if row not in g["r1"] or row not in g["r2"]:
            continue
        r1, r2, lw = g["r1"][row], g["r2"][row], g.get("least_work")
        c1, s1 = r1.get("client_cpu_us_per_iteration"), r1.get("primary_cpu_us_per_iteration")
        c2, p2, b2 = (r2.get("client_cpu_us_per_iteration"), r2.get("primary_cpu_us_per_iteration"),
                      r2.get("backup_cpu_us_per_iteration"))
        if None in (c1, s1, c2, p2, b2) or not lw or not r1.get("ops_per_s") or not r2.get("ops_per_s"):
            continue
        t1, t2 = 1e6 / r1["ops_per_s"], 1e6 / r2["ops_per_s"]
        copy = 0.0 if row == "push_4MB_shm" else lw["copy_us"]
        least = lw["update_us"] + copy
        # The client's figure includes its start, so R=1 may seem to use more than the cores:
        # capped, the bound stays a bound (busy cores: every added microsecond of CPU adds 1/cores).
        floor_t2 = max(t1, (min(c1 + s1, cores * t1) + least) / cores)
        out["per_round"].append({
            "r1_push_us": t1, "r2_push_us": t2, "r1_client_us": c1, "r1_shard_us": s1,
            "r1_cpu_busy": (c1 + s1) / (cores * t1), "update_us": lw["update_us"], "copy_us": copy,
            "least_added_us": least, "floor_cost": 1 - t1 / floor_t2,
            # The same with the backup's update out of the caches (update_cold).
            "update_cold_us": lw.get("update_cold_us"),
            "floor_cost_cold": (1 - t1 / max(t1, (min(c1 + s1, cores * t1) + lw["update_cold_us"] +
                                                  copy) / cores))
            if lw.get("update_cold_us") is not None else None,
            "r2_client_us": c2, "r2_primary_us": p2, "r2_backup_us": b2,
            "r2_cpu_busy": (c2 + p2 + b2) / (cores * t2),
            "r2_added_cpu_us": (c2 + p2 + b2) - (c1 + s1),
            # Backup on a host of its own: the client and the primary keep these cores, the backup
            # must keep up with the pushes on its own core.
            "backup_apart_estimate_cost": 1 - t1 / max(t1, b2, (c2 + p2) / cores)})
    for k in ("floor_cost", "r1_push_us", "r2_push_us", "r1_client_us", "r1_shard_us", "r1_cpu_busy", "update_us",
              "copy_us", "least_added_us", "r2_client_us", "r2_primary_us", "r2_backup_us", "r2_cpu_busy",
              "r2_added_cpu_us", "backup_apart_estimate_cost", "update_cold_us", "floor_cost_cold"):
        got = [x[k] for x in out["per_round"] if x.get(k) is not None]
        out[k] = median(got) if got else None
    return out


def set_cpu_floors(summary, rounds, cores):
    """The MLP's and the 4 MB row's CPU floors over the machine's cores: on 2 cores every process
    shares them; with more idle cores than processes the CPU bound says little (the floors fall
    to R=1's own time)."""
    summary["mlp_cpu_floor"] = cpu_floor(rounds, cores)
    summary["push_4MB_floor"] = push_floor(rounds, cores)
    if any("push_4MB_shm" in g["r2"] for g in rounds):
        summary["push_4MB_shm_floor"] = push_floor(rounds, cores, "push_4MB_shm")


def cpu_floor(rounds, cores=2):
    """What the MLP's R=2 cost must be at least from CPU alone: an iteration cannot take less than
    the worker's, the primary's and the backup's CPU time per iteration spread over the machine's
    cores. The same without the backup's (on cores of its own: another host) estimates the cost
    there. The worker's figure includes its start (loading the data), so these floors are a little
    high."""
    out = {"cores": cores, "per_round": []}
    for g in rounds:
        r1, r2 = g["r1"]["mlp"], g["r2"]["mlp"]
        t1 = 64 / r1["samples_per_second"] * 1e6  # measured R=1 iteration, us
        w, p, b = (r2.get("worker_cpu_us_per_iteration"), r2.get("primary_cpu_us_per_iteration"),
                   r2.get("backup_cpu_us_per_iteration"))
        if None in (w, p, b):
            continue
        here = (w + p + b) / cores
        apart = (w + p) / cores
        out["per_round"].append({"r1_iteration_us": t1, "r2_iteration_us": 64 / r2["samples_per_second"] * 1e6,
                                 "worker_us": w, "primary_us": p, "backup_us": b,
                                 "floor_cost_here": max(0.0, 1 - t1 / max(t1, here)),
                                 "floor_cost_backup_apart": max(0.0, 1 - t1 / max(t1, apart))})
    for k in ("floor_cost_here", "floor_cost_backup_apart", "worker_us", "r1_iteration_us", "r2_iteration_us"):
        out[k] = median(x[k] for x in out["per_round"]) if out["per_round"] else None
    return out


# ---------------------------------------------------------------- entry points

def run(build, c, tmp, out_dir, log, parts=("lost", "stall", "cost")):
    res = {"benchmark": "replication", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "config": c,
           "nproc": os.cpu_count(), "cpu": cpu_model()}
    t0 = time.monotonic()
    if "lost" in parts or "stall" in parts:
        res["failover"] = part_lost_stall(build, c, tmp, log, with_r1="lost" in parts)
    if "cost" in parts:
        log(f"cost of R=2 against R=1: {c['rounds']} interleaved rounds")
        res["cost"] = part_cost(build, c, tmp, log)
    res["seconds"] = time.monotonic() - t0
    write_json(os.path.join(out_dir, "replication.json"), res)
    write_md(res, out_dir)
    plot(res, out_dir)
    return res


def write_md(res, out_dir):
    """replication.md: the targets (as in bench/results/SUMMARY.md) and the sections."""
    md = ["# Replicated shards", "",
          f"`bench/replication.py`, {res['time']}, {res['nproc']} cores ({res.get('cpu', 'CPU not recorded')}), shared and noisy (the load average is given "
          f"with each figure); took {res['seconds'] / 60:.1f} min. Plot: [replication.png](replication.png); raw numbers: "
          "`replication.json`.", "", "## Targets", "", "| target | measured | verdict | by how much |", "|---|---|---|---|"]
    md += ["| " + " | ".join(t) + " |" for t in targets(res, verdict)]
    md += [""] + summary_md(res)
    with open(os.path.join(out_dir, "replication.md"), "w") as f:
        f.write("\n".join(md) + "\n")


def targets(res, verdict):
    rows = []
    fo = res.get("failover")
    if fo:
        r2, r1 = fo["r2"], fo.get("r1")
        r1_text = f"; R=1 from a 1 s snapshot: {r1['lost_per_kill']:.0f} per kill" if r1 else ""
        rows.append(("R=2: acknowledged pushes lost per primary SIGKILL = 0",
                     f"{r2['lost_per_kill']:g} ({r2['probe']['lost']} lost, {r2['probe']['doubled']} applied twice "
                     f"of {r2['probe']['acknowledged']} over {len(r2['kills'])} kills{r1_text})",
                     "PASS" if r2["probe"]["lost"] == 0 and r2["probe"]["doubled"] == 0 else "MISS", ""))
        limit = r2["ttl_s"] * 1000 + 1000
        rows.append((f"stall from the primary's SIGKILL to its successor's first acknowledgement <= TTL + 1 s "
                     f"({limit} ms), max of {len(r2['kills'])}",
                     f"median {r2['median_stall_ms']:.0f} ms, max {r2['max_stall_ms']:.0f} ms",
                     *verdict(r2["max_stall_ms"], limit, False)))
    co = res.get("cost")
    if co:
        for k, text in COST_NAMES.items():
            if k not in co["summary"]:
                continue
            s = co["summary"][k]
            if "median_cost_vs_r1_free" in s:
                # Worker apart: judged against the faster of R=1 placed the same way and R=1 free.
                cost, per = max((s["median_cost"], s["r2_over_r1_per_round"]),
                                (s["median_cost_vs_r1_free"], s["r2_over_r1_free_per_round"]),
                                key=lambda x: x[0])
                what = "R=1 placed alike" if per is s["r2_over_r1_per_round"] else "R=1 free"
                rows.append((f"R=2 (worker apart) cost against the faster R=1: {text} <= 25%",
                             f"{cost * 100:.1f}% (against {what}; per round "
                             f"{', '.join(f'{x:.2f}' for x in per)})",
                             *verdict(cost if cost > 0 else 0.0, 0.25, False)))
                continue
            rows.append((f"R=2 cost against R=1: {text} <= 25%",
                         f"{s['median_cost'] * 100:.1f}% (R=2/R=1 per round "
                         f"{', '.join(f'{x:.2f}' for x in s['r2_over_r1_per_round'])})",
                         *verdict(s["median_cost"] if s["median_cost"] > 0 else 0.0, 0.25, False)))
            if "median_cost_r2a" in s:
                rows.append((f"R=2, backups answering (--backup-answers), cost against R=1: {text} <= 25%",
                             f"{s['median_cost_r2a'] * 100:.1f}% (per round "
                             f"{', '.join(f'{x:.2f}' for x in s['r2a_over_r1_per_round'])}; against plain R=2 "
                             f"{', '.join(f'{x:.2f}' for x in s['r2a_over_r2_per_round'])})",
                             *verdict(s["median_cost_r2a"] if s["median_cost_r2a"] > 0 else 0.0, 0.25, False)))
    return rows


def summary_md(res):
    md = []
    fo = res.get("failover")
    if fo:
        r2, r1, fa = fo["r2"], fo.get("r1"), fo.get("faults_lost_1s")
        md += ["## Acknowledged updates lost per shard SIGKILL", "",
               "`leash-bench-failover` pushes one 4 KB gradient at a time to an SGD (lr 1) table, push k adding 1 to "
               "element k mod 1024, through a `leash::Client`; the final table is compared with the exact sum of the "
               "acknowledged pushes. R=2: the client follows the primary in etcd and the primary is SIGKILLed, then "
               "restarted as a backup; R=1: the shard (snapshots every 1 s) is SIGKILLed and restarted from its last "
               "snapshot. `bench/faults.py lost` (2 MLP workers, same run) gives the R=1 loss in training time.", "",
               "| setup | kills | pushes acknowledged | lost | applied twice | lost per kill |", "|---|---|---|---|---|---|",
               f"| R=2, etcd TTL {r2['ttl_s']} s | {len(r2['kills'])} | {r2['probe']['acknowledged']} | "
               f"{r2['probe']['lost']} | {r2['probe']['doubled']} | **{r2['lost_per_kill']:g}** |",
               (f"| R=1, restart from the 1 s snapshot | {len(r1['kills'])} | {r1['probe']['acknowledged']} | "
                f"{r1['probe']['lost']} | {r1['probe']['doubled']} | {r1['lost_per_kill']:.0f} |" if r1 else
                "| R=1 | not measured in this run | | | | |"), "",
               (f"bench/faults.py, R=1 with snapshots every 1 s: median {fa['median_lost_seconds']:.2f} s of training "
                f"lost per kill (max {fa['max_lost_seconds']:.2f} s; clocks lost per run "
                f"{', '.join(str(x['lost_clocks']) for x in fa['runs'])})." if fa else ""), "",
               f"## Stall after the primary's SIGKILL (R=2, etcd lease TTL {r2['ttl_s']} s)", "",
               "From the SIGKILL to the first push the new primary acknowledges, and where the time goes (ms after "
               "the kill): etcd deletes the dead primary's key when its lease expires (the lease was renewed every "
               "TTL/3, so it had TTL minus up to TTL/3 left; etcd checks expiry every 500 ms); the backup, polling "
               "the directory, campaigns and writes the new primary key; it logs that it leads; the client's "
               "directory watch retargets and resends; the new primary acknowledges.", "",
               "| kill | stall | key deleted | new primary key | leads | client retargeted | first ack | load |",
               "|---|---|---|---|---|---|---|---|"]
        for i, k in enumerate(r2["kills"]):
            md.append(f"| {i + 1} | {k['stall_ms']} | " + " | ".join(
                "—" if k[p] is None else str(k[p]) for p in ("primary_key_deleted_ms", "new_primary_key_ms",
                                                            "new_primary_leads_ms", "client_retargeted_ms",
                                                            "first_ack_ms")) + f" | {k['load_before']:.1f} |")
        pm = r2["median_parts_ms"]
        def ms(v):
            return "—" if v is None else f"{v:.0f}"
        md += [f"| median | **{r2['median_stall_ms']:.0f}** | {ms(pm['primary_key_deleted_ms'])} | "
               f"{ms(pm['new_primary_key_ms'])} | {ms(pm['new_primary_leads_ms'])} | "
               f"{ms(pm['client_retargeted_ms'])} | {ms(pm['first_ack_ms'])} | |", "",
               f"Max {r2['max_stall_ms']:.0f} ms against TTL + 1 s = {r2['ttl_s'] * 1000 + 1000} ms.", ""]
    co = res.get("cost")
    if co:
        s = co["summary"]
        which = ""
        if res["config"].get("backup_answers_default"):
            which = ("R=2 is plain (`--backup-answers=false`: every reply from the primary, once its backup holds "
                     "the entry). " if res["config"].get("answers") else
                     "R=2 runs at leash-server's defaults: its only in-sync backup answers pushes and clocks "
                     "(`--backup-answers`). ")
        md += ["## Cost of R=2 against R=1", "",
               which + f"{len(co['rounds'])} rounds, " + ("R=1, R=2 and R=1 free interleaved, the order rotated each round"
                                                  if res["config"].get("worker_apart") else
                                                  "R=1 and R=2 interleaved pair by pair (R=1 first in even rounds)") +
               ", each on "
               "a fresh cluster: leash-worker MLP 1 worker + 1 shard at staleness 1 (samples/s over training time; "
               f"wire {res['config'].get('wire_dtype', 'fp32')}: the pushes the primary forwards to its backup as "
               "they came"
               + (f"; every shard with `{res['config']['shard_args']}`" if res["config"].get("shard_args") else "")
               + "), "
               "then `leash-bench-pushpull` 4 KB push (1 in flight, p50) and 4 MB push (8 in "
               "flight, MB/s), socket (R=1: `--servers SHARD`; R=2: `--etcd`, the client following the directory "
               "as leash-worker does)"
               + ("; and the 4 KB push again through shared memory (`--modes shm`: the client offers every shard, "
                  "and an answering backup, a segment, as leash-worker does on one host)"
                  if "push_4KB_shm_p50_us" in s else "")
               + (", then the 4 MB push through it too (the primary reads it in the client's ring and copies it "
                  "once, into its backup's)" if "push_4MB_shm_mb_per_s" in s else "")
               + (f"; each push row measured for {res['config']['pushpull_seconds']:g} s after "
                  f"{res['config']['pushpull_warmup']:g} s unmeasured (a fresh cluster's first pushes touch the table, "
                  "its momentum and, at R=2, the backup's ring for the first time)"
                  if res["config"].get("pushpull_warmup") else "") + ". " + (
                   "**Backup apart**: the worker, the primary (R=1: the shard) and the pushing client are pinned to "
                   "CPU 0, the backup and etcd to CPU 1 (`taskset`), as if the backup ran on another host; so R=1 "
                   "runs on one core here. " if res["config"].get("backup_apart") else
                   "**Worker apart**: the worker and the pushing client are pinned to CPU 0, every shard process "
                   "(R=1: the shard; R=2: the primary, the backup and etcd) to CPU 1 (`taskset`); each round also "
                   "runs R=1 with no placement (R=1 free), the fastest R=1 here. " if res["config"].get("worker_apart")
                   else
                   f"The worker, the primary and the backup share this machine's {res.get('nproc', 2)} cores. ") + "CPU time per iteration (one MLP step, or one push) from /proc/PID/stat.", "",
               "| figure | R=1 per round | R=2 per round | R=2/R=1 per round | median cost | backup CPU per "
               "iteration | primary CPU per iteration R=1 → R=2 | load R=1 / R=2 |", "|---|---|---|---|---|---|---|---|"]
        names = {k: v.replace("(1 in flight)", "(us)") for k, v in COST_NAMES.items() if k in s}
        for k, text in names.items():
            v = s[k]
            md.append(f"| {text} | {', '.join(f'{x:.0f}' for x in v['r1'])} | {', '.join(f'{x:.0f}' for x in v['r2'])} "
                      f"| {', '.join(f'{x:.2f}' for x in v['r2_over_r1_per_round'])} | **{v['median_cost'] * 100:.1f}%** "
                      f"| {v['backup_cpu_us_per_iteration'] or 0:.0f} us | "
                      f"{v['primary_cpu_us_per_iteration_r1'] or 0:.0f} → {v['primary_cpu_us_per_iteration_r2'] or 0:.0f} us"
                      f" | {', '.join(f'{x:.1f}' for x in v['load_r1'])} / {', '.join(f'{x:.1f}' for x in v['load_r2'])} |")
        if "r2a" in s["mlp_samples_per_second"]:
            md += third_config_table(
                s, names, "r2a", "R=2 with backups that answer (`leash-server --backup-answers`: the backup sends the "
                "worker the replies to its pushes and clocks itself, one hop less), in the same rounds:",
                "R=2 answering per round", "its/R=2 per round",
                lambda v: f"{', '.join(f'{x:.2f}' for x in v['r2a_over_r2_per_round'])}")
        if "r2v" in s["mlp_samples_per_second"]:
            md += third_config_table(
                s, names, "r2v", f"R=2 with `{res['config']['versus']}` added (`--versus`), in the same rounds; the last "
                "columns but one say how much faster R=2 at the defaults was than it (its throughput over this one's, or "
                "this one's latency over its; above 1: faster):",
                "R=2 versus per round", "R=2/it per round (median)",
                lambda v: (f"{', '.join(f'{x:.2f}' for x in v['r2_over_r2v_per_round'])} "
                           f"(**{v['median_r2_over_r2v']:.2f}**)"))
        if "r1_free" in s["mlp_samples_per_second"]:
            md += ["", "Against R=1 with no placement (R=1 free), in the same rounds:", "",
                   "| figure | R=1 free per round | R=2/R=1 free per round | median cost |", "|---|---|---|---|"]
            for k, text in names.items():
                v = s[k]
                md.append(f"| {text} | {', '.join(f'{x:.0f}' for x in v['r1_free'])} | "
                          f"{', '.join(f'{x:.2f}' for x in v['r2_over_r1_free_per_round'])} | "
                          f"**{v['median_cost_vs_r1_free'] * 100:.1f}%** |")
        fl = s.get("mlp_cpu_floor")
        if fl and fl.get("floor_cost_here") is not None:
            md += ["", f"Where the MLP's cost comes from (medians over the rounds): an R=1 iteration took "
                   f"{fl['r1_iteration_us']:.0f} us and an R=2 one {fl['r2_iteration_us']:.0f} us; the worker used "
                   f"{fl['worker_us']:.0f} us of CPU per iteration (its whole run's, start included). From CPU "
                   f"alone (an iteration takes at least the worker's, the primary's and the backup's CPU time "
                   f"per iteration over {fl['cores']} cores) the cost of R=2 is at least **{fl['floor_cost_here'] * 100:.1f}%** on this "
                   f"machine, and at least {fl['floor_cost_backup_apart'] * 100:.1f}% with the backup on cores of "
                   "its own (another host); the rest is waiting: the backup's round trip on the pulls' path and "
                   f"three processes' threads taking turns on {fl['cores']} cores."]
        pf = s.get("push_4MB_floor")
        if pf and pf.get("floor_cost") is not None:
            md += ["", f"Where the 4 MB push row's cost comes from (medians over the rounds, per push): at R=1 a push "
                   f"took {pf['r1_push_us']:.0f} us, the pushing client used {pf['r1_client_us']:.0f} us of CPU and "
                   f"the shard {pf['r1_shard_us']:.0f} us, so the {pf['cores']} cores were "
                   f"{pf['r1_cpu_busy'] * 100:.0f}% busy (the client's start included; counted as at most 100%). "
                   f"Any R=2 adds at least the backup's momentum update of the "
                   f"push ({pf['update_us']:.0f} us, `leash-bench-pushpull`'s update row) and one copy of it into "
                   f"memory the backup reads ({pf['copy_us']:.0f} us, `leash-bench-crosscore`), both measured alone "
                   f"in each round; so from CPU the cost of R=2 is at least **{pf['floor_cost'] * 100:.1f}%** here "
                   f"(R=1's CPU plus those {pf['least_added_us']:.0f} us over {pf['cores']} cores, against R=1's time). "
                   f"Measured at R=2: {pf['r2_push_us']:.0f} us per push, the client {pf['r2_client_us']:.0f}, the "
                   f"primary {pf['r2_primary_us']:.0f} and the backup {pf['r2_backup_us']:.0f} us of CPU "
                   f"({pf['r2_cpu_busy'] * 100:.0f}% of the cores), {pf['r2_added_cpu_us']:.0f} us more than R=1, "
                   f"{pf['r2_added_cpu_us'] / pf['least_added_us']:.1f}x the least. With the backup on a host of its "
                   f"own (its CPU per push on its own core, the client's and the primary's on these {pf['cores']}) the cost "
                   f"would be about {pf['backup_apart_estimate_cost'] * 100:.0f}%."]
            if pf.get("floor_cost_cold") is not None:
                md[-1] += (f" On one host the two replicas' tables and momentum (16 MB) and up to 8 pushes of 4 MB "
                           f"in flight, each held by the primary and copied for the backup, share one last-level "
                           f"cache: "
                           f"the backup's update on state out of the caches takes {pf['update_cold_us']:.0f} us "
                           f"(`leash-bench-pushpull`'s update_cold row) against {pf['update_us']:.0f} us, and with "
                           f"it the least R=2 can cost is **{pf['floor_cost_cold'] * 100:.1f}%**.")
        sf = s.get("push_4MB_shm_floor")
        if sf and sf.get("floor_cost") is not None:
            md += ["", f"And the 4 MB row through shared memory's (medians): at R=1 a push took "
                   f"{sf['r1_push_us']:.0f} us, the client used {sf['r1_client_us']:.0f} us of CPU (its copy into "
                   f"its ring) and the shard {sf['r1_shard_us']:.0f} us (its copy out of the ring, checking for NaN, "
                   f"and the update), the {sf['cores']} cores {sf['r1_cpu_busy'] * 100:.0f}% busy. R=2 copies no more "
                   f"(the primary's one copy, into its backup's ring, takes the place of that copy out) but adds "
                   f"the backup's update: at least {sf['update_us']:.0f} us on state in the caches, so R=2 costs "
                   f"at least **{sf['floor_cost'] * 100:.1f}%**"
                   + (f", and **{sf['floor_cost_cold'] * 100:.1f}%** with the backup's update on state out of them "
                      f"({sf['update_cold_us']:.0f} us)" if sf.get("floor_cost_cold") is not None else "")
                   + f". Measured at R=2: {sf['r2_push_us']:.0f} us per push, the client {sf['r2_client_us']:.0f}, "
                   f"the primary {sf['r2_primary_us']:.0f} and the backup {sf['r2_backup_us']:.0f} us of CPU "
                   f"({sf['r2_cpu_busy'] * 100:.0f}% of the cores); with the backup on a host of its own about "
                   f"{sf['backup_apart_estimate_cost'] * 100:.0f}%."]
        lf = s.get("push_4KB_floor")
        if lf:
            raw = (f"{lf.get('path', 'shared memory')} ({lf['shm_rtt_us']:.1f} us p50, `leash-bench-pushpull`'s "
                   f"{'rtt2' if lf.get('path') == 'loopback TCP' else 'shm2'} row, measured alone in each round)")
            extra = lf["r2_us"] - lf["r1_us"]
            if (res["config"].get("backup_answers_default") and not res["config"].get("answers")
                    and lf.get("floor_cost_answers") is not None):
                # R=2 ran at the defaults: its backup answers the worker, so the push takes one
                # hop more than R=1's (worker -> primary -> backup -> worker), not a round trip.
                md += ["", f"And the 4 KB push's: acknowledged only once the backup holds it, and answered by the "
                       f"backup, an R=2 push takes one hop more than R=1's (worker, primary, backup, worker), so it "
                       f"waits at least for R=1's ({lf['r1_us']:.0f} us p50) plus half a raw round trip between "
                       f"two processes through {raw}: a cost of at least "
                       f"**{lf['floor_cost_answers'] * 100:.1f}%**, over the 25% target wherever one hop takes "
                       f"more than a quarter of R=1's round trip. Measured at R=2: {lf['r2_us']:.0f} us, "
                       f"{extra:.0f} us more than R=1, {extra / (lf['shm_rtt_us'] / 2):.1f}x that hop."]
            else:
                md += ["", f"And the 4 KB push's: acknowledged only once the backup holds it, an R=2 push waits at "
                       f"least for R=1's ({lf['r1_us']:.0f} us p50) plus a raw round trip to the backup through "
                       f"{raw}: a cost of at least **{lf['floor_cost'] * 100:.1f}%**. Measured at R=2: "
                       f"{lf['r2_us']:.0f} us, {extra:.0f} us more than R=1, {extra / lf['shm_rtt_us']:.1f}x the "
                       f"raw round trip."]
            if lf.get("r2a_us") is not None and lf.get("floor_cost_answers") is not None:
                md[-1] += (f" A backup that answers saves a hop: the least is R=1's push plus one hop to the backup "
                           f"(half that round trip), a cost of at least **{lf['floor_cost_answers'] * 100:.1f}%**; "
                           f"measured: {lf['r2a_us']:.0f} us, {lf['r2a_us'] - lf['r1_us']:.0f} us more than R=1.")
        idle = s["mlp_samples_per_second"]["backup_idle_cpu_ms_per_s"]
        md += ["", f"With no request the backup burns {idle or 0:.0f} ms of CPU per second (median over 1 s windows, "
               "/proc's 10 ms ticks; its heartbeats and its polls of the directory), counted in its per-iteration "
               "figures above.", ""]
    return md


def plot(res, out_dir):
    plt = pyplot()
    if plt is None:
        return None
    fo, co = res.get("failover"), res.get("cost")
    panels = (1 if fo else 0) + (1 if co else 0)
    if not panels:
        return None
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4))
    axes = list(axes) if panels > 1 else [axes]
    if fo:
        ax = axes.pop(0)
        r2 = fo["r2"]
        parts = ["primary_key_deleted_ms", "new_primary_key_ms", "client_retargeted_ms", "first_ack_ms"]
        labels = ["etcd deleted the primary key", "new primary key", "client retargeted", "first ack (stall)"]
        xs = list(range(1, len(r2["kills"]) + 1))
        for p, lab in zip(parts, labels):
            ax.plot(xs, [k[p] if k[p] is not None else float("nan") for k in r2["kills"]], marker="o", label=lab)
        ax.axhline(r2["ttl_s"] * 1000, color="grey", ls=":", lw=1, label="TTL")
        ax.axhline(r2["ttl_s"] * 1000 + 1000, color="tab:red", ls="--", lw=1, label="target TTL + 1 s")
        ax.set_xlabel("primary SIGKILL")
        ax.set_ylabel("ms after the kill")
        ax.set_title(f"Failover, R=2, etcd TTL {r2['ttl_s']} s")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    if co:
        ax = axes.pop(0)
        s = co["summary"]
        names = {k: v for k, v in {"mlp_samples_per_second": "MLP 1+1 s=1\nsamples/s",
                                   "push_4KB_p50_us": "4 KB push\np50 latency", "push_4MB_mb_per_s": "4 MB push\nMB/s",
                                   "push_4KB_shm_p50_us": "4 KB push shm\np50 latency",
                                   "push_4MB_shm_mb_per_s": "4 MB push shm\nMB/s"}.items() if k in s}
        answers = all("r2a_over_r1_per_round" in s[k] for k in names)
        width = 0.4 if answers else 0.8
        for j, (label, key) in enumerate([("R=2", "r2_over_r1_per_round")]
                                         + ([("R=2 answering", "r2a_over_r1_per_round")] if answers else [])):
            vals = [median(s[k][key]) for k in names]
            xs = [x + (j - 0.5) * width if answers else x for x in range(len(names))]
            ax.bar(xs, vals, width=width, label=label, color=["tab:blue", "tab:green"][j])
            for x, v in zip(xs, vals):
                ax.text(x, v, f"{v:.2f}x", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(names)), list(names.values()), fontsize=7)
        ax.axhline(1.0, color="grey", lw=1)
        ax.axhline(0.75, color="tab:red", ls="--", lw=1, label="throughput target (-25%)")
        ax.axhline(1.25, color="tab:orange", ls="--", lw=1, label="latency target (+25%)")
        ax.set_ylabel("R=2 / R=1 (median of interleaved rounds)")
        ax.set_title("Cost of a backup replica (" + ("backup on a core of its own)" if res["config"].get("backup_apart")
                                                     else f"same {res.get('nproc', 2)} cores)"))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "replication.png"), dpi=100)
    plt.close(fig)
    return "replication.png"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--quick", action="store_true", help="a smoke run: few kills, 1 round")
    p.add_argument("--only", default="lost,stall,cost",
                   help="comma-separated: stall (R=2 kills: the stall and R=2's loss), lost (with R=1's loss "
                        "beside it), cost")
    p.add_argument("--kills", type=int, help="primary kills (default 10)")
    p.add_argument("--ttl", type=int, help="etcd lease TTL in s (default 2)")
    p.add_argument("--rounds", type=int, help="cost rounds (default 3)")
    p.add_argument("--wire-dtype", choices=("fp32", "fp16", "bf16"),
                   help="the MLP worker's --wire-dtype in the cost part (default fp32); the backup receives "
                        "each push as the worker sent it, so 16 bits halve the bytes replicated")
    p.add_argument("--backup-apart", action="store_true",
                   help="cost part: pin the worker, the primary (or R=1's shard) and the pushing client to CPU 0 "
                        "and the backup and etcd to CPU 1, as if the backup ran on another host")
    p.add_argument("--worker-apart", action="store_true",
                   help="cost part: pin the worker and the pushing client to CPU 0 and every shard process (R=1's "
                        "shard; R=2's primary, backup and etcd) to CPU 1, and also run R=1 with no placement")
    p.add_argument("--answers", action="store_true",
                   help="cost part: each round also runs R=2 with backups that answer (leash-server "
                        "--backup-answers=true), interleaved with R=1 and plain R=2 (--backup-answers=false)")
    p.add_argument("--versus", help="cost part: each round also runs R=2 with these leash-server flags added "
                                     "(e.g. '--backups-read-in-place=false'), interleaved with R=1 and R=2")
    p.add_argument("--shard-args", help="cost part: more leash-server flags for every shard process of both "
                                         "configurations, e.g. '--update-threads 4'")
    p.add_argument("--pushpull-warmup", type=float,
                   help="cost part: seconds each push row runs unmeasured first (default 0.5; 0: measure "
                        "from a fresh cluster's first push)")
    p.add_argument("--keep-tmp", action="store_true")
    p.add_argument("--summary-only", action="store_true",
                   help="rewrite replication.md and replication.png from --out/replication.json")
    a = p.parse_args()
    if a.summary_only:
        with open(os.path.join(a.out, "replication.json")) as f:
            res = json.load(f)
        co = res.get("cost")
        if co and "mlp_cpu_floor" in co["summary"]:  # the floors over the cores it ran on
            set_cpu_floors(co["summary"], co["rounds"], res.get("nproc", 2))
            write_json(os.path.join(a.out, "replication.json"), res)
        write_md(res, a.out)
        plot(res, a.out)
        return 0
    c = config(a.quick)
    c["backup_answers_default"] = True  # leash-server's --backup-answers (the R=2 rows say which they ran)
    if a.backup_apart and a.worker_apart:
        p.error("--backup-apart and --worker-apart place the processes differently: give one")
    for k in ("kills", "ttl", "rounds", "wire_dtype", "backup_apart", "worker_apart", "shard_args", "answers",
              "versus", "pushpull_warmup"):
        if getattr(a, k) is not None:
            c[k] = getattr(a, k)
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="leash-replication-")

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    try:
        res = run(a.build, c, tmp, a.out, log, [x.strip() for x in a.only.split(",")])
    finally:
        if a.keep_tmp:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("\n".join(summary_md(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

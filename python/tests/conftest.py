"""pytest support for the leash package: clusters of real leash-server processes on free
loopback ports (killed by PID at the end of each test), a real etcd with replicated shards
(leash-server --replicas, as tests/support/replicated_cluster.cc runs them), and worker
subprocesses. The binaries come from LEASH_SERVER_BIN / LEASH_WORKER_BIN (ctest sets them)
or build/; etcd from LEASH_ETCD_BIN or PATH (tests that need it skip without it).
Fixtures are per test; not thread-safe."""
import base64
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("LEASH_BUILD_DIR", os.path.join(ROOT, "build"))
SERVER_BIN = os.environ.get("LEASH_SERVER_BIN", os.path.join(BUILD, "server", "leash-server"))
WORKER_BIN = os.environ.get("LEASH_WORKER_BIN", os.path.join(BUILD, "worker", "leash-worker"))
PYTHON_DIR = os.path.join(BUILD, "python")
if PYTHON_DIR not in sys.path and not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, PYTHON_DIR)


_GIVEN_PORTS = set()
_PORT_LOCKS = []  # the flocked files of the ports handed out: held while this process lives


def free_port():
    """A loopback port, by tests/support/process.cc's FreePort scheme, so that the C++ and
    Python suites that ctest runs side by side never draw the same one: from [20000, 32000),
    below the kernel's ephemeral ports (which any process's outgoing connection may take
    between the draw and a shard's bind); at most once per process (the kernel's bind to
    port 0 once gave two shards of one test the same port); and reserved across processes
    with an flock on $TMPDIR/leash-test-ports/PORT while this process lives."""
    d = os.path.join(os.environ.get("TMPDIR", "/tmp"), "leash-test-ports")
    os.makedirs(d, exist_ok=True)
    rng = random.Random(os.getpid() ^ time.time_ns())
    for _ in range(1000):
        port = rng.randrange(20000, 32000)
        if port in _GIVEN_PORTS:
            continue
        f = open(os.path.join(d, str(port)), "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
        except OSError:  # another test process holds it, or something listens there
            f.close()
            continue
        _GIVEN_PORTS.add(port)
        _PORT_LOCKS.append(f)
        return port
    raise RuntimeError("no free loopback port in [20000, 32000) after 1000 tries")


class Cluster:
    """n leash-server shards under `tmp`, each with `extra` flags."""

    def __init__(self, n, tmp, extra=()):
        self.dir = str(tmp)
        self.extra = list(extra)
        self.endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(n)]
        self.procs = [None] * n
        for i in range(n):
            self.start(i)

    def start(self, i):
        argv = [SERVER_BIN, f"--shard={i}", f"--num-shards={len(self.endpoints)}",
                f"--bind={self.endpoints[i]}", f"--data-dir={self.dir}/shard{i}",
                "--checkpoint-interval=0", "--no-sync"] + self.extra
        log = open(os.path.join(self.dir, f"shard{i}.log"), "wb")
        self.procs[i] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    @property
    def servers(self):
        return ",".join(self.endpoints)

    def log(self, i):
        with open(os.path.join(self.dir, f"shard{i}.log"), errors="replace") as f:
            return f.read()

    def stop(self):
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            if p is None:
                continue
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def cluster_factory(tmp_path):
    made = []

    def make(n=1, extra=()):
        d = tmp_path / f"cluster{len(made)}"
        d.mkdir()
        c = Cluster(n, d, extra)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory(1)


@pytest.fixture
def cluster2(cluster_factory):
    return cluster_factory(2)


class Workers:
    """Subprocesses (python scripts or leash-worker) killed by PID when the test ends."""

    def __init__(self, tmp):
        self.dir = str(tmp)
        self.procs = []

    def python(self, name, script, *args, env=None, stdin=None):
        e = dict(os.environ)
        e.setdefault("PYTHONPATH", PYTHON_DIR)
        e["PYTHONDONTWRITEBYTECODE"] = "1"
        e.update(env or {})
        return self._start(name, [sys.executable, script, *map(str, args)], e, stdin)

    def cpp(self, name, *flags):
        return self._start(name, [WORKER_BIN, *flags], dict(os.environ))

    def _start(self, name, argv, env, stdin=None):
        log = open(os.path.join(self.dir, f"{name}.log"), "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=stdin)
        log.close()
        p.log_path = os.path.join(self.dir, f"{name}.log")
        self.procs.append(p)
        return p

    @staticmethod
    def log(p):
        with open(p.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def workers(tmp_path):
    w = Workers(tmp_path)
    yield w
    w.stop()


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# ---- etcd and replicated shards -------------------------------------------------------


def etcd_binary():
    """The etcd executable (LEASH_ETCD_BIN, else etcd on PATH or in /usr/bin), or None."""
    env = os.environ.get("LEASH_ETCD_BIN")
    if env:
        return env if os.access(env, os.X_OK) else None
    return shutil.which("etcd") or shutil.which("etcd", path="/usr/bin:/usr/local/bin")


class Etcd:
    """A single-member etcd on free loopback ports with its data under `tmp`, started and
    killed by PID (as tests/support/etcd_process.cc runs it)."""

    def __init__(self, binary, tmp):
        self.dir = str(tmp)
        client_port = free_port()
        peer_port = free_port()
        while peer_port == client_port:
            peer_port = free_port()
        self.endpoint = f"http://127.0.0.1:{client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        self.log_path = os.path.join(self.dir, "etcd.log")
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [binary, "--name", "leash-test", "--data-dir", os.path.join(self.dir, "etcd-data"),
             "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"leash-test={peer}", "--logger", "zap",
             "--log-outputs", "stderr"], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self._healthy():
                return
            time.sleep(0.05)
        self.kill()
        with open(self.log_path, errors="replace") as f:
            raise RuntimeError(f"etcd at {self.endpoint} did not become healthy; its log "
                               f"ends:\n{f.read()[-2000:]}")

    def _healthy(self):
        try:
            with urllib.request.urlopen(self.endpoint + "/health", timeout=1) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def get(self, key):
        """The value of `key` (str), or None if absent; None too if etcd does not answer."""
        body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
        req = urllib.request.Request(self.endpoint + "/v3/kv/range", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=2) as r:
                kvs = json.loads(r.read()).get("kvs", [])
        except (OSError, ValueError):
            return None
        return base64.b64decode(kvs[0]["value"]).decode() if kvs else None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def etcd(tmp_path):
    binary = etcd_binary()
    if binary is None:
        pytest.skip("etcd is not installed (bash scripts/install-deps.sh installs etcd-server; "
                    "LEASH_ETCD_BIN names another executable)")
    d = tmp_path / "etcd"
    d.mkdir()
    e = Etcd(binary, d)
    yield e
    e.kill()


class ReplicatedCluster:
    """`num_shards` shards of `replicas` leash-server replicas each, coordinated through
    `etcd` under job `job` with a `ttl` s lease; replica r of shard s logs to
    shard<s>-r<r>.log under `tmp`. Killed by PID in stop()."""

    def __init__(self, etcd, tmp, job="test", num_shards=1, replicas=2, ttl=2, extra=()):
        self.etcd = etcd
        self.dir = str(tmp)
        self.job = job
        self.num_shards = num_shards
        self.replicas = replicas
        self.ttl = ttl
        # A worker's lease long enough that a pusher waiting out a failover is not evicted.
        self.extra = ["--lease-timeout=10s"] + list(extra)
        self.endpoints = [[f"tcp://127.0.0.1:{free_port()}" for _ in range(replicas)]
                          for _ in range(num_shards)]
        self.procs = [[None] * replicas for _ in range(num_shards)]
        for s in range(num_shards):
            for r in range(replicas):
                self.start(s, r)

    def start(self, s, r):
        name = f"shard{s}-r{r}"
        argv = [SERVER_BIN, f"--shard={s}", f"--num-shards={self.num_shards}",
                f"--bind={self.endpoints[s][r]}", f"--data-dir={self.dir}/{name}",
                f"--replicas={self.replicas}", f"--replica={r}",
                f"--peers={','.join(self.endpoints[s])}", f"--etcd={self.etcd.endpoint}",
                f"--job={self.job}", f"--etcd-ttl={self.ttl}", "--no-sync",
                "--insecure"] + self.extra
        log = open(os.path.join(self.dir, f"{name}.log"), "ab")
        self.procs[s][r] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def _key(self, s, what):
        return f"/leash/{self.job}/shards/{s}/{what}"

    def primary(self, s):
        """Shard s's primary as etcd holds it ({"term", "replica", "endpoint", ...}), or
        None while it has none."""
        v = self.etcd.get(self._key(s, "primary"))
        return json.loads(v) if v else None

    def in_sync(self, s):
        """The replicas of shard s in its in-sync set, as etcd holds it."""
        v = self.etcd.get(self._key(s, "in_sync"))
        return json.loads(v) if v else []

    def all_in_sync(self):
        return all(self.primary(s) is not None and len(self.in_sync(s)) == self.replicas
                   for s in range(self.num_shards))

    def kill(self, s, r):
        """SIGKILL (no clean shutdown) of replica r of shard s, reaped."""
        p = self.procs[s][r]
        if p is not None and p.poll() is None:
            p.kill()
        if p is not None:
            p.wait()

    def logs(self):
        out = []
        for s in range(self.num_shards):
            for r in range(self.replicas):
                path = os.path.join(self.dir, f"shard{s}-r{r}.log")
                if os.path.exists(path):
                    with open(path, errors="replace") as f:
                        out.append(f"--- shard {s} replica {r}\n{f.read()[-3000:]}")
        return "\n".join(out)

    def stop(self):
        for row in self.procs:
            for p in row:
                if p is not None and p.poll() is None:
                    p.kill()
                if p is not None:
                    p.wait()


@pytest.fixture
def replicated_factory(etcd, tmp_path):
    made = []

    def make(**kwargs):
        d = tmp_path / f"replicated{len(made)}"
        d.mkdir()
        c = ReplicatedCluster(etcd, d, **kwargs)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()

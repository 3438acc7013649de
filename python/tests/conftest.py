"""pytest support for the leash package: clusters of real leash-server processes on free
loopback ports (killed by PID at the end of each test), and worker subprocesses. The
binaries come from LEASH_SERVER_BIN / LEASH_WORKER_BIN (ctest sets them) or build/.
Fixtures are per test; not thread-safe."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("LEASH_BUILD_DIR", os.path.join(ROOT, "build"))
SERVER_BIN = os.environ.get("LEASH_SERVER_BIN", os.path.join(BUILD, "server", "leash-server"))
WORKER_BIN = os.environ.get("LEASH_WORKER_BIN", os.path.join(BUILD, "worker", "leash-worker"))
PYTHON_DIR = os.path.join(BUILD, "python")
if PYTHON_DIR not in sys.path and not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, PYTHON_DIR)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

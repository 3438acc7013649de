"""leash.Client(etcd=..., job=...) against replicated shards: a real etcd and leash-server
replicas (--replicas 2, a 2 s etcd lease), the client finding the primary in etcd and
following it when it is SIGKILLed; and the errors of a bad or unreachable etcd. The
failover tests skip without an etcd executable. Each test drives its own processes."""
import threading
import time

import numpy as np
import pytest

import leash
from conftest import free_port, wait_for

ROWS = 4


class ExactSumTrainer:
    """Trains a 4-value SGD table at learning rate 1 with known gradients from a thread of
    its own: iteration i pulls (the values must be minus the sum of every push acknowledged
    so far, exactly), pushes i % 64 into row i % 4, clocks and waits until all of it is
    acknowledged. The table must therefore always equal minus the acknowledged sums."""

    def __init__(self, client, table):
        self.client = client
        self.table = table
        self.sums = np.zeros(ROWS, dtype=np.float64)
        self.acknowledged = 0
        self.failure = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainer", daemon=True)
        self._thread.start()

    def _run(self):
        try:
            i = 0
            while not self._stop.is_set():
                i += 1
                values = self.client.pull(self.table)
                if not np.array_equal(values, -self.sums.astype(np.float32)):
                    self.failure = (f"iteration {i} pulled {values.tolist()}, expected "
                                    f"{(-self.sums).tolist()}")
                    return
                grad = np.zeros(ROWS, dtype=np.float32)
                grad[i % ROWS] = i % 64
                self.client.push(self.table, grad)
                self.client.clock()
                self.client.wait()  # every push and clock so far acknowledged
                self.sums[i % ROWS] += i % 64
                self.acknowledged = i
        except Exception as e:  # noqa: BLE001 (reported by the test's thread)
            self.failure = f"iteration {self.acknowledged + 1}: {e!r}"

    def wait_for_more(self, n, timeout=60):
        target = self.acknowledged + n
        wait_for(lambda: self.acknowledged >= target or self.failure is not None, timeout,
                 f"{n} more acknowledged iterations (at {self.acknowledged})")
        assert self.failure is None, self.failure

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=150)
        assert not self._thread.is_alive(), "the trainer did not finish its last iteration"


def test_client_follows_killed_primaries_and_loses_or_doubles_no_acknowledged_push(
        etcd, replicated_factory):
    cluster = replicated_factory(job="pyfollow")
    wait_for(cluster.all_in_sync, 60, "a primary with its backup in sync\n" + cluster.logs())
    with leash.Client(etcd=etcd.endpoint, job="pyfollow", name="trainer",
                      connect_timeout=30) as c:
        assert c.num_shards == 1 and c.servers is None and c.etcd == [etcd.endpoint]
        w = c.create_table("w", ROWS, optimizer="sgd", lr=1.0)
        trainer = ExactSumTrainer(c, w)
        try:
            for kill in range(2):
                trainer.wait_for_more(150)
                before = cluster.primary(0)
                assert before is not None, cluster.logs()
                cluster.kill(0, before["replica"])
                # Training goes on at the backup, which etcd now names primary.
                trainer.wait_for_more(50)
                after = cluster.primary(0)
                assert after is not None and after["replica"] != before["replica"], after
                assert after["term"] > before["term"]
                # The killed replica comes back and catches up as the new backup.
                cluster.start(0, before["replica"])
                wait_for(cluster.all_in_sync, 60, "the restarted replica in sync\n" +
                         cluster.logs())
            trainer.wait_for_more(20)
        finally:
            trainer.stop()
        assert trainer.failure is None, trainer.failure + "\n" + cluster.logs()
        final = c.pull(w)
        np.testing.assert_array_equal(final, -trainer.sums.astype(np.float32))
        assert trainer.acknowledged >= 370


def test_a_job_without_primaries_raises_unavailable_naming_leashctl(etcd):
    start = time.monotonic()
    with pytest.raises(leash.UnavailableError) as e:
        leash.Client(etcd=etcd.endpoint, job="nobody", connect_timeout=1.5)
    assert time.monotonic() - start < 15, "the wait for primaries overran its timeout"
    assert "job 'nobody'" in str(e.value) and "leashctl" in str(e.value), str(e.value)
    assert "has registered" in str(e.value), str(e.value)
    assert isinstance(e.value, ConnectionError)


def test_unreachable_etcd_raises_unavailable_within_the_timeout(monkeypatch):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    start = time.monotonic()
    with pytest.raises(leash.UnavailableError) as e:
        leash.Client(etcd=url, job="lost", connect_timeout=1)
    assert time.monotonic() - start < 15, "an unreachable etcd hung the client"
    assert url in str(e.value) and "job 'lost'" in str(e.value), str(e.value)
    # The same through the environment, as leash-worker reads it.
    monkeypatch.delenv("LEASH_SERVERS", raising=False)
    monkeypatch.setenv("LEASH_ETCD", url)
    monkeypatch.setenv("LEASH_JOB", "fromenv")
    with pytest.raises(leash.UnavailableError) as e:
        leash.Client(connect_timeout=1)
    assert url in str(e.value) and "job 'fromenv'" in str(e.value), str(e.value)


def test_servers_and_etcd_are_exclusive_and_one_is_needed(monkeypatch):
    monkeypatch.delenv("LEASH_SERVERS", raising=False)
    monkeypatch.delenv("LEASH_ETCD", raising=False)
    monkeypatch.delenv("LEASH_JOB", raising=False)
    with pytest.raises(leash.InvalidArgumentError, match="exclusive"):
        leash.Client(["tcp://127.0.0.1:7000"], etcd="http://127.0.0.1:2379")
    with pytest.raises(ValueError, match="LEASH_ETCD"):
        leash.Client()
    with pytest.raises(leash.InvalidArgumentError, match="needs etcd"):
        leash.Client(["tcp://127.0.0.1:7000"], job="j")
    with pytest.raises(leash.InvalidArgumentError, match="etcd is empty"):
        leash.Client(etcd=" , ")
    with pytest.raises(leash.InvalidArgumentError, match="job must be"):
        leash.Client(etcd="http://127.0.0.1:2379", job="")
    with pytest.raises(leash.InvalidArgumentError, match="job"):
        leash.Client(etcd="http://127.0.0.1:2379", job="a/b")  # refused before any request
    monkeypatch.setenv("LEASH_SERVERS", "tcp://127.0.0.1:7000")
    monkeypatch.setenv("LEASH_ETCD", "http://127.0.0.1:2379")
    with pytest.raises(leash.InvalidArgumentError, match="both set"):
        leash.Client()

"""Signals reach a Python worker parked in a pull: Ctrl-C (SIGINT) raises
KeyboardInterrupt out of the pull and SIGTERM ends the process; either way the worker
leaves the job on its way out (the shards drop it at once, not after its lease)."""
import os
import signal
import subprocess

import leash
from conftest import wait_for

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "parked_pull.py")


def park(cluster, workers):
    """A second worker holds the minimum clock at 0, so the script's pull for clock 1 parks."""
    holder = leash.Client(cluster.servers, name="holder", staleness=0)
    p = workers.python("parker", SCRIPT, cluster.servers)
    observer = leash.Client(cluster.servers, register=False)
    wait_for(lambda: "parked" in workers.log(p) or p.poll() is not None, 30, "the pull to start")
    wait_for(lambda: observer.stats()[0]["parked_pulls"] >= 1 or p.poll() is not None, 30,
             "the shard to park the pull")
    assert p.poll() is None, workers.log(p)
    return holder, p, observer


def names(observer):
    return sorted(w["name"] for w in observer.status()["workers"])


def test_ctrl_c_interrupts_a_parked_pull_and_the_worker_leaves(cluster, workers):
    holder, p, observer = park(cluster, workers)
    assert names(observer) == ["holder", "parker"]
    p.send_signal(signal.SIGINT)
    try:
        rc = p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        raise AssertionError("SIGINT did not end the parked pull: " + workers.log(p))
    log = workers.log(p)
    assert "interrupted" in log and "KeyboardInterrupt" in log, log
    assert "pull returned" not in log
    # Python ends on an uncaught KeyboardInterrupt by re-raising SIGINT on itself, as
    # shells expect; a crash would show as SIGSEGV/SIGABRT.
    assert rc == -signal.SIGINT, log
    assert names(observer) == ["holder"]
    holder.leave()
    observer.close()


def test_sigterm_ends_a_parked_worker_which_leaves(cluster, workers):
    holder, p, observer = park(cluster, workers)
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        raise AssertionError("SIGTERM did not end the parked pull: " + workers.log(p))
    assert rc == 128 + signal.SIGTERM, workers.log(p)
    assert names(observer) == ["holder"]
    holder.leave()
    observer.close()

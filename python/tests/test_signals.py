"""Signals reach a Python worker parked in a pull: Ctrl-C (SIGINT) raises
KeyboardInterrupt out of the pull and SIGTERM ends the process; either way the worker
leaves the job on its way out (the shards drop it at once, not after its lease). Ctrl-C
also ends the waits inside the C++ client: connecting to a shard that does not answer,
and creating a table or leasing a data chunk while the shard is stopped (SIGSTOP)."""
import os
import signal
import subprocess
import time

import pytest

import leash
from conftest import free_port, wait_for

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
SCRIPT = os.path.join(SCRIPTS, "parked_pull.py")
CALL = os.path.join(SCRIPTS, "interrupted_call.py")


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


def interrupt_when_waiting(workers, p):
    """SIGINT once the script has been in its call a while; its exit status and log."""
    wait_for(lambda: "calling" in workers.log(p) or p.poll() is not None, 30, "the call")
    time.sleep(1.0)  # inside the client's wait by now (it would last minutes)
    assert p.poll() is None, workers.log(p)
    p.send_signal(signal.SIGINT)
    try:
        rc = p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        raise AssertionError("SIGINT did not end the call: " + workers.log(p))
    return rc, workers.log(p)


def test_ctrl_c_interrupts_connecting_to_a_shard_that_does_not_answer(workers):
    p = workers.python("caller", CALL, f"tcp://127.0.0.1:{free_port()}", "connect")
    rc, log = interrupt_when_waiting(workers, p)
    assert rc == 3 and "interrupted" in log and "returned" not in log, log


@pytest.mark.parametrize("call", ["create_table", "chunk"])
def test_ctrl_c_interrupts_a_call_to_a_stopped_shard(cluster, workers, call):
    p = workers.python("caller", CALL, cluster.servers, call, stdin=subprocess.PIPE)
    shard = cluster.procs[0]
    try:
        wait_for(lambda: "connected" in workers.log(p) or p.poll() is not None, 30,
                 "the client to connect")
        assert p.poll() is None, workers.log(p)
        shard.send_signal(signal.SIGSTOP)
        p.stdin.write(b"go\n")
        p.stdin.flush()
        rc, log = interrupt_when_waiting(workers, p)
        assert rc == 3 and "interrupted" in log and "returned" not in log, log
    finally:
        shard.send_signal(signal.SIGCONT)

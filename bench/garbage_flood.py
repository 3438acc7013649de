#!/usr/bin/env python3
"""The garbage flood of issue 18: one unauthenticated peer sends a shard garbage messages
as fast as it can for 20 s (leash-bench-garbage-flood); reports what the shard wrote to its
log (bytes, lines), the messages sent, the error replies the peer got and the shard's own
count of rejected requests (its final log line). Runs each given leash-server binary in
turn, on loopback, with a fresh data directory:

    python3 bench/garbage_flood.py [--seconds 20] BEFORE/leash-server build/server/leash-server
"""
import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(server, flooder, seconds):
    tmp = tempfile.mkdtemp(prefix="leash-flood-")
    try:
        port = free_port()
        endpoint = f"tcp://127.0.0.1:{port}"
        log_path = os.path.join(tmp, "shard.log")
        with open(log_path, "wb") as log:
            shard = subprocess.Popen([server, "--bind", endpoint, "--data-dir", tmp + "/d",
                                      "--checkpoint-interval", "0", "--no-sync"],
                                     stdout=log, stderr=subprocess.STDOUT)
            try:
                deadline = time.time() + 30
                while b"listening on" not in open(log_path, "rb").read():
                    if time.time() > deadline or shard.poll() is not None:
                        sys.exit(f"{server} did not start: {open(log_path).read()}")
                    time.sleep(0.05)
                before = os.path.getsize(log_path)
                out = subprocess.run([flooder, "--endpoint", endpoint, "--seconds", str(seconds)],
                                     check=True, capture_output=True, text=True).stdout
                flood = json.loads(out)
                time.sleep(1)  # the shard drains what is queued
                during = os.path.getsize(log_path) - before
            finally:
                shard.terminate()
                shard.wait(60)
        text = open(log_path, errors="replace").read()
        lines = text.count("rejected request")
        final = re.search(r"; (\d+) requests rejected", text)
        return {"server": server, "sent": flood["sent"], "replies": flood["replies"],
                "log_bytes_during_flood": during, "rejection_lines": lines,
                "rejected_counted": int(final.group(1)) if final else None,
                "seconds": seconds}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("servers", nargs="+", help="leash-server binaries to compare")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--flooder", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "build", "bench",
        "leash-bench-garbage-flood"))
    a = ap.parse_args()
    for server in a.servers:
        r = run(server, a.flooder, a.seconds)
        print(json.dumps(r))
        sys.stdout.flush()


if __name__ == "__main__":
    main()

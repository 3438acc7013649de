#!/usr/bin/env bash
# The replicated Kubernetes overlay's probe (deploy/kubernetes/overlays/replicated/
# replica-probe.sh) against real processes: etcd and two leash-server replicas of one shard on
# loopback, with CURVE keys as in the pods. A backup passes `live` and `ready` (where
# `leashctl health` fails it), a dead replica fails `live`, a primary's successor is ready,
# and while etcd hangs `live` passes (a restart would lose the log) and `ready` fails.
# Single-threaded; every process it starts is stopped by PID on exit. Exit 77 (skipped)
# without etcd.
#
#   LEASH_BUILD=build bash tests/kubernetes_replica_probe_test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(cd "${LEASH_BUILD:-build}" && pwd)
PROBE=deploy/kubernetes/overlays/replicated/replica-probe.sh
ETCD=${LEASH_ETCD_BIN:-etcd}
command -v "$ETCD" >/dev/null || { echo "SKIP: no etcd executable (LEASH_ETCD_BIN)"; exit 77; }
for b in "$BUILD/server/leash-server" "$BUILD/tools/leashctl"; do
  [[ -x $b ]] || { echo "FAIL: $b is not built"; exit 1; }
done
export PATH=$BUILD/tools:$PATH

DIR=$(mktemp -d /tmp/leash-probe-test.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
read -r P0 P1 EC EP < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(4)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')

"$ETCD" --data-dir "$DIR/etcd" --listen-client-urls "http://127.0.0.1:$EC" \
  --advertise-client-urls "http://127.0.0.1:$EC" --listen-peer-urls "http://127.0.0.1:$EP" \
  --initial-advertise-peer-urls "http://127.0.0.1:$EP" \
  --initial-cluster "default=http://127.0.0.1:$EP" >"$DIR/etcd.log" 2>&1 &
ETCD_PID=$!
PIDS+=("$ETCD_PID")
leashctl keygen "$DIR/keys" >/dev/null
# What the pods' ConfigMap gives every process.
export LEASH_CURVE_KEYS=$DIR/keys LEASH_ETCD=http://127.0.0.1:$EC LEASH_JOB=probe-test \
  LEASH_REPLICAS=2 LEASH_ETCD_TTL=2 LEASH_NUM_SHARDS=1 LEASH_LOG_LEVEL=warn
PEERS=tcp://127.0.0.1:$P0,tcp://127.0.0.1:$P1
declare -A PID
start() {  # REPLICA
  local port
  port=$([[ $1 == 0 ]] && echo "$P0" || echo "$P1")
  "$BUILD/server/leash-server" --shard 0 --replica "$1" --peers "$PEERS" \
    --bind "tcp://127.0.0.1:$port" --data-dir "$DIR/data$1" >>"$DIR/replica$1.log" 2>&1 &
  PID[$1]=$!
  PIDS+=("$!")
}
probe() {  # REPLICA MODE: the probe's exit code
  local port
  port=$([[ $1 == 0 ]] && echo "$P0" || echo "$P1")
  LEASH_PROBE_PORT=$port LEASH_PROBE_ENDPOINT=tcp://127.0.0.1:$port LEASH_PROBE_TIMEOUT=3 \
    sh "$PROBE" "$2" >"$DIR/probe.out" 2>&1 && return 0
  return 1
}
expect() {  # REPLICA MODE 0|1 WHAT
  local rc=0
  probe "$1" "$2" || rc=1
  [[ $rc == "$3" ]] || fail "$4: replica $1 '$2' exited $rc, not $3: $(cat "$DIR/probe.out")"
  echo "ok: $4 (replica $1 $2: $rc)"
}
primary() {  # the index etcd names primary, waiting up to 10 s for one
  for _ in $(seq 50); do
    local v
    v=$(leashctl --timeout 2 status 2>/dev/null || true)
    case $v in
      *"primary replica 0 at"*) echo 0; return ;;
      *"primary replica 1 at"*) echo 1; return ;;
    esac
    sleep 0.2
  done
  fail "no primary within 10 s: $(leashctl --timeout 2 status 2>&1)"
}
start 0
start 1
p=$(primary)
b=$((1 - p))
# Both hold the (short) log once the backup has acknowledged it.
for _ in $(seq 50); do probe "$b" ready && break; sleep 0.2; done
expect "$p" live 0 "the primary is live"
expect "$p" ready 0 "the primary is ready"
port=$([[ $b == 0 ]] && echo "$P0" || echo "$P1")
if LEASH_ETCD='' leashctl --servers "tcp://127.0.0.1:$port" --timeout 3 health >/dev/null 2>&1; then
  echo "note: leashctl health passes a backup now (the probe's reason for itself is gone)"
fi
expect "$b" live 0 "a backup is live (leashctl health fails it)"
expect "$b" ready 0 "an in-sync backup is ready"

kill -9 "${PID[$p]}"
wait "${PID[$p]}" 2>/dev/null || true
expect "$p" live 1 "a killed replica is not live while etcd answers"
[[ $(primary) == "$b" ]] || fail "the backup did not take over"
expect "$b" ready 0 "the new primary is ready"
start "$p"
for _ in $(seq 50); do probe "$p" ready && break; sleep 0.2; done
expect "$p" ready 0 "the restarted replica is ready once it holds the log"

kill -STOP "$ETCD_PID"
expect "$b" live 0 "while etcd hangs a replica stays live"
expect "$b" ready 1 "while etcd hangs a replica is not ready"
kill -CONT "$ETCD_PID"
echo "PASS"

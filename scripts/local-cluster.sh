#!/usr/bin/env bash
# Runs a local Leash cluster on loopback: shards and workers as separate processes,
# data under ./run/. Prints progress and test accuracy; stops every process it started
# at the end, also on Ctrl-C.
#
#   scripts/local-cluster.sh [extra leash-worker flags]
# Environment: LEASH_SHARDS (2), LEASH_WORKERS (2), LEASH_EPOCHS (3), LEASH_STALENESS (2),
#   LEASH_BASE_PORT (7000), LEASH_RUN_DIR (./run), LEASH_KEEP_STATE=1 to resume from the
#   shards' snapshots instead of starting fresh, LEASH_BUILD_DIR (build).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${LEASH_BUILD_DIR:-build}
RUN=${LEASH_RUN_DIR:-./run}
SHARDS=${LEASH_SHARDS:-2}
WORKERS=${LEASH_WORKERS:-2}
EPOCHS=${LEASH_EPOCHS:-3}
STALENESS=${LEASH_STALENESS:-2}
BASE_PORT=${LEASH_BASE_PORT:-7000}

SERVER="$BUILD/server/leash-server"
WORKER="$BUILD/worker/leash-worker"
CTL="$BUILD/tools/leashctl"
for bin in "$SERVER" "$WORKER" "$CTL"; do
  [[ -x "$bin" ]] || { echo "leash: $bin is not built; run scripts/build.sh first" >&2; exit 1; }
done

mkdir -p "$RUN/logs"
if [[ "${LEASH_KEEP_STATE:-0}" != 1 ]]; then rm -rf "$RUN"/shard*; fi

servers=""
for ((i = 0; i < SHARDS; i++)); do
  servers+="${servers:+,}tcp://127.0.0.1:$((BASE_PORT + i))"
done

shard_pids=()
worker_pids=()
cleanup() {
  trap - INT TERM EXIT
  for p in "${worker_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${worker_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for p in "${shard_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${shard_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  echo "leash: all processes stopped; shard data in $RUN/shard*, logs in $RUN/logs"
}
trap cleanup EXIT
trap 'echo; echo "leash: interrupted, stopping the cluster"; exit 130' INT TERM

for ((i = 0; i < SHARDS; i++)); do
  "$SERVER" --shard="$i" --num-shards="$SHARDS" --bind="tcp://127.0.0.1:$((BASE_PORT + i))" \
    --data-dir="$RUN/shard$i" --checkpoint-interval=30s >"$RUN/logs/shard$i.log" 2>&1 &
  shard_pids+=($!)
done
if ! "$CTL" --servers="$servers" --timeout=15 status >/dev/null; then
  echo "leash: shards did not come up; see $RUN/logs/shard*.log" >&2
  tail -n 5 "$RUN"/logs/shard*.log >&2
  exit 1
fi
echo "leash: $SHARDS shards up at $servers (data in $RUN/shard*)"

for ((i = 0; i < WORKERS; i++)); do
  "$WORKER" --servers="$servers" --name="worker$i" --epochs="$EPOCHS" \
    --staleness="$STALENESS" --metrics-out="$RUN/worker$i.json" "$@" 2>"$RUN/logs/worker$i.log" &
  worker_pids+=($!)
done
echo "leash: $WORKERS workers training (staleness $STALENESS, $EPOCHS epochs); logs in $RUN/logs"

status=0
for p in "${worker_pids[@]}"; do wait "$p" || status=$?; done
worker_pids=()
if ((status != 0)); then
  echo "leash: a worker failed (exit $status); see $RUN/logs/worker*.log" >&2
  tail -n 5 "$RUN"/logs/worker*.log >&2
  exit "$status"
fi
"$CTL" --servers="$servers" status || true
acc=$(grep -o '"test_accuracy": [0-9.]*' "$RUN/worker0.json" | tail -n 1 | awk '{printf "%.2f", $2 * 100}')
echo "leash: done. Final test accuracy of the trained model: ${acc}%"

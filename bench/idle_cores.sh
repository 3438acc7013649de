#!/bin/bash
# The measurements that a 2-core machine cannot make, in one go on a machine with idle cores
# (a lent GPU machine: 16 cores, one call of at most 10 minutes). Each part has its own time
# limit, so a slow part cannot take the others' time, and each writes its results as it ends:
#   1. the persistent 3x straggler, MLP (bench/straggler_bench.py): BSP, work in proportion
#      to speed at s=0 (also with the shard at --update-threads 4: its updates, and the pull
#      replies a clock releases, written together into the workers' rings, shared), one
#      backup worker, and the workers' solo speeds alone (issue 17's 0.9x-of-the-solo-sum
#      target);
#   1b. straggler_cnn_ut: the CNN's BSP, proportional work at s=0 and the same with the shard
#      at --update-threads 4 (its 3136 x 128 layer's updates shared: part of the s=0 clock's
#      turnaround), and the solo speeds;
#   1c. straggler_control: the same 3 + 1 MLP with equal workers beside the 3x straggler, in
#      the same rounds (bench/straggler_control.py, 3 epochs): BSP and proportional work at
#      s=0 over each one's solo sum, and the time each worker waits at the clock (whether the
#      fast workers wait for the slow one, or every worker for the shard);
#   2. 4 MB requests over one connection against two (bench/stripes.py; issue 19's 1.5x
#      target and striping's default);
#   3. R=2 against R=1 (bench/replication.py --only cost), where etcd is installed (issue 16),
#      R=2 with backups that answer (--backup-answers) beside them, and again with every shard at --update-threads UPDATE_THREADS (replication_ut: the
#      backup's serial update of a 4 MB push shared among threads), and once more with that
#      and no shared memory anywhere (replication_socket: the worker, the primary and the
#      backup talk over loopback TCP as they would between hosts, so the backup's copy out
#      of the primary's ring becomes its I/O thread's receive, beside its update);
#   4. leash-server --update-threads N against 1 (bench/server_ab.py), 1 and 4 MB pushes and
#      pulls over the socket and shared memory: the threads shared by a large update, its NaN
#      check and a reply's copy into a same-host ring, slower on 2 cores, never measured with
#      idle cores;
#   5. 4 MB at 8 in flight against the loopback wire (bench/wire_ceiling.py, where iperf3 is
#      installed or bundled): push, pull and pull in place over one connection and 2 stripes,
#      raw ZeroMQ one-way, iperf3's TCP ceiling, and each one's CPU per request (issue 19);
#   6. every socket target of issue 19 round by round (bench/net_targets.py: 4 KB and 256 KB
#      at 1 in flight, 4 MB at 8; push, pull and pull in place against the raw rows).
# Usage: bash bench/idle_cores.sh [BUILD_DIR] [OUT_DIR]     (QUICK=1: a smoke run of each part)
# Each part's time limit and rounds: STRAGGLER_S, STRAGGLER_ROUNDS, STRIPES_S, STRIPES_ROUNDS,
# STRIPES_N, CONTROL_ROUNDS, REPLICATION_S, REPLICATION_ROUNDS, UPDATE_S, UPDATE_ROUNDS, UPDATE_THREADS, WIRE_S,
# WIRE_ROUNDS, NET_S, NET_ROUNDS; PYTHON: the interpreter (numpy; /usr/bin/python3). PARTS: the parts to run,
# comma-separated (default straggler,straggler_cnn_ut,straggler_control,stripes,replication,replication_ut,
# replication_socket,update_threads,wire_ceiling,net_targets; their limits add up to more than one 10-minute call, so a lent
# machine takes them in two or three).
# On a machine without Leash's Debian packages, carry a bundle (bench/bundle.sh) and run this
# through bench/unbundle.sh, e.g. `bash bench/unbundle.sh B.tar.xz /tmp/leash bash -c
# 'PYTHON=python3 bash bench/idle_cores.sh "$LEASH_BUILD" OUT'`; the Fashion-MNIST files must
# be at /usr/share/datasets/fashion-mnist (apt-get install dataset-fashion-mnist, or copied).
set -u
B=${1:-build}; OUT=${2:-${OUT:-/tmp/leash-idle-cores}}
cd "$(dirname "$0")/.."
for exe in server/leash-server worker/leash-worker bench/leash-bench-pushpull; do
  [ -x "$B/$exe" ] || { echo "$B/$exe not found: build first (bash scripts/build.sh)" >&2; exit 2; }
done
PY=${PYTHON:-/usr/bin/python3}; [ -x "$PY" ] || PY=python3
mkdir -p "$OUT"
quick=(); [ "${QUICK:-0}" = 1 ] && quick=(--quick)
{ echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"; echo "cores: $(nproc)"; echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"; } | tee "$OUT/machine.txt"

PARTS=",${PARTS:-straggler,straggler_cnn_ut,straggler_control,stripes,replication,replication_ut,replication_socket,update_threads,wire_ceiling,net_targets},"
part() {  # name seconds command...: runs it with a time limit, its output in OUT/name.log
  local name=$1 limit=$2; shift 2
  [[ $PARTS == *",$name,"* ]] || { echo "$name: not in PARTS" | tee -a "$OUT/machine.txt"; return; }
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc after $((SECONDS - start)) s (limit $limit s), load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$OUT/machine.txt"
  [ $rc -eq 124 ] && echo "  $name ran out of time: what it wrote so far is in $OUT/$name" | tee -a "$OUT/machine.txt"
  tail -5 "$OUT/$name.log"
}

part straggler "${STRAGGLER_S:-300}" "$PY" bench/straggler_bench.py --build "$B" --out "$OUT/straggler" \
  --rounds "${STRAGGLER_ROUNDS:-2}" "${quick[@]}" --only persistent/mlp/bsp,persistent/mlp/proportional,persistent/mlp/backup,persistent/mlp/solo_alone \
  --modes bsp,proportional_s0,proportional_s0_ut4,backup
part straggler_cnn_ut "${STRAGGLER_S:-300}" "$PY" bench/straggler_bench.py --build "$B" --out "$OUT/straggler_cnn_ut" \
  --rounds "${STRAGGLER_ROUNDS:-2}" "${quick[@]}" --only persistent/cnn/bsp,persistent/cnn/proportional_s0,persistent/cnn/solo_alone \
  --modes bsp,proportional_s0,proportional_s0_ut4
part straggler_control "${STRAGGLER_S:-300}" "$PY" bench/straggler_control.py --build "$B" \
  --out "$OUT/straggler_control" --models mlp --rounds "$([ "${QUICK:-0}" = 1 ] && echo 1 || echo "${CONTROL_ROUNDS:-3}")" \
  --epochs "$([ "${QUICK:-0}" = 1 ] && echo 1 || echo 3)"
part stripes "${STRIPES_S:-120}" "$PY" bench/stripes.py --build "$B" --out "$OUT/stripes" --rounds "${STRIPES_ROUNDS:-1}" --stripes "${STRIPES_N:-2}" \
  --seconds "$([ "${QUICK:-0}" = 1 ] && echo 0.5 || echo "${STRIPES_SECONDS:-2}")"
if command -v etcd >/dev/null; then
  part replication "${REPLICATION_S:-200}" "$PY" bench/replication.py --build "$B" --out "$OUT/replication" \
    --only cost --rounds "${REPLICATION_ROUNDS:-1}" --answers
  part replication_ut "${REPLICATION_S:-150}" "$PY" bench/replication.py --build "$B" --out "$OUT/replication_ut" \
    --only cost --rounds "${REPLICATION_ROUNDS:-1}" --shard-args="--update-threads ${UPDATE_THREADS:-4}"
  part replication_socket "${REPLICATION_S:-150}" "$PY" bench/replication.py --build "$B" --out "$OUT/replication_socket" \
    --only cost --rounds "${REPLICATION_ROUNDS:-1}" --shard-args="--no-shm --update-threads ${UPDATE_THREADS:-4}"
else
  echo "replication: skipped, no etcd here (apt-get install etcd-server)" | tee -a "$OUT/machine.txt"
fi
# Part 4's two servers: the same executable with --update-threads 1 and N.
srv=$(cd "$B/server" && pwd)/leash-server
for t in 1 "${UPDATE_THREADS:-4}"; do
  printf '#!/bin/sh\nexec %s --update-threads %s "$@"\n' "$srv" "$t" >"$OUT/server-ut$t.sh"
  chmod +x "$OUT/server-ut$t.sh"
done
part update_threads "${UPDATE_S:-200}" "$PY" bench/server_ab.py --a "$OUT/server-ut1.sh" \
  --b "$OUT/server-ut${UPDATE_THREADS:-4}.sh" --bench "$B/bench/leash-bench-pushpull" --ops push,pull \
  --modes socket,shm --sizes 262144,1048576 --inflight 1,8 \
  --rounds "$([ "${QUICK:-0}" = 1 ] && echo 1 || echo "${UPDATE_ROUNDS:-3}")" \
  --name update_threads_ab --out "$OUT/update_threads"
if command -v iperf3 >/dev/null; then
  part wire_ceiling "${WIRE_S:-150}" "$PY" bench/wire_ceiling.py --bench "$B/bench/leash-bench-pushpull" \
    --server "$srv" --modes socket,striped2 --streams 1,2,4 --out "$OUT/wire_ceiling" \
    --rounds "$([ "${QUICK:-0}" = 1 ] && echo 1 || echo "${WIRE_ROUNDS:-3}")" --seconds "$([ "${QUICK:-0}" = 1 ] && echo 0.5 || echo 1)"
else
  echo "wire_ceiling: skipped, no iperf3 here (apt-get install iperf3, or bundle it)" | tee -a "$OUT/machine.txt"
fi
part net_targets "${NET_S:-150}" "$PY" bench/net_targets.py --build "$B" --out "$OUT/net_targets" \
  --rounds "$([ "${QUICK:-0}" = 1 ] && echo 1 || echo "${NET_ROUNDS:-5}")" --seconds "$([ "${QUICK:-0}" = 1 ] && echo 0.3 || echo 1)"
echo "results under $OUT"

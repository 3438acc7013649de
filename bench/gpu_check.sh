#!/bin/bash
# GPU checks of a Leash build on a machine with an NVIDIA GPU: the gpu-labelled tests (CUDA
# kernels against their CPU twins), then training throughput on the GPU against the CPU, in
# local mode and in a cluster of one shard and 1/2/4/8 GPU workers sharing the GPU.
# Usage: bash bench/gpu_check.sh [BUILD_DIR] [DATA_DIR] [OUT_DIR]
# Prints one JSON line per run; results in bench/results/GPU.md were taken with it.
set -u
B=${1:-build}; D=${2:-/usr/share/datasets/fashion-mnist}; OUT=${3:-/tmp/leash-gpu}
BIN_W=$(find "$B" -name leash-worker -type f | head -1); BIN_S=$(find "$B" -name leash-server -type f | head -1)
[ -x "$BIN_W" ] && [ -x "$BIN_S" ] || { echo "no leash-worker/leash-server under $B: build first (bash scripts/build.sh)" >&2; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "no NVIDIA GPU here (nvidia-smi missing)" >&2; exit 2; }
mkdir -p "$OUT"
for t in cuda_kernels_test cuda_conv_test cnn_cuda_test; do
  f=$(find "$B" -name $t -type f | head -1)
  [ -n "$f" ] && { "$f" --gtest_brief=1 2>&1 | tail -3 || echo "$t FAILED"; }
done
summary() {  # name wall_ms metric files...: samples/s over the slowest worker's training time
  python3 - "$@" <<'PY'
import json, sys
name, wall = sys.argv[1], int(sys.argv[2])
ws = [w for w in (json.load(open(f)) for f in sys.argv[3:]) if w.get('epochs')]
if not ws: print(json.dumps({'run': name, 'failed': True})); sys.exit()
samples = sum(e['samples'] for w in ws for e in w['epochs'])
train = max(sum(e['train_seconds'] for e in w['epochs']) for w in ws)
print(json.dumps({'run': name, 'wall_ms': wall, 'samples': samples,
                  'samples_per_s': round(samples / train),
                  'per_epoch_samples_per_s': [round(e['samples_per_second']) for e in ws[0]['epochs']],
                  'test_accuracy': ws[0]['epochs'][-1].get('test_accuracy')}))
PY
}
local_run() {  # name device model threads epochs [flags]
  local s=$(date +%s%N)
  "$BIN_W" --local --device $2 --model $3 --threads $4 --epochs $5 ${6:-} --data "$D" --metrics-out "$OUT/$1.json" >"$OUT/$1.log" 2>&1
  summary $1 $(( ($(date +%s%N) - s) / 1000000 )) "$OUT/$1.json"
}
cluster() {  # name workers model lr
  rm -rf "$OUT/shard"; "$BIN_S" --bind tcp://127.0.0.1:7000 --data-dir "$OUT/shard" --checkpoint-interval 0 >"$OUT/$1.server.log" 2>&1 & local sp=$!
  sleep 0.5; local pids="" files="" s=$(date +%s%N)
  for i in $(seq 1 $2); do
    "$BIN_W" --servers tcp://127.0.0.1:7000 --device cuda:0 --model $3 --staleness 1 --lr $4 --epochs 3 --data "$D" --name w$i --metrics-out "$OUT/$1.w$i.json" >"$OUT/$1.w$i.log" 2>&1 & pids="$pids $!"; files="$files $OUT/$1.w$i.json"
  done
  wait $pids; summary $1 $(( ($(date +%s%N) - s) / 1000000 )) $files
  kill $sp; wait $sp 2>/dev/null
}
# the CPU runs train 10,000 samples once: the CNN runs ~1k samples/s on a CPU
for m in mlp cnn; do local_run local_${m}_gpu cuda:0 $m 1 3; local_run local_${m}_cpu cpu $m "$(nproc)" 1 "--train-limit 10000"; done
# --lr 0.01 (the default) divided by the workers: each worker's push is one update (see GPU.md)
for m in mlp cnn; do for w in 1 2 4 8; do cluster cluster_${m}_gpu_w$w $w $m $(python3 -c "print(0.01/$w)"); done; done

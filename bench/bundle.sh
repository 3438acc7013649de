#!/bin/bash
# Packs a build's executables, stripped, with the shared libraries they need into one tar.xz, to
# run the benchmarks (bench/idle_cores.sh, bench/gpu_check.sh) on a machine without Leash's
# Debian packages, such as a lent GPU machine. Left out: glibc (the other machine's must be as
# new as this one's) and CUDA's libraries (cudart, cuBLAS, cuDNN: the other machine's CUDA 13).
# etcd and iperf3 are packed when installed (bench/replication.py needs etcd,
# bench/wire_ceiling.py iperf3).
# Usage: bash bench/bundle.sh [BUILD_DIR] [OUT.tar.xz]
# There: bash bench/unbundle.sh OUT.tar.xz DIR COMMAND... (unpacks, sets the loader's path and
#        LEASH_BUILD=DIR/build, checks every executable's libraries, runs COMMAND).
set -euo pipefail
B=${1:-build}; OUT=${2:-leash-bundle.tar.xz}
cd "$(dirname "$0")/.."
exes=(server/leash-server worker/leash-worker tools/leashctl bench/leash-bench-pushpull
      bench/leash-bench-failover bench/leash-bench-crosscore bench/leash-bench-backup-load kernels/cuda_kernels_test kernels/cuda_conv_test worker/cnn_cuda_test)
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build" "$stage/lib" "$stage/bin"
for e in "${exes[@]}"; do
  [ -x "$B/$e" ] || { [[ $e == *cuda* ]] && continue; echo "$B/$e not found: build first (bash scripts/build.sh)" >&2; exit 2; }
  mkdir -p "$stage/build/$(dirname "$e")"
  strip -o "$stage/build/$e" "$B/$e"
  ldd "$B/$e" | awk '$3 ~ /^\// {print $3}' >>"$stage/libs"
done
if command -v iperf3 >/dev/null; then
  cp -L "$(command -v iperf3)" "$stage/bin/"
  ldd "$(command -v iperf3)" | awk '$3 ~ /^\// {print $3}' >>"$stage/libs"
fi
# glibc's own libraries and the loader stay the other machine's; CUDA's come from its toolkit
sort -u "$stage/libs" | grep -v -E '/(libc|libm|libdl|libpthread|librt|libresolv|libutil)\.so|/cuda' |
  while read -r l; do cp -L "$l" "$stage/lib/"; done
command -v etcd >/dev/null && cp -L "$(command -v etcd)" "$stage/bin/"
tar -C "$stage" --exclude=libs -cJf "$OUT" build lib bin
echo "$OUT: $(du -h "$OUT" | cut -f1) ($(ls "$stage/lib" | wc -l) libraries)"

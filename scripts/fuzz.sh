#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang into ${LEASH_BUILD_DIR:-build-fuzz}
# (CUDA off, tests off, LEASH_FUZZ=ON) and runs each for a bounded time:
#   scripts/fuzz.sh [seconds-per-target] [target...]      (default 60 s; fuzz_wire fuzz_shard
#   fuzz_stripes fuzz_shm_record)
# Each target starts from its committed seeds (fuzz/corpus/<target>/) plus what earlier
# runs found (the working corpus $BUILD/corpus/<target>/, never committed) and uses
# fuzz/<target>.dict when present. libFuzzer's final stats (executions, cov, ft) are
# printed per target. A crash, leak, timeout or out-of-memory fails the script; the input
# that caused it is saved under $BUILD/crashes/<target>/ (reproduce: $BUILD/fuzz/<target> FILE).
# LEASH_FUZZ_JOBS: build parallelism (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECONDS_PER_TARGET=${1:-60}
shift || true
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(fuzz_wire fuzz_shard fuzz_stripes fuzz_shm_record)
BUILD=${LEASH_BUILD_DIR:-build-fuzz}
bash "$ROOT/scripts/install-deps.sh" fuzz
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)

cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DLEASH_FUZZ=ON -DLEASH_WITH_CUDA=OFF -DLEASH_BUILD_TESTS=OFF "${LAUNCHER[@]}" >/dev/null
cmake --build "$BUILD" -j "${LEASH_FUZZ_JOBS:-$(nproc)}" --target "${TARGETS[@]}"

failed=()
for t in "${TARGETS[@]}"; do
  corpus="$ROOT/$BUILD/corpus/$t"
  crashes="$ROOT/$BUILD/crashes/$t"
  mkdir -p "$corpus" "$crashes"
  args=(-max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048
        -max_len=4096 -artifact_prefix="$crashes/")
  [[ -f fuzz/$t.dict ]] && args+=(-dict="fuzz/$t.dict")
  log="$ROOT/$BUILD/$t.log"
  echo "=== $t: ${SECONDS_PER_TARGET} s (log: $log)"
  if "$BUILD/fuzz/$t" "${args[@]}" "$corpus" "fuzz/corpus/$t" >"$log" 2>&1; then
    rc=0
  else
    rc=$?
  fi
  grep -E '^(stat::|Done )' "$log" || true
  # The last coverage line libFuzzer printed: "#N <event> cov: C ft: F corp: ..."
  grep -E '^#[0-9]+' "$log" | tail -1 || true
  if ((rc != 0)); then
    echo "!!! $t failed (exit $rc):"
    grep -E 'ERROR|invariant broken|SUMMARY|Test unit written|^    #[0-9]' "$log" | head -40 || true
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz.sh: FAILED: ${failed[*]} (inputs in $BUILD/crashes/)"
  exit 1
fi
echo "fuzz.sh: no crash in ${TARGETS[*]} (${SECONDS_PER_TARGET} s each)"

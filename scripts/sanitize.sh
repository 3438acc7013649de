#!/usr/bin/env bash
# The unit, integration and fault suites under AddressSanitizer (with LeakSanitizer) and
# UndefinedBehaviorSanitizer. Builds into ${LEASH_BUILD_DIR:-build-asan} with CUDA off and
# -DLEASH_SANITIZE=address,undefined (which compiles with -fno-sanitize-recover=all, so any
# UB report aborts) at -O1 -g1 (line tables, enough for the reports' stack traces; the
# heaviest test file compiles in 23 s instead of 55 s at -O2 -g), without the benchmarks (no
# test needs them: -DLEASH_BUILD_BENCH=OFF), then runs ctest on the
# labels unit, integration and fault (never gpu, docker or soak). Every sanitizer report,
# also from the leash-server/leash-worker processes the integration tests start, is
# written to $BUILD/sanitizer-logs/ and printed at the end; any report fails the run
# (exit 1), as does any failing test. Extra arguments go to ctest (e.g. -R ShardTest).
# LEASH_JOBS / LEASH_TEST_JOBS: build and test parallelism (default: nproc and 2).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${LEASH_BUILD_DIR:-build-asan}
JOBS=${LEASH_JOBS:-$(nproc)}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)

t0=$(date +%s)
cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLEASH_WITH_CUDA=OFF \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DLEASH_SANITIZE=address,undefined -DLEASH_BUILD_TESTS=ON -DLEASH_BUILD_BENCH=OFF \
  "${LAUNCHER[@]}" >/dev/null
cmake --build "$BUILD" -j "$JOBS"
t1=$(date +%s)

LOGS="$ROOT/$BUILD/sanitizer-logs"
rm -rf "$LOGS"
mkdir -p "$LOGS"
# detect_leaks: LeakSanitizer works in this environment (it needs ptrace-like access to
# stop the threads; a container without it would print "LeakSanitizer has encountered a
# fatal error", then set LEASH_DETECT_LEAKS=0).
export ASAN_OPTIONS="detect_leaks=${LEASH_DETECT_LEAKS:-1}:halt_on_error=1:abort_on_error=0:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1:log_path=$LOGS/asan:log_exe_name=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$LOGS/ubsan:log_exe_name=1"

status=0
(cd "$BUILD" && ctest --output-on-failure --timeout 900 -j "${LEASH_TEST_JOBS:-2}" \
  -L 'unit|integration|fault' -LE 'gpu|docker|soak' "$@") || status=$?
t2=$(date +%s)

reports=$(find "$LOGS" -type f | sort)
if [[ -n "$reports" ]]; then
  echo "=== sanitizer reports ==="
  for f in $reports; do
    echo "--- $f"
    cat "$f"
  done
  status=1
fi
echo "sanitize.sh: build $((t1 - t0)) s, tests $((t2 - t1)) s, $(echo "$reports" | grep -c . || true) sanitizer report(s), exit $status"
exit $status

#!/usr/bin/env bash
# Configures and builds Leash into ${LEASH_BUILD_DIR:-build}. Extra arguments go to cmake,
# e.g. scripts/build.sh -DLEASH_WITH_CUDA=OFF or -DLEASH_SANITIZE=address,undefined.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${LEASH_BUILD_DIR:-build}
JOBS=${LEASH_JOBS:-$(nproc)}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
elif (($# > 0)); then
  cmake "$BUILD" "$@"
fi
cmake --build "$BUILD" -j "$JOBS"

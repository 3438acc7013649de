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
# Editors and clangd look for compile_commands.json at the repository root (gitignored);
# CMake writes it into the build folder (CMAKE_EXPORT_COMPILE_COMMANDS). The default build
# owns the link; another build folder (sanitizers, fuzzing) only makes one where none is.
if [[ -f "$BUILD/compile_commands.json" && ("$BUILD" == build || ! -e compile_commands.json) ]]; then
  ln -sfn "$BUILD/compile_commands.json" compile_commands.json
fi

#!/usr/bin/env bash
# Runs the whole Leash benchmark suite (bench/run_all.py): builds the binaries it needs
# into ${LEASH_BUILD_DIR:-build} first, installs the TensorFlow peer's venv on first use
# (bench/setup-tf.sh). Arguments go to run_all.py, e.g. --quick for a smoke run.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${LEASH_BUILD_DIR:-build}
# The build's packages and the Python peers' (Debian's PyTorch, numpy, matplotlib);
# LEASH_SKIP_APT=1 skips this.
bash scripts/install-deps.sh bench
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLEASH_WITH_CUDA=OFF
fi
cmake --build "$BUILD" -j "${LEASH_JOBS:-$(nproc)}" --target leash-server leash-worker leash-bench-pushpull
exec /usr/bin/python3 bench/run_all.py --build "$BUILD" "$@"

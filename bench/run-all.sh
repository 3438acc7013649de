#!/usr/bin/env bash
# Runs the whole Leash benchmark suite (bench/run_all.py): builds the binaries it needs
# into ${LEASH_BUILD_DIR:-build} first, installs the TensorFlow peer's venv on first use
# (bench/setup-tf.sh). Arguments go to run_all.py, e.g. --quick for a smoke run.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${LEASH_BUILD_DIR:-build}
# The build's packages, then the Python peers' (Debian's PyTorch on OpenBLAS, numpy,
# matplotlib for the plots) under /usr/bin/python3; LEASH_SKIP_APT=1 skips both.
bash scripts/install-deps.sh
if [[ "${LEASH_SKIP_APT:-0}" != 1 ]] && ! /usr/bin/python3 -c 'import torch, numpy, matplotlib' 2>/dev/null; then
  SUDO=""
  [[ $(id -u) != 0 ]] && SUDO=sudo
  echo "leash bench: installing python3-torch python3-numpy python3-matplotlib"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    python3-torch python3-numpy python3-matplotlib
fi
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLEASH_WITH_CUDA=OFF
fi
cmake --build "$BUILD" -j "${LEASH_JOBS:-$(nproc)}" --target leash-server leash-worker leash-bench-pushpull
exec /usr/bin/python3 bench/run_all.py --build "$BUILD" "$@"

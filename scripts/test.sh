#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, and runs every ctest test:
# unit, integration and fault tests, and gpu tests (which skip themselves where no GPU
# exists). The longer ones run on request: `scripts/test.sh -L soak` (a few minutes of
# workers and a shard killed and restarted) and `scripts/test.sh -L docker` (builds
# images, runs a compose cluster; several minutes, needs root). Extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
cd "${LEASH_BUILD_DIR:-build}"
if (($# == 0)); then set -- -LE "docker|soak"; fi
ctest --output-on-failure --timeout 900 -j "${LEASH_TEST_JOBS:-2}" "$@"

#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, and runs every ctest test
# (unit, integration, and gpu tests, which skip themselves where no GPU exists).
# Extra arguments go to ctest, e.g. scripts/test.sh -L unit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
cd "${LEASH_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 600 -j "${LEASH_TEST_JOBS:-2}" "$@"

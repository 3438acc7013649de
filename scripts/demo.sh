#!/usr/bin/env bash
# One command from a fresh Debian machine: installs the packages, builds Leash, and
# trains Fashion-MNIST on a local cluster of 2 shards and 2 workers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
exec bash scripts/local-cluster.sh "$@"

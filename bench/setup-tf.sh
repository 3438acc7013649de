#!/usr/bin/env bash
# Installs the TensorFlow peer of the training benchmark: a venv that sees Debian's
# numpy (and torch) with tensorflow-cpu pinned from PyPI. Idempotent; prints the venv's
# python on success. LEASH_BENCH_VENV picks the directory (default /opt/leash-bench-venv).
set -euo pipefail
VENV=${LEASH_BENCH_VENV:-/opt/leash-bench-venv}
TF_VERSION=2.15.1   # the last release with Keras 2 (ParameterServerStrategy + custom loop)
if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import tensorflow as tf, sys; sys.exit(tf.__version__ != '$TF_VERSION')" 2>/dev/null; then
  echo "$VENV/bin/python"
  exit 0
fi
/usr/bin/python3 -m venv --system-site-packages "$VENV" >&2
"$VENV/bin/pip" install --quiet "tensorflow-cpu==$TF_VERSION" >&2
"$VENV/bin/python" -c "import tensorflow as tf; print('tensorflow', tf.__version__)" >&2
echo "$VENV/bin/python"

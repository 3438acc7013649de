#!/usr/bin/env bash
# Makes the Python package `leash` importable after the build (scripts/build.sh), without
# touching Debian's externally-managed Python:
#   bash scripts/install-python.sh            creates ./.venv (a venv over /usr/bin/python3
#                                             with --system-site-packages, so Debian's numpy
#                                             and torch are seen) and puts build/python on
#                                             its path; then: .venv/bin/python train.py
#   bash scripts/install-python.sh DIR        the same venv in DIR
#   bash scripts/install-python.sh --user     no venv: a leash.pth in the user site-packages
#                                             of /usr/bin/python3 (plain python3 imports it)
# The package stays in the build folder (a .pth file names it), so a rebuild updates it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=$(cd "${LEASH_BUILD_DIR:-build}" 2>/dev/null && pwd) || {
  echo "leash: no build folder; run scripts/build.sh first" >&2
  exit 1
}
PY=${LEASH_PYTHON:-/usr/bin/python3}
if ! ls "$BUILD"/python/leash/_leash*.so >/dev/null 2>&1; then
  echo "leash: $BUILD/python/leash has no extension module; build with python3-pybind11" \
       "installed (scripts/install-deps.sh, then scripts/build.sh)" >&2
  exit 1
fi
if [[ "${1:-}" == --user ]]; then
  SITE=$("$PY" -m site --user-site)
else
  VENV=${1:-$ROOT/.venv}
  [[ -x "$VENV/bin/python" ]] || "$PY" -m venv --system-site-packages --without-pip "$VENV"
  PY="$VENV/bin/python"
  SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
fi
mkdir -p "$SITE"
echo "$BUILD/python" >"$SITE/leash.pth"
"$PY" -c 'import leash; print("leash", leash.__version__, "from", leash.__file__)'
echo "leash: use $PY"

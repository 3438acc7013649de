#!/usr/bin/env bash
# Installs MovieLens-100k (the click-through model's data, leash-worker --model ctr) from
# the RecBole 1.2.1 wheel: `pip download` through this machine's own pip configuration,
# then recbole/dataset_example/ml-100k/ml-100k.{inter,user,item} extracted into
# $LEASH_DATASETS/ml-100k (default /usr/local/share/leash/datasets/ml-100k) and checked
# against their sha256. Idempotent: does nothing when the checked files are there.
# Run at install time (scripts/install-deps.sh runs it); nothing is downloaded at run time.
set -euo pipefail

DEST="${LEASH_DATASETS:-/usr/local/share/leash/datasets}/ml-100k"
declare -A SHA256=(
  [ml-100k.inter]=4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff
  [ml-100k.user]=4f670007d9cfbeb9807e757209af1555b9bcc186bde25e767f67cb67c6dd5972
  [ml-100k.item]=51d7cdf777ce5c0f5b32c1d947a4a81fe07d75e78abbe761e0cd4d0756064532
)

verify() {  # verify DIR: every file present with its checksum
  local f
  for f in "${!SHA256[@]}"; do
    [[ -f "$1/$f" ]] || return 1
    echo "${SHA256[$f]}  $1/$f" | sha256sum --check --status || return 1
  done
}

if verify "$DEST"; then
  echo "leash: MovieLens-100k is installed in $DEST"
  exit 0
fi

PYTHON=/usr/bin/python3
command -v "$PYTHON" >/dev/null || PYTHON=python3
if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
  SUDO=""
  [[ $(id -u) != 0 ]] && SUDO=sudo
  echo "leash: installing python3-pip to fetch MovieLens-100k"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-pip
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "leash: fetching MovieLens-100k (inside the recbole 1.2.1 wheel)"
"$PYTHON" -m pip download --quiet --no-deps --dest "$tmp" recbole==1.2.1
wheel=$(ls "$tmp"/recbole-1.2.1-*.whl)
"$PYTHON" - "$wheel" "$tmp/ml-100k" <<'PY'
import sys, zipfile, os
wheel, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    for ext in ("inter", "user", "item"):
        name = f"recbole/dataset_example/ml-100k/ml-100k.{ext}"
        with z.open(name) as src, open(os.path.join(out, f"ml-100k.{ext}"), "wb") as dst:
            dst.write(src.read())
PY
if ! verify "$tmp/ml-100k"; then
  echo "leash: the MovieLens-100k files in $wheel do not match their sha256; not installed" >&2
  exit 1
fi
SUDO=""
if ! mkdir -p "$DEST" 2>/dev/null || [[ ! -w "$DEST" ]]; then SUDO=sudo; $SUDO mkdir -p "$DEST"; fi
$SUDO install -m 0644 "$tmp"/ml-100k/ml-100k.{inter,user,item} "$DEST"/
echo "leash: MovieLens-100k installed in $DEST"

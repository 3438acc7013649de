#!/bin/bash
# The other half of bench/bundle.sh: on a machine without Leash's Debian packages (a lent GPU
# machine, say), unpacks a bundle, points the loader at its libraries and at the machine's
# CUDA 13 (cudart, cuBLAS and cuDNN, looked up under /usr/local/cuda*, /opt and /usr/lib), checks
# that every executable finds what it links, then runs COMMAND with LEASH_BUILD set to the
# bundle's build directory and etcd on the PATH. Exits 3, saying what is missing, if the check
# fails. Usage, from the repository's root:
#   bash bench/unbundle.sh BUNDLE.tar.xz DIR COMMAND...
#   e.g. bash bench/unbundle.sh leash-bundle.tar.xz /tmp/leash bash -c \
#          'PYTHON=python3 bash bench/idle_cores.sh "$LEASH_BUILD" /tmp/out'
set -u
[ $# -ge 3 ] || { echo "usage: bash bench/unbundle.sh BUNDLE.tar.xz DIR COMMAND..." >&2; exit 2; }
bundle=$1 dir=$2; shift 2
mkdir -p "$dir" && tar -C "$dir" -xJf "$bundle" || { echo "cannot unpack $bundle into $dir" >&2; exit 2; }
cuda=""
for l in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9; do
  f=$(find /usr/local/cuda*/ /opt /usr/lib -name "$l" 2>/dev/null | head -1)
  [ -n "$f" ] && case ":$cuda:" in *":$(dirname "$f"):"*) ;; *) cuda="$cuda:$(dirname "$f")" ;; esac
done
export LD_LIBRARY_PATH="$dir/lib$cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$dir/bin:$PATH" LEASH_BUILD="$dir/build"
[ -x "$dir/bin/etcd" ] && export LEASH_ETCD_BIN="$dir/bin/etcd"
bad=0
for e in "$dir"/build/*/*; do
  [ -x "$e" ] || continue
  missing=$(ldd "$e" 2>&1 | awk '/not found/ {print $1}' | tr '\n' ' ')
  [ -z "$missing" ] || { echo "$e: cannot find $missing(install them, or add their folder to LD_LIBRARY_PATH)" >&2; bad=1; }
done
[ $bad = 0 ] || exit 3
exec "$@"

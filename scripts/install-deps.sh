#!/usr/bin/env bash
# Installs the Debian packages Leash builds, tests and trains with (idempotent).
# Needs root (or sudo). Set LEASH_SKIP_APT=1 to skip when everything is installed.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libzmq3-dev cppzmq-dev libflatbuffers-dev flatbuffers-compiler
  librocksdb-dev libspdlog-dev libfmt-dev zlib1g-dev prometheus-cpp-dev libyaml-cpp-dev
  libgtest-dev libgmock-dev libopenblas-dev
  # replicated shards (--replicas > 1, docs/replication.md): etcd's v3 JSON gateway through
  # libcurl and nlohmann-json (OpenSSL's base64 for its keys); the etcd server and etcdctl
  # for the scripts, the tests and the compose cluster
  libcurl4-openssl-dev libssl-dev nlohmann-json3-dev etcd-server etcd-client
  dataset-fashion-mnist
  # the multi-host test's network namespaces, bridge and private /dev/shm mounts
  iproute2 util-linux
  # the Python package (python/) and its tests, under Debian's /usr/bin/python3
  python3-dev python3-pybind11 python3-numpy python3-pytest python3-torch python3-venv
)
# `scripts/install-deps.sh fuzz` also installs clang and its runtimes (libFuzzer, the
# sanitizers) for scripts/fuzz.sh.
if [[ "${1:-}" == fuzz ]]; then PACKAGES+=(clang libclang-rt-14-dev); fi
# `scripts/install-deps.sh bench` also installs the benchmark suite's plots (matplotlib),
# fio (the sparse scale benchmark measures the disk with it) and iperf3 (the loopback TCP
# ceiling of the push/pull rows); its Python peers use the
# Debian PyTorch and numpy above, on OpenBLAS.
if [[ "${1:-}" == bench ]]; then PACKAGES+=(python3-matplotlib fio iperf3); fi
# `scripts/install-deps.sh format` also installs clang-format for scripts/format.sh.
if [[ "${1:-}" == format ]]; then PACKAGES+=(clang-format); fi

# MovieLens-100k (leash-worker --model ctr) is fetched by its own script, after the packages.
fetch_movielens() { bash "$(dirname "$0")/fetch-movielens.sh"; }

if [[ "${LEASH_SKIP_APT:-0}" == 1 ]]; then fetch_movielens; exit 0; fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "leash: all build packages are installed"
  fetch_movielens
  exit 0
fi

SUDO=""
if [[ $(id -u) != 0 ]]; then
  command -v sudo >/dev/null || { echo "leash: run as root or install sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
echo "leash: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fetch_movielens

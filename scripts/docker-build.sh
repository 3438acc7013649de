#!/usr/bin/env bash
# Builds Leash's container image on a machine without an image registry.
#
#   scripts/docker-build.sh [--pull] [--rebuild-base] [--python] [extra `docker build` arguments]
#
# 1. Makes sure a Docker engine answers: installs docker.io, docker-compose and debootstrap
#    with apt-get when they are missing and starts `dockerd` in the background when no
#    daemon runs (its log: $LEASH_DOCKERD_LOG, default /var/log/leash-dockerd.log; it is
#    left running for the next build or test).
# 2. Makes the base images the Dockerfile starts from when they are not there yet:
#    debian:bookworm (a minbase debootstrap, like the official image) and
#    debian:bookworm-slim (the same with documentation, man pages and locales stripped and
#    kept out of later installs), both with `docker import`. With --pull they are pulled
#    from a registry instead (where one is reachable); --rebuild-base makes them again.
# 3. Builds $LEASH_IMAGE (default leash:latest) from docker/Dockerfile (CPU only); its
#    build stage is kept as leash:build-stage (the compiler cache of the next build).
#    Also $LEASH_ETCD_IMAGE (default leash:etcd: Debian's etcd-server, the coordinator of
#    the replicated compose cluster). With --python, also the Python worker image ($LEASH_PYTHON_IMAGE, default leash:python;
#    the Dockerfile's `python` target: python3, numpy, torch and the leash package).
#
# Environment: LEASH_IMAGE (leash:latest), LEASH_ETCD_IMAGE (leash:etcd), LEASH_DOCKERFILE (docker/Dockerfile),
#   LEASH_DEBIAN_MIRROR (default: the Debian mirror this machine's apt uses), LEASH_DOCKERD_LOG,
#   LEASH_JOBS (parallel compile jobs inside the build, default: all cores),
#   LEASH_DOCKER_BUILD_LOG (the builds' whole output; ${TMPDIR:-/tmp}/leash-docker-build.log),
#   LEASH_DOCKER_VERBOSE=1 (show that output as it comes instead of the steps only).
# Every step prints how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${LEASH_IMAGE:-leash:latest}
DOCKERFILE=${LEASH_DOCKERFILE:-docker/Dockerfile}
# The mirror apt uses here for the main archive (deb822 .sources files or sources.list),
# so the images come from the same place as this machine's packages.
apt_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    awk '/^URIs:/ {u=$2} /^Suites:/ && / bookworm( |$)/ {print u; exit}' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $f ]] || continue
    awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' "$f"
  done
}
MIRROR=${LEASH_DEBIAN_MIRROR:-$(apt_mirror | head -n 1)}
if [[ -z "$MIRROR" ]]; then
  echo "leash: no Debian bookworm mirror found in /etc/apt; set LEASH_DEBIAN_MIRROR=URL" >&2
  exit 2
fi
DOCKERD_LOG=${LEASH_DOCKERD_LOG:-/var/log/leash-dockerd.log}
SUITE=bookworm
PULL=0
REBUILD_BASE=0
PYTHON_IMAGE=0
BUILD_ARGS=()
for arg in "$@"; do
  case "$arg" in
    --pull) PULL=1 ;;
    --rebuild-base) REBUILD_BASE=1 ;;
    --python) PYTHON_IMAGE=1 ;;
    -h | --help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) BUILD_ARGS+=("$arg") ;;
  esac
done

log() { echo "leash-docker: $*"; }
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

SUDO=""
if [[ $(id -u) != 0 ]]; then SUDO=sudo; fi

ensure_packages() {
  local missing=() cmd pkg
  for pair in docker:docker.io dockerd:docker.io docker-compose:docker-compose debootstrap:debootstrap; do
    cmd=${pair%%:*}
    pkg=${pair#*:}
    if ! command -v "$cmd" >/dev/null 2>&1 && [[ ! -x /usr/sbin/$cmd ]]; then
      [[ " ${missing[*]-} " == *" $pkg "* ]] || missing+=("$pkg")
    fi
  done
  if ((${#missing[@]} > 0)); then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    # With recommends: cgroupfs-mount mounts the cgroup hierarchies dockerd needs on a
    # machine that boots without them, and apparmor/xz-utils are what docker expects.
    $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# Starts dockerd in the background unless a daemon already answers.
ensure_dockerd() {
  if docker info >/dev/null 2>&1; then return 0; fi
  local dockerd
  dockerd=$(command -v dockerd || echo /usr/sbin/dockerd)
  log "no Docker daemon answers; starting $dockerd (log: $DOCKERD_LOG)"
  $SUDO mkdir -p "$(dirname "$DOCKERD_LOG")"
  # setsid: the daemon must outlive this script and must not get its terminal's signals.
  $SUDO setsid "$dockerd" >>"$DOCKERD_LOG" 2>&1 </dev/null &
  local pid=$!
  for ((i = 0; i < 120; i++)); do
    if docker info >/dev/null 2>&1; then
      log "dockerd is up (pid $pid)"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 0.5
  done
  log "dockerd did not come up; the end of $DOCKERD_LOG:" >&2
  tail -n 20 "$DOCKERD_LOG" >&2 || true
  exit 1
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# Turns a debootstrapped tree into what the official images look like: deb822 sources
# with security updates, apt settings that keep no caches and no translations, no
# service starts in package scripts, no logs and no apt lists.
configure_rootfs() {
  local root=$1
  rm -f "$root/etc/apt/sources.list"
  mkdir -p "$root/etc/apt/sources.list.d"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${MIRROR%/debian}/debian-security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
  printf 'Acquire::GzipIndexes "true";\nAcquire::CompressionTypes::Order:: "gz";\n' \
    >"$root/etc/apt/apt.conf.d/docker-gzip-indexes"
  echo 'Apt::AutoRemove::SuggestsImportant "false";' >"$root/etc/apt/apt.conf.d/docker-autoremove-suggests"
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 755 "$root/usr/sbin/policy-rc.d"
  : >"$root/etc/machine-id"
  rm -f "$root/etc/hostname" "$root/etc/resolv.conf"
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
    "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old "$root"/tmp/* "$root"/var/tmp/*
  find "$root/var/log" -type f -delete
}

# What debian:*-slim leaves out, now and in every later apt-get install.
slimify_rootfs() {
  local root=$1
  mkdir -p "$root/etc/dpkg/dpkg.cfg.d"
  cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
# As in the official debian:*-slim images: no documentation, man pages or translations.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
  find "$root/usr/share/doc" -mindepth 1 -not -type d -not -name copyright -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$root"/usr/share/man/* "$root"/usr/share/groff/* "$root"/usr/share/info/* \
    "$root"/usr/share/lintian/* "$root"/usr/share/linda/*
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
}

import_rootfs() {
  local root=$1 tag=$2
  tar -C "$root" --numeric-owner -cf - . |
    docker import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["bash"]' \
      --message "debootstrap --variant=minbase $SUITE $MIRROR (scripts/docker-build.sh)" \
      - "$tag" >/dev/null
  log "$tag: $(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.1f MB", $1 / 1e6}')"
}

build_base_images() {
  local need=()
  for tag in "debian:$SUITE" "debian:$SUITE-slim"; do
    if ((REBUILD_BASE)) || ! have_image "$tag"; then need+=("$tag"); fi
  done
  if ((${#need[@]} == 0)); then
    log "base images debian:$SUITE and debian:$SUITE-slim are there"
    return 0
  fi
  local t0
  t0=$(now)
  if ((PULL)); then
    for tag in "${need[@]}"; do docker pull "$tag"; done
    log "pulled ${need[*]} in $(took "$t0")"
    return 0
  fi
  if [[ $(id -u) != 0 ]]; then
    log "making ${need[*]} with debootstrap needs root; run as root, or use --pull where a registry is reachable" >&2
    exit 1
  fi
  local work
  work=$(mktemp -d /var/tmp/leash-rootfs.XXXXXX)
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" EXIT
  log "debootstrapping $SUITE (minbase) from $MIRROR for ${need[*]}"
  if ! debootstrap --variant=minbase --components=main "$SUITE" "$work/root" "$MIRROR" >"$work/debootstrap.log" 2>&1; then
    log "debootstrap failed; the end of its log:" >&2
    tail -n 20 "$work/debootstrap.log" >&2
    tail -n 20 "$work/root/debootstrap/debootstrap.log" >&2 2>/dev/null || true
    exit 1
  fi
  log "debootstrap took $(took "$t0")"
  configure_rootfs "$work/root"
  local t1
  t1=$(now)
  if [[ " ${need[*]} " == *" debian:$SUITE "* ]]; then import_rootfs "$work/root" "debian:$SUITE"; fi
  if [[ " ${need[*]} " == *" debian:$SUITE-slim "* ]]; then
    slimify_rootfs "$work/root"
    import_rootfs "$work/root" "debian:$SUITE-slim"
  fi
  log "imported ${need[*]} in $(took "$t1") (base images: $(took "$t0") in all)"
  rm -rf "$work"
  trap - EXIT
}

T_ALL=$(now)
t=$(now)
ensure_packages
ensure_dockerd
log "docker engine ready in $(took "$t")"

build_base_images

# BuildKit only when the buildx plugin is there; otherwise the classic builder (which
# the newer docker CLIs only use when told so).
if [[ -z "${DOCKER_BUILDKIT:-}" ]]; then
  if docker buildx version >/dev/null 2>&1; then export DOCKER_BUILDKIT=1; else export DOCKER_BUILDKIT=0; fi
fi
# Builds with the whole output in $BUILD_LOG; the terminal shows the Dockerfile's steps and
# every 20th compile step as progress, and on a failure the end of the log (a CI run then
# shows why, not a page of compiler lines). LEASH_DOCKER_VERBOSE=1 shows everything.
BUILD_LOG=${LEASH_DOCKER_BUILD_LOG:-${TMPDIR:-/tmp}/leash-docker-build.log}
build() {
  local rc=0
  : >"$BUILD_LOG"
  if [[ "${LEASH_DOCKER_VERBOSE:-0}" == 1 ]]; then
    docker build -f "$DOCKERFILE" ${LEASH_JOBS:+--build-arg "JOBS=$LEASH_JOBS"} "${BUILD_ARGS[@]}" "$@" . 2>&1 |
      tee "$BUILD_LOG" || rc=$?
  else
    # The progress lines as they come (the filter never fails the pipeline; docker's own
    # status is the build's).
    set +e
    docker build -f "$DOCKERFILE" ${LEASH_JOBS:+--build-arg "JOBS=$LEASH_JOBS"} "${BUILD_ARGS[@]}" "$@" . 2>&1 |
      tee "$BUILD_LOG" |
      grep --line-buffered -E '^Step [0-9]+/[0-9]+ : (FROM|RUN|COPY)|^#[0-9]+ \[[^]]*\] (FROM|RUN|COPY)|^\[[0-9]*[02468]0/[0-9]+\]' |
      sed -u 's/^\(.\{0,160\}\).*/  \1/'
    rc=${PIPESTATUS[0]}
    set -e
  fi
  if ((rc != 0)); then
    log "docker build $* failed (exit $rc); the end of its log ($BUILD_LOG):" >&2
    grep -v -e 'DEPRECATED: The legacy builder' -e 'BuildKit is currently disabled' \
      -e 'Install the buildx component' -e 'docs.docker.com/go/buildx' -e '^ *$' "$BUILD_LOG" |
      tail -n 40 >&2
  fi
  return "$rc"
}
t=$(now)
# The build stage is tagged too ($IMAGE's name with the tag build-stage): its layers stay
# the next build's cache, and the untagged build stages of earlier builds are pruned.
REPO=$IMAGE
if [[ "${IMAGE##*/}" == *:* ]]; then REPO=${IMAGE%:*}; fi
STAGE_TAG="$REPO:build-stage"
log "building the build stage of $IMAGE ($STAGE_TAG) from $DOCKERFILE"
build --target build -t "$STAGE_TAG" || { log "docker build of $STAGE_TAG failed" >&2; exit 1; }
log "build stage built in $(took "$t")"
t=$(now)
log "building $IMAGE"
build --target runtime -t "$IMAGE" || { log "docker build of $IMAGE failed" >&2; exit 1; }
# The etcd image of the replicated compose cluster (Debian's etcd-server on the slim base;
# cached after the first build).
ETCD_IMAGE=${LEASH_ETCD_IMAGE:-$REPO:etcd}
log "building $ETCD_IMAGE (target etcd)"
build --target etcd -t "$ETCD_IMAGE" || { log "docker build of $ETCD_IMAGE failed" >&2; exit 1; }
if ((PYTHON_IMAGE)); then
  PY_IMAGE=${LEASH_PYTHON_IMAGE:-$REPO:python}
  log "building $PY_IMAGE (target python)"
  build --target python -t "$PY_IMAGE" || { log "docker build of $PY_IMAGE failed" >&2; exit 1; }
fi
docker image prune -f --filter label=org.leash.stage=build >/dev/null || true
docker image prune -f --filter label=org.leash.stage=runtime >/dev/null || true
log "$IMAGE built in $(took "$t"): $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.1f MB", $1 / 1e6}')"
log "done in $(took "$T_ALL")"

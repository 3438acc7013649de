#!/usr/bin/env bash
# Creates the Secret leash-curve-keys that the manifests mount: fresh CURVE keys from
# `leashctl keygen` (the shards' pair and a `client` pair shared by every worker and
# leashctl, authorized), written to a private temporary directory that is removed on exit.
# The private keys go only into the Secret: never commit them.
#
#   bash deploy/kubernetes/make-keys.sh NAMESPACE            creates the Secret (kubectl apply)
#   bash deploy/kubernetes/make-keys.sh NAMESPACE --print    prints its YAML instead
#   bash deploy/kubernetes/make-keys.sh NAMESPACE --from DIR  the keys in DIR (leashctl keygen
#                                                            DIR) instead of fresh ones
#
# leashctl: $LEASHCTL, else build/tools/leashctl, else leashctl on the PATH. An existing
# Secret is replaced (restart the shards and workers to use the new keys).
set -euo pipefail
cd "$(dirname "$0")/../.."
NAMESPACE=${1:?usage: make-keys.sh NAMESPACE [--print] [--from DIR]}
shift
PRINT=0
FROM=""
while (($#)); do
  case $1 in
    --print) PRINT=1 ;;
    --from) FROM=${2:?--from needs a directory}; shift ;;
    *) echo "make-keys.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
command -v kubectl >/dev/null || { echo "make-keys.sh: kubectl is not installed" >&2; exit 1; }

umask 077
TMP=$(mktemp -d /tmp/leash-keys.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
if [[ -n "$FROM" ]]; then
  KEYS=$FROM
else
  LEASHCTL=${LEASHCTL:-}
  if [[ -z "$LEASHCTL" ]]; then
    if [[ -x build/tools/leashctl ]]; then LEASHCTL=build/tools/leashctl
    elif command -v leashctl >/dev/null; then LEASHCTL=leashctl
    else echo "make-keys.sh: no leashctl (build it, or set LEASHCTL)" >&2; exit 1
    fi
  fi
  KEYS=$TMP/keys
  "$LEASHCTL" keygen "$KEYS" >&2
fi
for f in server.key server.pub client.key client.pub authorized/client.pub; do
  [[ -s "$KEYS/$f" ]] || { echo "make-keys.sh: $KEYS/$f is missing" >&2; exit 1; }
done

# Secret keys cannot hold a '/': authorized/client.pub is authorized-client.pub there, and
# the manifests' volumes put it back under authorized/.
kubectl create secret generic leash-curve-keys --namespace "$NAMESPACE" \
  --from-file=server.key="$KEYS/server.key" --from-file=server.pub="$KEYS/server.pub" \
  --from-file=client.key="$KEYS/client.key" --from-file=client.pub="$KEYS/client.pub" \
  --from-file=authorized-client.pub="$KEYS/authorized/client.pub" \
  --dry-run=client -o yaml >"$TMP/secret.yaml"
if ((PRINT)); then
  cat "$TMP/secret.yaml"
else
  kubectl apply -f "$TMP/secret.yaml"
fi

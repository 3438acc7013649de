#!/usr/bin/env bash
# The Kubernetes manifests' check (ctest label `kubernetes`, and a CI stage): renders the
# base and every overlay under deploy/kubernetes/ with `kubectl kustomize` (offline),
# validates every resource strictly against Kubernetes' JSON schemas with
# kubernetes-validate (its schemas ship with the package: no cluster, no network) for the
# oldest and newest versions we support, validates the Secret make-keys.sh makes, and
# checks what the schemas cannot: the shard count agrees across the StatefulSet and the
# ConfigMap, every container requests resources, the shards have probes backed by
# `leashctl health`, scrape annotations and a volume claim template, the workers wait when
# the job is trained (a Deployment restarts containers that exit), and the GPU overlay asks
# for nvidia.com/gpu.
#
#   bash scripts/check-kubernetes.sh             check (exit 77, a skip, without the tools)
#   bash scripts/check-kubernetes.sh --install   first install kubernetes-validate into the
#                                                venv $LEASH_K8S_VENV (/opt/leash-k8s-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LEASH_K8S_VENV:-/opt/leash-k8s-venv}
VERSIONS=${LEASH_K8S_VERSIONS:-"1.28.0 1.37.0"}
KV_VERSION=1.37.0

if [[ "${1:-}" == --install ]]; then
  if ! [[ -x "$VENV/bin/kubernetes-validate" ]]; then
    /usr/bin/python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet "kubernetes-validate==$KV_VERSION"
  fi
fi
skip() {
  echo "check-kubernetes: SKIP: $*"
  exit 77
}
command -v kubectl >/dev/null || skip "kubectl is not installed (it renders the kustomizations)"
KV=""
if [[ -x "$VENV/bin/kubernetes-validate" ]]; then KV=$VENV/bin/kubernetes-validate
elif command -v kubernetes-validate >/dev/null; then KV=$(command -v kubernetes-validate)
else skip "kubernetes-validate is not installed: bash scripts/check-kubernetes.sh --install"
fi
/usr/bin/python3 -c 'import yaml' 2>/dev/null || skip "python3-yaml is not installed"

OUT=$(mktemp -d /tmp/leash-k8s-check.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
fail() {
  echo "check-kubernetes: FAIL: $*" >&2
  exit 1
}
validate() {  # FILE: every resource in it, strictly, for every version in $VERSIONS
  for v in $VERSIONS; do
    "$KV" --strict --quiet -k "$v" "$1" || fail "$1 does not validate against Kubernetes $v"
  done
}

ROOT=deploy/kubernetes
DIRS=("$ROOT/base")
for d in "$ROOT"/overlays/*/; do DIRS+=("${d%/}"); done
for d in "${DIRS[@]}"; do
  name=${d#"$ROOT"/}
  file=$OUT/${name//\//-}.yaml
  kubectl kustomize "$d" >"$file" 2>"$OUT/err" || fail "kubectl kustomize $d: $(cat "$OUT/err")"
  validate "$file"
  /usr/bin/python3 - "$file" "$name" <<'PY' || fail "$d: the checks above"
import sys, yaml
path, name = sys.argv[1], sys.argv[2]
docs = [d for d in yaml.safe_load_all(open(path)) if d]
by = {(d["kind"], d["metadata"]["name"].rsplit("-", 1)[0] if d["kind"] == "ConfigMap" else
       d["metadata"]["name"]): d for d in docs}
errors = []
def need(cond, what):
    if not cond:
        errors.append(what)
sts = by.get(("StatefulSet", "leash-shard"))
dep = by.get(("Deployment", "leash-worker"))
cm = by.get(("ConfigMap", "leash-job"))
svc = by.get(("Service", "leash-shard"))
need(sts and dep and cm and svc, "the shard StatefulSet, worker Deployment, ConfigMap leash-job "
     "and headless Service leash-shard are all there")
if not errors:
    n = sts["spec"]["replicas"]
    servers = cm["data"]["LEASH_SERVERS"].split(",")
    need(int(cm["data"]["LEASH_NUM_SHARDS"]) == n,
         f"LEASH_NUM_SHARDS {cm['data']['LEASH_NUM_SHARDS']} = the StatefulSet's replicas {n}")
    want = [f"tcp://leash-shard-{i}.leash-shard:7000" for i in range(n)]
    need(servers == want, f"LEASH_SERVERS lists the shards in order by their stable DNS names: {want}")
    need(svc["spec"].get("clusterIP") == "None", "the shards' Service is headless")
    need(sts["spec"]["serviceName"] == "leash-shard", "the StatefulSet names the headless Service")
    need(any(t["metadata"]["name"] == "data" for t in sts["spec"].get("volumeClaimTemplates", [])),
         "each shard has a PersistentVolumeClaim for /data")
    need(cm["data"].get("LEASH_CURVE_KEYS") == "/keys", "every process uses CURVE keys")
    for w in (sts, dep):
        spec = w["spec"]["template"]["spec"]
        kind = w["kind"]
        ann = w["spec"]["template"]["metadata"].get("annotations", {})
        need(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == "9100",
             f"{kind}: Prometheus scrape annotations on port 9100")
        need(spec.get("terminationGracePeriodSeconds", 30) >= 45,
             f"{kind}: terminationGracePeriodSeconds covers a worker's leave / a final snapshot")
        for c in spec.get("initContainers", []) + spec["containers"]:
            need(c.get("resources", {}).get("requests"), f"{kind}/{c['name']}: resource requests")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0].get("env", [])}
    need(env.get("LEASH_WAIT_WHEN_DONE") == "1",
         "workers wait when the job is trained (LEASH_WAIT_WHEN_DONE=1: a Deployment restarts "
         "containers that exit)")
    shard = sts["spec"]["template"]["spec"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        cmd = shard.get(probe, {}).get("exec", {}).get("command", [])
        need(cmd[:1] == ["leashctl"] and cmd[-1:] == ["health"], f"shard {probe}: leashctl health")
    need(sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 120,
         "shards: at least 120 s for the final snapshot")
    if name.endswith("gpu"):
        lim = dep["spec"]["template"]["spec"]["containers"][0]["resources"].get("limits", {})
        need(str(lim.get("nvidia.com/gpu")) == "1", "GPU workers: limits nvidia.com/gpu: 1")
for e in errors:
    print(f"check-kubernetes: {name}: missing: {e}", file=sys.stderr)
print(f"check-kubernetes: {name}: {len(docs)} resources: " +
      ", ".join(f"{d['kind']}/{d['metadata']['name']}" for d in docs))
sys.exit(1 if errors else 0)
PY
done

# The Secret: needs leashctl for fresh keys (the build's, or one on the PATH).
if [[ -n "${LEASHCTL:-}" || -x build/tools/leashctl ]] || command -v leashctl >/dev/null; then
  bash "$ROOT/make-keys.sh" leash --print >"$OUT/secret.yaml" 2>"$OUT/err" ||
    fail "make-keys.sh: $(cat "$OUT/err")"
  validate "$OUT/secret.yaml"
  echo "check-kubernetes: make-keys.sh: a valid Secret with $(grep -c '^  [a-z-]*\.\(key\|pub\):' "$OUT/secret.yaml") key files"
else
  echo "check-kubernetes: make-keys.sh not checked: no leashctl built"
fi
echo "check-kubernetes: every kustomization renders and validates (Kubernetes $VERSIONS)"

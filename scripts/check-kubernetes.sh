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
# for nvidia.com/gpu. The replicated overlay (LEASH_REPLICAS > 1): one StatefulSet per shard
# of LEASH_NUM_SHARDS, each of LEASH_REPLICAS replicas, with a required podAntiAffinity over
# its own pods and a PodDisruptionBudget that never lets a drain take all of them, probes
# that a backup passes, workers without a static shard list, and etcd with probes and its
# data on a volume claim.
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
def exec_cmd(container, probe):
    return container.get(probe, {}).get("exec", {}).get("command", [])
dep = by.get(("Deployment", "leash-worker"))
cm = by.get(("ConfigMap", "leash-job"))
svc = by.get(("Service", "leash-shard"))
need(dep and cm and svc, "the worker Deployment, ConfigMap leash-job and headless Service "
     "leash-shard are all there")
if not errors:
    n = int(cm["data"]["LEASH_NUM_SHARDS"])
    R = int(cm["data"].get("LEASH_REPLICAS", "1"))
    replicated = R > 1
    need(svc["spec"].get("clusterIP") == "None", "the shards' Service is headless")
    need(cm["data"].get("LEASH_CURVE_KEYS") == "/keys", "every process uses CURVE keys")
    if not replicated:
        # One StatefulSet, a pod per shard; the workers list the shards.
        sts = by.get(("StatefulSet", "leash-shard"))
        need(sts, "the shard StatefulSet leash-shard")
        shard_sets = [sts] if sts else []
        if sts:
            need(sts["spec"]["replicas"] == n,
                 f"LEASH_NUM_SHARDS {n} = the StatefulSet's replicas {sts['spec']['replicas']}")
            servers = cm["data"]["LEASH_SERVERS"].split(",")
            want = [f"tcp://leash-shard-{i}.leash-shard:7000" for i in range(n)]
            need(servers == want,
                 f"LEASH_SERVERS lists the shards in order by their stable DNS names: {want}")
            shard = sts["spec"]["template"]["spec"]["containers"][0]
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                cmd = exec_cmd(shard, probe)
                need(cmd[:1] == ["leashctl"] and cmd[-1:] == ["health"],
                     f"shard {probe}: leashctl health")
    else:
        # Replicated (overlays/replicated): a StatefulSet per shard, leash-shard-<s>, of R
        # replicas leash-shard-<s>-<r>, coordinated through etcd.
        names = sorted(d["metadata"]["name"] for d in docs if d["kind"] == "StatefulSet" and
                       d["metadata"]["name"].startswith("leash-shard"))
        want = [f"leash-shard-{s}" for s in range(n)]
        need(names == want, f"one StatefulSet per shard, {want} (LEASH_NUM_SHARDS {n}), "
             f"not {names}")
        shard_sets = [by[("StatefulSet", x)] for x in want if ("StatefulSet", x) in by]
        need(not cm["data"].get("LEASH_SERVERS"),
             "LEASH_SERVERS is empty: workers and leashctl find the primaries in etcd")
        need(svc["spec"].get("publishNotReadyAddresses") is True,
             "the shards' Service publishes unready pods: a backup is ready only once it holds "
             "the log, and its primary reaches it by name to send it")
        need(cm["data"].get("LEASH_JOB"), "LEASH_JOB names the job in etcd")
        need(cm["data"].get("LEASH_ETCD_TTL"), "LEASH_ETCD_TTL sets the etcd lease")
        etcd = by.get(("StatefulSet", "leash-etcd"))
        etcd_svc = by.get(("Service", "leash-etcd"))
        need(etcd and etcd_svc, "the etcd StatefulSet leash-etcd and its Service")
        if etcd and etcd_svc:
            need(etcd_svc["spec"].get("clusterIP") == "None" and
                 etcd["spec"]["serviceName"] == "leash-etcd", "etcd's Service is headless")
            need(cm["data"].get("LEASH_ETCD") == "http://leash-etcd-0.leash-etcd:2379",
                 "LEASH_ETCD names etcd by its stable DNS name http://leash-etcd-0.leash-etcd:2379")
            c = etcd["spec"]["template"]["spec"]["containers"][0]
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                cmd = exec_cmd(c, probe)
                need(cmd[:1] == ["etcdctl"] and cmd[-2:] == ["endpoint", "health"],
                     f"etcd {probe}: etcdctl endpoint health")
            claims = [t["metadata"]["name"] for t in etcd["spec"].get("volumeClaimTemplates", [])]
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
            data_dir = env.get("ETCD_DATA_DIR", "")
            need(any(data_dir.startswith(mounts.get(v, "//") + "/") for v in claims),
                 "etcd keeps ETCD_DATA_DIR on a PersistentVolumeClaim")
        for s, sts in enumerate(shard_sets):
            kind = f"StatefulSet {sts['metadata']['name']}"
            spec = sts["spec"]
            sel = spec["selector"]["matchLabels"]
            need(spec["replicas"] == R, f"{kind}: replicas {spec['replicas']} = LEASH_REPLICAS {R}")
            need(spec["serviceName"] == "leash-shard", f"{kind}: names the headless Service")
            need(sel.get("leash/shard") == str(s) and
                 spec["template"]["metadata"]["labels"].get("leash/shard") == str(s),
                 f"{kind}: its pods and selector carry leash/shard: \"{s}\"")
            need(any(t["metadata"]["name"] == "data" for t in spec.get("volumeClaimTemplates", [])),
                 f"{kind}: each replica has a PersistentVolumeClaim for /data")
            terms = (spec["template"]["spec"].get("affinity", {}).get("podAntiAffinity", {})
                     .get("requiredDuringSchedulingIgnoredDuringExecution", []))
            need(any(t.get("topologyKey") == "kubernetes.io/hostname" and
                     t.get("labelSelector", {}).get("matchLabels") == sel for t in terms),
                 f"{kind}: a required podAntiAffinity on kubernetes.io/hostname over its own "
                 "pods (no two replicas of a shard on one node)")
            pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget" and
                    d["spec"].get("selector", {}).get("matchLabels") == sel]
            need(len(pdbs) == 1, f"{kind}: a PodDisruptionBudget over its pods")
            for p in pdbs:
                mu, ma = p["spec"].get("maxUnavailable"), p["spec"].get("minAvailable")
                need((isinstance(mu, int) and 1 <= mu <= R - 1) or
                     (isinstance(ma, int) and 1 <= ma <= R - 1),
                     f"{kind}: its budget lets a drain take some but never all of its {R} "
                     "replicas (maxUnavailable or minAvailable in [1, R-1])")
            shard = spec["template"]["spec"]["containers"][0]
            script = " ".join(shard.get("command", []))
            need("leash-server" in script and "--replica " in script and "--peers" in script and
                 "LEASH_REPLICAS" in script,
                 f"{kind}: leash-server gets --replica and --peers (LEASH_REPLICAS of them)")
            for probe, mode in (("startupProbe", "live"), ("readinessProbe", "ready"),
                                ("livenessProbe", "live")):
                need(exec_cmd(shard, probe) == ["sh", "/probe/replica-probe.sh", mode],
                     f"{kind}: {probe} runs replica-probe.sh {mode} (leashctl health fails a "
                     "backup)")
        probe_cm = by.get(("ConfigMap", "leash-replica-probe"))
        # The probe takes a backup's refusal as alive: the words must be the server's.
        phrase = " is a backup; the primary is "
        need(probe_cm and phrase in probe_cm["data"].get("replica-probe.sh", "") and
             phrase in open("server/src/replica.cc").read(),
             f"the ConfigMap leash-replica-probe's replica-probe.sh knows a backup's answer "
             f"('{phrase}', server/src/replica.cc)")
        wcmd = exec_cmd(dep["spec"]["template"]["spec"]["containers"][0], "readinessProbe")
        need("--servers" not in wcmd, "the workers' readiness probe asks the primaries in etcd")
    for w in shard_sets + [dep]:
        kind = f"{w['kind']} {w['metadata']['name']}"
        ann = w["spec"]["template"]["metadata"].get("annotations", {})
        need(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == "9100",
             f"{kind}: Prometheus scrape annotations on port 9100")
        need(w["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30) >=
             (120 if w is not dep else 45),
             f"{kind}: terminationGracePeriodSeconds covers a worker's leave / a final snapshot "
             "(shards: at least 120 s)")
    for w in docs:
        if w["kind"] not in ("StatefulSet", "Deployment"):
            continue
        spec = w["spec"]["template"]["spec"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            need(c.get("resources", {}).get("requests"),
                 f"{w['kind']} {w['metadata']['name']}/{c['name']}: resource requests")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0].get("env", [])}
    need(env.get("LEASH_WAIT_WHEN_DONE") == "1",
         "workers wait when the job is trained (LEASH_WAIT_WHEN_DONE=1: a Deployment restarts "
         "containers that exit)")
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

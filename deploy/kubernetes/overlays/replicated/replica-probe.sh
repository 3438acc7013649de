#!/bin/sh
# The probes of a replicated shard's pod (overlays/replicated; mounted from the ConfigMap
# leash-replica-probe), correct for a primary and a backup alike. Stateless; one run per
# probe.
#
#   replica-probe.sh live    0 while this replica answers over the normal protocol, as the
#                            primary (it serves) or as a backup (it names its primary), and
#                            while etcd does not answer (see below)
#   replica-probe.sh ready   0 while it is live and holds the shard's whole log: etcd names
#                            it the primary, or a backup in the in-sync set (or any replica
#                            while nothing was acknowledged yet)
#
# Why not `leashctl --servers tcp://127.0.0.1:7000 health` as the unreplicated shards do: a
# backup answers every worker request with "replica R of shard S is a backup; the primary
# is ...", so health calls every backup NOT SERVING and the kubelet would restart backups
# for ever. `live` takes that answer as alive: the replica listens, its loop runs, and it
# knows its role (the same words the client library follows to the primary). While etcd
# hangs (a lost node, a stalled disk), the replicas read the directory from their own watch
# and go on, but what their request loop must ask etcd (a campaign while no primary is
# known, a change of the in-sync set) waits its timeout (before the watch, measured here: no
# answer within 9 s, over and over). So a replica that does not answer counts as live when
# etcd does not answer either: restarting
# every replica of every shard then would throw away the logs they hold, which is the one
# thing etcd's return cannot repair. `ready` adds etcd's view (`leashctl --etcd status`): a
# backup still catching up is not ready, so the PodDisruptionBudget keeps a drain from
# taking its primary (the only replica holding the log) and a rolling update waits for it.
# Both read leashctl's words (a backup's refusal, the status lines of the replicas);
# tests/kubernetes_replica_probe_test.sh runs this script against etcd and real replicas, so
# a change of wording fails there rather than in a cluster.
#
# The pod's own values by default; the environment overrides them for a test outside
# Kubernetes: LEASH_PROBE_PORT (7000), LEASH_PROBE_ENDPOINT (tcp://$(hostname).leash-shard:
# PORT, the endpoint the container's command gives this replica in --peers) and
# LEASH_PROBE_TIMEOUT (5 s per leashctl call).
set -u
mode=${1:-}
port=${LEASH_PROBE_PORT:-7000}
timeout=${LEASH_PROBE_TIMEOUT:-5}
case $mode in
  live|ready) ;;
  *) echo "usage: replica-probe.sh live|ready"; exit 2 ;;
esac
# Does this replica answer, as the primary or as a backup? LEASH_ETCD empty: leashctl asks
# --servers, not the primaries etcd names.
answers() {
  out=$(LEASH_ETCD='' leashctl --servers "tcp://127.0.0.1:$port" --timeout "$timeout" health 2>&1)
  case $? in
    0) return 0 ;;
  esac
  case $out in
    *" is a backup; the primary is "*) return 0 ;;
  esac
  return 1
}
# etcd's view of the job (with LEASH_ETCD and LEASH_JOB from the ConfigMap).
view=""
read_view() { view=$(leashctl --timeout "$timeout" status 2>&1); }
etcd_silent() {
  case $view in
    *"Unavailable: etcd at "*) return 0 ;;
  esac
  return 1
}
if [ "$mode" = live ]; then
  answers && exit 0
  read_view
  if etcd_silent; then
    echo "no answer ($out), but etcd does not answer either: not restarting this replica"
    exit 0
  fi
  echo "not live: $out"
  exit 1
fi
answers || { echo "not ready: $out"; exit 1; }
# This replica's endpoint as it registers it in etcd.
me=${LEASH_PROBE_ENDPOINT:-"tcp://$(hostname).leash-shard:$port"}
read_view
case $view in
  *"$me; in sync: "*) exit 0 ;;  # the primary
  *"$me, in sync"*) exit 0 ;;    # a backup (or, between primaries, a live replica) in sync
  *"$me, may lead"*) exit 0 ;;   # nothing acknowledged yet: every replica holds it all
esac
echo "not ready: etcd does not list $me as the primary or an in-sync backup:"
echo "$view"
exit 1

#!/bin/sh
# The probes of a replicated shard's pod (overlays/replicated; mounted from the ConfigMap
# leash-replica-probe), correct for a primary and a backup alike. Stateless; one run per
# probe.
#
#   replica-probe.sh live    0 while this replica answers over the normal protocol, as the
#                            primary (it serves) or as a backup (it names its primary)
#   replica-probe.sh ready   0 while it is live and holds the shard's whole log: etcd names
#                            it the primary, or a backup in the in-sync set (or any replica
#                            while nothing was acknowledged yet)
#
# Why not `leashctl --servers tcp://127.0.0.1:7000 health` as the unreplicated shards do: a
# backup answers every worker request with "replica R of shard S is a backup; the primary
# is ...", so health calls every backup NOT SERVING and the kubelet would restart backups
# for ever. `live` takes that answer as alive: the replica listens, its loop runs, and it
# knows its role (the same words the client library follows to the primary). It asks only
# this process, never etcd, so an etcd outage never restarts replicas (that would lose the
# logs they hold). `ready` adds etcd's view (`leashctl --etcd status`): a backup still
# catching up is not ready, so the PodDisruptionBudget keeps a drain from taking its primary
# (the only replica holding the log) and a rolling update waits for it.
set -u
mode=${1:-}
timeout=${LEASH_PROBE_TIMEOUT:-5}
# LEASH_ETCD empty: leashctl asks --servers, not the primaries etcd names.
out=$(LEASH_ETCD= leashctl --servers tcp://127.0.0.1:7000 --timeout "$timeout" health 2>&1)
case $? in
  0) ;;
  *) case $out in
       *" is a backup; the primary is "*) ;;
       *) echo "not live: $out"; exit 1 ;;
     esac ;;
esac
case $mode in
  live) exit 0 ;;
  ready) ;;
  *) echo "usage: replica-probe.sh live|ready"; exit 2 ;;
esac
# This replica's endpoint as it registers it (--peers, built from the pod's name).
me="tcp://$(hostname).${LEASH_SHARD_SERVICE:-leash-shard}:7000"
view=$(leashctl --timeout "$timeout" status 2>&1)
case $view in
  *"$me; in sync: "*) exit 0 ;;  # the primary
  *"$me, in sync"*) exit 0 ;;    # a backup (or, between primaries, a live replica) in sync
  *"$me, may lead"*) exit 0 ;;   # nothing acknowledged yet: every replica holds it all
esac
echo "not ready: etcd does not list $me as the primary or an in-sync backup:"
echo "$view"
exit 1

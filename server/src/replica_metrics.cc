// ReplicaMetrics: the leash_replica_* Prometheus metrics of one replica.
#include "leash/server/replica_metrics.h"

#include <string>

#include "leash/common/metrics.h"

namespace leash::server {

ReplicaMetrics::ReplicaMetrics(prometheus::Registry& r, const Replica& replica) {
  const ShardOptions& so = replica.shard().options();
  const uint32_t self = replica.options().replica;
  const prometheus::Labels l{{"shard", std::to_string(so.shard)},
                             {"replica", std::to_string(self)}};
  auto gauge = [&](const std::string& name, const std::string& help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add(l);
  };
  auto mirror = [&](uint64_t (Replica::*get)() const, const std::string& name,
                    const std::string& help) {
    counters_.push_back(
        {get, &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add(l)});
  };
  primary_ = gauge("leash_replica_primary", "1 while this replica is its shard's primary, else 0.");
  term_ = gauge("leash_replica_term", "The newest term this replica knows.");
  log_index_ = gauge("leash_replica_log_index", "Index of the last entry of its log.");
  commit_index_ =
      gauge("leash_replica_commit_index", "Highest entry it knows every in-sync replica holds.");
  applied_index_ = gauge("leash_replica_applied_index", "Highest entry its shard has applied.");
  log_entries_ = gauge("leash_replica_log_entries",
                       "Entries held in memory (bounded beyond what is applied and committed).");
  log_bytes_ = gauge("leash_replica_log_bytes", "Bytes of the entries held in memory.");
  held_replies_ =
      gauge("leash_replica_held_replies", "Primary: replies held until their entries commit.");
  has_state_ = gauge("leash_replica_has_state",
                     "0 from the start of a snapshot transfer to this replica until it is "
                     "installed (it cannot lead then), else 1.");
  in_sync_ = gauge("leash_replica_in_sync_replicas",
                   "Primary: replicas in its in-sync set, itself included (0 on a backup).");
  lag_ = gauge("leash_replica_lag_entries",
               "Primary: entries its slowest in-sync backup lacks (0 on a backup).");
  lease_valid_ = gauge("leash_replica_coordinator_lease_valid",
                       "1 while this replica's etcd lease is known valid (renewed within the "
                       "TTL); 0: etcd unreachable from it, so no failover can happen through it.");
  durable_failed_ = gauge("leash_replica_durable_log_failed",
                          "1 once a durable log write failed: the replica acknowledges nothing "
                          "more and will not lead until restarted.");
  auto& mode = prometheus::BuildGauge()
                   .Name("leash_replica_durable_log_mode")
                   .Help("The replica's --durable-log: 1 on the series of its mode.")
                   .Register(r);
  for (const auto& [m, name] :
       {std::pair{DurableLogMode::kOff, "off"}, std::pair{DurableLogMode::kWrite, "write"},
        std::pair{DurableLogMode::kFsync, "fsync"}}) {
    prometheus::Labels ml = l;
    ml["mode"] = name;
    mode.Add(ml).Set(m == replica.durable_log_mode() ? 1 : 0);
  }
  durable_sync_seconds_ = &prometheus::BuildCounter()
                               .Name("leash_replica_durable_log_sync_seconds_total")
                               .Help("Seconds spent in the durable log's fdatasyncs (fsync).")
                               .Register(r)
                               .Add(l);
  mirror(&Replica::terms_led, "leash_replica_terms_led_total",
         "Terms this replica became primary in (elections won).");
  mirror(&Replica::snapshots_installed, "leash_replica_snapshots_installed_total",
         "Snapshot transfers this replica was caught up by.");
  mirror(&Replica::snapshots_abandoned, "leash_replica_snapshots_abandoned_total",
         "Snapshot transfers to this replica dropped part way (a newer term or transfer).");
  mirror(&Replica::replication_refused, "leash_replica_replication_refused_total",
         "Replication messages refused for coming from a connection that is not a replica's.");
  mirror(&Replica::backup_answered, "leash_replica_backup_answers_total",
         "Replies to workers' pushes and clocks this replica sent as their primary's only "
         "in-sync backup (--backup-answers).");
  mirror(&Replica::replies_left_to_backup, "leash_replica_replies_left_to_backup_total",
         "Replies this primary dropped because its backup sent them (--backup-answers).");
  mirror(&Replica::entries_lent, "leash_replica_entries_lent_total",
         "Log entries this replica read in place from its primary's shared-memory ring "
         "(applied without a copy).");
  mirror(&Replica::frames_copied_once, "leash_replica_frames_copied_once_total",
         "Pushed frames this primary copied once, from a worker's shared-memory ring straight "
         "into its backup's (--primary-copies-once).");
  mirror(&Replica::durable_records, "leash_replica_durable_log_records_total",
         "Records written to the durable log.");
  mirror(&Replica::durable_bytes, "leash_replica_durable_log_bytes_total",
         "Bytes written to the durable log.");
  mirror(&Replica::durable_syncs, "leash_replica_durable_log_syncs_total",
         "fdatasyncs of the durable log (fsync: one per acknowledgement or batch of replies).");
  auto& in_sync = prometheus::BuildGauge()
                      .Name("leash_replica_backup_in_sync")
                      .Help("Primary: 1 if the other replica is in its in-sync set.")
                      .Register(r);
  auto& behind = prometheus::BuildGauge()
                     .Name("leash_replica_backup_entries_behind")
                     .Help("Primary: entries of its log the other replica lacks.")
                     .Register(r);
  auto& seconds_behind = prometheus::BuildGauge()
                             .Name("leash_replica_backup_seconds_behind")
                             .Help(
                                 "Primary: age of the oldest entry the other replica lacks "
                                 "(0: it holds the whole log).")
                             .Register(r);
  auto& since_ack = prometheus::BuildGauge()
                        .Name("leash_replica_backup_seconds_since_ack")
                        .Help(
                            "Primary: seconds since the other replica's last acknowledgement "
                            "this term (-1: none yet).")
                        .Register(r);
  for (uint32_t b = 0; b < replica.options().replicas; ++b) {
    if (b == self) continue;
    prometheus::Labels bl = l;
    bl["backup"] = std::to_string(b);
    backups_.push_back(
        {b, &in_sync.Add(bl), &behind.Add(bl), &seconds_behind.Add(bl), &since_ack.Add(bl)});
  }
  Publish(replica);
}

void ReplicaMetrics::Publish(const Replica& replica) {
  const bool primary = replica.role() == ReplicaRole::kPrimary;
  primary_->Set(primary ? 1 : 0);
  term_->Set(static_cast<double>(replica.term()));
  log_index_->Set(static_cast<double>(replica.last_index()));
  commit_index_->Set(static_cast<double>(replica.commit_index()));
  applied_index_->Set(static_cast<double>(replica.applied_index()));
  log_entries_->Set(static_cast<double>(replica.log_entries()));
  log_bytes_->Set(static_cast<double>(replica.log_bytes()));
  held_replies_->Set(static_cast<double>(replica.held_replies()));
  has_state_->Set(replica.has_state() ? 1 : 0);
  in_sync_->Set(primary ? static_cast<double>(replica.in_sync().size()) : 0);
  lag_->Set(static_cast<double>(replica.replication_lag()));
  durable_failed_->Set(replica.durable_failed() ? 1 : 0);
  lease_valid_->Set(replica.coordinator_lease_valid() ? 1 : 0);
  for (Mirrored& m : counters_) AdvanceCounter(*m.counter, (replica.*m.get)(), m.published);
  AdvanceCounter(*durable_sync_seconds_, replica.durable_sync_seconds(),
                 durable_sync_seconds_published_);
  const uint64_t last = replica.last_index();
  const std::vector<BackupProgress> progress = replica.backups();
  for (Backup& g : backups_) {
    for (const BackupProgress& p : progress) {
      if (p.replica != g.replica) continue;
      g.in_sync->Set(primary && p.in_sync ? 1 : 0);
      g.entries_behind->Set(
          primary && last > p.match_index ? static_cast<double>(last - p.match_index) : 0);
      g.seconds_behind->Set(primary ? static_cast<double>(p.ms_behind) / 1000 : 0);
      g.seconds_since_ack->Set(
          primary && p.ms_since_ack >= 0 ? static_cast<double>(p.ms_since_ack) / 1000 : -1);
    }
  }
}

}  // namespace leash::server

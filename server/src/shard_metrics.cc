// ShardMetrics: the leash_shard_* Prometheus metrics of one shard.
#include "leash/server/shard_metrics.h"

#include <string>

#include "leash/common/metrics.h"

namespace leash::server {
namespace {

prometheus::Counter* AddCounter(prometheus::Registry& r, const prometheus::Labels& labels,
                                const std::string& name, const std::string& help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Labels(labels).Register(r).Add({});
}

prometheus::Gauge* AddGauge(prometheus::Registry& r, const prometheus::Labels& labels,
                            const std::string& name, const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Labels(labels).Register(r).Add({});
}

}  // namespace

ShardMetrics::ShardMetrics(prometheus::Registry& r, Shard& shard) {
  const prometheus::Labels l{{"shard", std::to_string(shard.options().shard)}};
  labels_ = l;
  auto mirror = [&](uint64_t ShardCounters::*field, const std::string& name,
                    const std::string& help) {
    counters_.push_back({field, AddCounter(r, l, name, help), 0});
  };
  mirror(&ShardCounters::pushes_applied, "leash_shard_pushes_total",
         "Pushes applied (each at most once).");
  mirror(&ShardCounters::pushes_duplicate, "leash_shard_duplicate_pushes_total",
         "Resent pushes that had been applied already: acknowledged, not applied again.");
  mirror(&ShardCounters::pushes_dropped_stale, "leash_shard_stale_pushes_dropped_total",
         "Pushes of backup workers (--backup-workers) dropped for lagging the minimum clock by "
         "more than their staleness bound.");
  mirror(&ShardCounters::pushes_summed, "leash_shard_pushes_summed_total",
         "Weighted pushes (work in proportion to speed) summed into their iteration's clock "
         "step instead of applied on their own.");
  mirror(&ShardCounters::clock_steps, "leash_shard_clock_steps_total",
         "Clock steps applied: one optimizer step per table on an iteration's summed pushes.");
  mirror(&ShardCounters::pulls_served, "leash_shard_pulls_total",
         "Pulls answered (at once or after being parked).");
  mirror(
      &ShardCounters::values_copied_on_write, "leash_shard_values_copied_on_write_total",
      "Updates that copied a table's values before writing them, because a pull reply still "
      "queued for sending held them (replies over the socket are sent from the table's memory).");
  mirror(&ShardCounters::updates_split, "leash_shard_updates_split_total",
         "Dense updates (or clock-step sums) shared by more than one thread "
         "(--update-threads).");
  mirror(&ShardCounters::passes_split, "leash_shard_passes_split_total",
         "Passes over large frames shared by more than one thread (--update-threads): pull "
         "replies written into same-host workers' rings, frames copied out of same-host "
         "peers' rings, NaN checks of pushes, a primary's copies of log entries for its "
         "backups.");
  mirror(&ShardCounters::pulls_parked, "leash_shard_parked_pulls_total",
         "Pulls that had to wait for the minimum clock (the staleness bound).");
  mirror(&ShardCounters::bytes_in, "leash_shard_received_bytes_total",
         "Bytes of requests received.");
  mirror(&ShardCounters::bytes_out, "leash_shard_sent_bytes_total", "Bytes of replies sent.");
  mirror(&ShardCounters::errors, "leash_shard_errors_total",
         "Requests rejected (answered with an error, within the error-reply limit).");
  mirror(&ShardCounters::rejection_lines_suppressed, "leash_shard_rejection_log_suppressed_total",
         "Warning lines of rejected requests not logged (over 5 a minute per peer and reason).");
  mirror(&ShardCounters::error_replies_suppressed, "leash_shard_error_replies_suppressed_total",
         "Error replies not sent to a peer over its limit (256 a second).");
  mirror(
      &ShardCounters::limit_rejections, "leash_shard_limit_rejections_total",
      "Requests refused for exceeding a limit (message size, keys, parked pulls per connection).");
  mirror(&ShardCounters::nonfinite_pushes, "leash_shard_nonfinite_pushes_total",
         "Pushes holding NaN or Inf.");
  mirror(&ShardCounters::pushes_checked_in_copy, "leash_shard_pushes_checked_in_copy_total",
         "Pushes whose NaN/Inf check was made by the copy out of shared memory, not again.");
  mirror(&ShardCounters::nonfinite_rows_skipped, "leash_shard_nonfinite_rows_skipped_total",
         "Rows of pushes skipped for holding NaN or Inf (--nonfinite skip-rows).");
  mirror(&ShardCounters::evictions, "leash_shard_evictions_total",
         "Workers evicted because their lease expired.");
  mirror(&ShardCounters::snapshots, "leash_shard_snapshots_total", "Snapshots written.");
  mirror(&ShardCounters::snapshot_failures, "leash_shard_snapshot_failures_total",
         "Snapshots that could not be written.");
  mirror(&ShardCounters::sparse_store_errors, "leash_shard_sparse_store_errors_total",
         "Sparse pulls, pushes and sweeps failed by the RocksDB cold tier.");

  memory_used_ = AddGauge(r, l, "leash_shard_memory_used_bytes",
                          "Memory of the sparse tables' memory tiers and the cold tier's block "
                          "cache and memtables.");
  memory_budget_ =
      AddGauge(r, l, "leash_shard_memory_budget_bytes", "--memory-budget (0: unbounded).");
  memory_budget_->Set(static_cast<double>(shard.options().memory_budget_bytes));
  resident_ = AddGauge(r, l, "leash_shard_resident_bytes",
                       "Resident memory of the shard's process (VmRSS): the budget plus the "
                       "fixed overhead docs/sparse.md states.");
  sparse_resident_ = &prometheus::BuildGauge()
                          .Name("leash_sparse_resident_rows")
                          .Help("Rows of a sparse table in its memory tier.")
                          .Register(r);
  sparse_memory_ = &prometheus::BuildGauge()
                        .Name("leash_sparse_memory_bytes")
                        .Help("Bytes of a sparse table's memory tier (rows, index, sketch).")
                        .Register(r);
  auto sparse_counter = [&](uint64_t ps::SparseCounters::*field, const std::string& name,
                            const std::string& help) {
    sparse_counter_families_.emplace_back(
        field, &prometheus::BuildCounter().Name(name).Help(help).Register(r));
  };
  sparse_counter(&ps::SparseCounters::tier_hits, "leash_sparse_tier_hits_total",
                 "Sparse rows found in the memory tier.");
  sparse_counter(&ps::SparseCounters::tier_misses, "leash_sparse_tier_misses_total",
                 "Sparse rows read from RocksDB or created.");
  sparse_counter(&ps::SparseCounters::evictions, "leash_sparse_evictions_total",
                 "Sparse rows moved out of the memory tier.");
  sparse_counter(&ps::SparseCounters::admissions, "leash_sparse_admissions_total",
                 "Keys that got a row (admitted).");
  sparse_counter(&ps::SparseCounters::unadmitted_reads, "leash_sparse_unadmitted_reads_total",
                 "Pulls of keys not admitted yet (served the initializer's value).");
  sparse_counter(&ps::SparseCounters::dropped_gradients, "leash_sparse_dropped_gradients_total",
                 "Gradient rows of keys without a row (not admitted or expired), dropped.");
  sparse_counter(&ps::SparseCounters::expired_rows, "leash_sparse_expired_rows_total",
                 "Sparse rows dropped for going unseen too many clocks.");
  sparse_counter(&ps::SparseCounters::rows_written, "leash_sparse_rows_written_total",
                 "Sparse rows written to RocksDB (evictions and snapshot flushes).");

  parked_pulls_ =
      AddGauge(r, l, "leash_shard_parked_pulls", "Pulls waiting now for the minimum clock.");
  min_clock_ = AddGauge(r, l, "leash_shard_min_clock", "Minimum clock over live workers.");
  max_clock_ = AddGauge(r, l, "leash_shard_max_clock", "Largest clock of a live worker.");
  staleness_ = AddGauge(
      r, l, "leash_shard_staleness_iterations",
      "Iterations the fastest live worker is ahead of the slowest (max clock - min clock).");
  live_workers_ = AddGauge(r, l, "leash_shard_live_workers", "Workers holding a lease.");
  last_snapshot_clock_ = AddGauge(r, l, "leash_shard_last_snapshot_clock",
                                  "Minimum clock of the last snapshot written (-1: none).");
  if (shard.options().shard == 0) {
    epochs_done_ = AddGauge(r, l, "leash_job_epochs_done",
                            "Epochs of the job whose every data chunk was trained.");
    chunks_done_ = AddGauge(r, l, "leash_job_chunks_done",
                            "Data chunks trained in the job's first unfinished epoch.");
  }
  snapshot_seconds_ =
      &prometheus::BuildHistogram()
           .Name("leash_shard_snapshot_duration_seconds")
           .Help("Time to write a snapshot to the store.")
           .Labels(l)
           .Register(r)
           .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                            0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30});
  shard.set_snapshot_observer(snapshot_observer());
  Publish(shard);
}

void ShardMetrics::AddSparseSeries(const ps::SparseTable& table) {
  prometheus::Labels l = labels_;
  l["table"] = table.spec().name;
  SparseSeries s;
  s.table_id = table.id();
  s.resident_rows = &sparse_resident_->Add(l);
  s.memory_bytes = &sparse_memory_->Add(l);
  for (const auto& [field, family] : sparse_counter_families_)
    s.counters.emplace_back(field, &family->Add(l));
  sparse_.push_back(std::move(s));
}

void ShardMetrics::SetResidentBytes(uint64_t bytes) { resident_->Set(static_cast<double>(bytes)); }

void ShardMetrics::Publish(const Shard& shard) {
  for (; tables_seen_ < shard.num_tables(); ++tables_seen_) {
    if (const ps::SparseTable* t = shard.sparse_table(static_cast<uint32_t>(tables_seen_)))
      AddSparseSeries(*t);
  }
  if (!sparse_.empty()) {
    memory_used_->Set(static_cast<double>(shard.memory_used_bytes()));
    for (SparseSeries& s : sparse_) {
      const ps::SparseTable* t = shard.sparse_table(s.table_id);
      if (t == nullptr) continue;
      const ps::SparseCounters c = t->counters();
      s.resident_rows->Set(static_cast<double>(c.resident_rows));
      s.memory_bytes->Set(static_cast<double>(c.memory_bytes));
      for (auto& [field, counter] : s.counters) {
        if (c.*field > s.published.*field)
          counter->Increment(static_cast<double>(c.*field - s.published.*field));
      }
      s.published = c;
    }
  }
  const ShardCounters& c = shard.counters();
  // A replica's new Shard (a snapshot installed) counts from 0: AdvanceCounter goes on.
  for (Mirrored& m : counters_) AdvanceCounter(*m.counter, c.*m.field, m.published);
  parked_pulls_->Set(static_cast<double>(shard.parked_pulls()));
  int64_t min_clock = shard.min_clock();
  int64_t max_clock = shard.max_clock();
  min_clock_->Set(static_cast<double>(min_clock));
  max_clock_->Set(static_cast<double>(max_clock));
  staleness_->Set(static_cast<double>(max_clock - min_clock));
  live_workers_->Set(static_cast<double>(shard.live_workers()));
  last_snapshot_clock_->Set(static_cast<double>(shard.last_snapshot_clock()));
  if (epochs_done_ != nullptr) {
    CoverageProgress p = shard.coverage().Progress();
    epochs_done_->Set(p.epochs_done);
    chunks_done_->Set(p.chunks_done);
  }
}

}  // namespace leash::server

// ShardMetrics: the leash_shard_* Prometheus metrics of one shard.
#include "leash/server/shard_metrics.h"

#include <string>

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
  auto mirror = [&](uint64_t ShardCounters::*field, const std::string& name,
                    const std::string& help) {
    counters_.push_back({field, AddCounter(r, l, name, help), 0});
  };
  mirror(&ShardCounters::pushes_applied, "leash_shard_pushes_total",
         "Pushes applied (each at most once).");
  mirror(&ShardCounters::pushes_duplicate, "leash_shard_duplicate_pushes_total",
         "Resent pushes that had been applied already: acknowledged, not applied again.");
  mirror(&ShardCounters::pulls_served, "leash_shard_pulls_total",
         "Pulls answered (at once or after being parked).");
  mirror(&ShardCounters::pulls_parked, "leash_shard_parked_pulls_total",
         "Pulls that had to wait for the minimum clock (the staleness bound).");
  mirror(&ShardCounters::bytes_in, "leash_shard_received_bytes_total",
         "Bytes of requests received.");
  mirror(&ShardCounters::bytes_out, "leash_shard_sent_bytes_total", "Bytes of replies sent.");
  mirror(&ShardCounters::errors, "leash_shard_errors_total", "Requests answered with an error.");
  mirror(
      &ShardCounters::limit_rejections, "leash_shard_limit_rejections_total",
      "Requests refused for exceeding a limit (message size, keys, parked pulls per connection).");
  mirror(&ShardCounters::nonfinite_pushes, "leash_shard_nonfinite_pushes_total",
         "Pushes holding NaN or Inf.");
  mirror(&ShardCounters::nonfinite_rows_skipped, "leash_shard_nonfinite_rows_skipped_total",
         "Rows of pushes skipped for holding NaN or Inf (--nonfinite skip-rows).");
  mirror(&ShardCounters::evictions, "leash_shard_evictions_total",
         "Workers evicted because their lease expired.");
  mirror(&ShardCounters::snapshots, "leash_shard_snapshots_total", "Snapshots written.");
  mirror(&ShardCounters::snapshot_failures, "leash_shard_snapshot_failures_total",
         "Snapshots that could not be written.");

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
  prometheus::Histogram* h = snapshot_seconds_;
  shard.set_snapshot_observer([h](double seconds) { h->Observe(seconds); });
  Publish(shard);
}

void ShardMetrics::Publish(const Shard& shard) {
  const ShardCounters& c = shard.counters();
  for (Mirrored& m : counters_) {
    uint64_t now = c.*m.field;
    if (now > m.published) {
      m.counter->Increment(static_cast<double>(now - m.published));
      m.published = now;
    }
  }
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

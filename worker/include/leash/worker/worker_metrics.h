// Publishes one worker's training progress and client counters as Prometheus metrics
// (leash_worker_*, label worker="NAME") in a registry: leash-worker feeds it from the
// trainer's step and epoch observers. The trainer and leash::Client know nothing of
// Prometheus. Not thread-safe itself (the training thread drives it); the registry is,
// so scrapes from the HTTP threads are safe at any time.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <string>
#include <vector>

#include "leash/worker/client.h"
#include "leash/worker/trainer.h"

namespace leash::worker {

class WorkerMetrics {
 public:
  // Rates and the loss are averaged over windows of at least this much training time.
  static constexpr double kWindowSeconds = 1.0;

  // Registers the worker's metrics in `registry` (which must outlive this object).
  // `client` (null when training --local) is read for its counters and must outlive
  // this object too.
  WorkerMetrics(prometheus::Registry& registry, const std::string& worker, int64_t staleness_bound,
                const Client* client);
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  // Records one iteration: counters, the clock, the staleness of the values read, and,
  // once a window is complete, samples/s and the mean loss over it (the first iteration
  // publishes its own at once, so the gauges are never empty while training).
  void OnStep(const StepReport& step);
  // Records a completed job epoch (its test accuracy when it was evaluated).
  void OnEpoch(const EpochResult& epoch);

 private:
  struct Mirrored {
    uint64_t ClientCounters::*field;
    prometheus::Counter* counter;
    uint64_t published = 0;
  };
  void PublishClient();

  const Client* client_;
  std::vector<Mirrored> client_counters_;
  prometheus::Counter* iterations_;
  prometheus::Counter* samples_;
  prometheus::Counter* rejoins_;
  prometheus::Gauge* samples_per_second_;
  prometheus::Gauge* loss_;
  prometheus::Gauge* clock_;
  prometheus::Gauge* staleness_;
  prometheus::Gauge* epoch_;
  prometheus::Gauge* epochs_done_;
  prometheus::Gauge* test_accuracy_;
  prometheus::Gauge* test_auc_;
  prometheus::Histogram* iteration_seconds_;

  bool started_ = false;
  bool published_rate_ = false;
  int64_t rejoins_published_ = 0;
  double window_start_ = 0;  // elapsed seconds of training when the window began
  int64_t window_samples_ = 0;
  double window_loss_ = 0;  // sum of loss * samples
};

}  // namespace leash::worker

// WorkerMetrics: the leash_worker_* Prometheus metrics of one worker.
#include "leash/worker/worker_metrics.h"

#include <algorithm>

#include "leash/common/metrics.h"

namespace leash::worker {
namespace {

prometheus::Counter* AddCounter(prometheus::Registry& r, const prometheus::Labels& l,
                                const std::string& name, const std::string& help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Labels(l).Register(r).Add({});
}

prometheus::Gauge* AddGauge(prometheus::Registry& r, const prometheus::Labels& l,
                            const std::string& name, const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Labels(l).Register(r).Add({});
}

}  // namespace

WorkerMetrics::WorkerMetrics(prometheus::Registry& r, const std::string& worker,
                             int64_t staleness_bound, const Client* client)
    : client_(client) {
  const prometheus::Labels l{{"worker", worker}};
  iterations_ = AddCounter(r, l, "leash_worker_iterations_total",
                           "Training iterations (pull, compute, push, clock).");
  samples_ = AddCounter(r, l, "leash_worker_samples_total", "Training samples processed.");
  rejoins_ = AddCounter(r, l, "leash_worker_rejoins_total",
                        "Times this worker rejoined the job after a shard forgot it.");
  samples_per_second_ =
      AddGauge(r, l, "leash_worker_samples_per_second",
               "Training samples per second over the last window of about a second.");
  loss_ = AddGauge(r, l, "leash_worker_loss",
                   "Mean training loss over the last window of about a second.");
  clock_ = AddGauge(r, l, "leash_worker_clock",
                    "This worker's clock: iterations finished and announced.");
  staleness_ = AddGauge(r, l, "leash_worker_staleness_iterations",
                        "Iterations between this worker's clock and the minimum clock its last "
                        "pulled values reflect.");
  AddGauge(r, l, "leash_worker_staleness_bound", "The staleness bound s this worker trains under.")
      ->Set(static_cast<double>(staleness_bound));
  epoch_ =
      AddGauge(r, l, "leash_worker_epoch", "Job epoch (1-based) of the data chunk being trained.");
  epochs_done_ = AddGauge(r, l, "leash_worker_epochs_done",
                          "Job epochs completed, as this worker last heard.");
  test_accuracy_ = AddGauge(
      r, l, "leash_worker_test_accuracy",
      "Test accuracy (0..1) when the job last completed an epoch (-1: not evaluated yet).");
  test_accuracy_->Set(-1);
  test_auc_ = AddGauge(r, l, "leash_worker_test_auc",
                       "Test AUC of a binary (click-through) model when the job last completed an "
                       "epoch (-1: not evaluated, or not a binary model).");
  test_auc_->Set(-1);
  iteration_seconds_ =
      &prometheus::BuildHistogram()
           .Name("leash_worker_iteration_duration_seconds")
           .Help("Wall time of one training iteration: pull, compute, push, clock.")
           .Labels(l)
           .Register(r)
           .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                            0.1, 0.25, 0.5, 1, 2.5, 5, 10});
  if (client_ != nullptr) {
    auto mirror = [&](uint64_t ClientCounters::*field, const std::string& name,
                      const std::string& help) {
      client_counters_.push_back({field, AddCounter(r, l, name, help), 0});
    };
    mirror(&ClientCounters::pushes, "leash_worker_pushes_total",
           "Gradient pushes (one per table and iteration).");
    mirror(&ClientCounters::pulls, "leash_worker_pulls_total",
           "Parameter pulls (one per table and iteration).");
    mirror(&ClientCounters::requests, "leash_worker_requests_total", "Requests sent to shards.");
    mirror(&ClientCounters::resends, "leash_worker_resends_total",
           "Requests resent to a shard that went silent.");
    mirror(&ClientCounters::backup_reply_resends, "leash_worker_backup_reply_resends_total",
           "Pushes and clocks resent to a shard's primary because its answering backup did not "
           "answer them (--backup-answers).");
    mirror(&ClientCounters::bytes_sent, "leash_worker_sent_bytes_total", "Bytes sent to shards.");
    mirror(&ClientCounters::bytes_received, "leash_worker_received_bytes_total",
           "Bytes received from shards.");
  }
}

void WorkerMetrics::PublishClient() {
  if (client_ == nullptr) return;
  ClientCounters c = client_->counters();
  for (Mirrored& m : client_counters_) AdvanceCounter(*m.counter, c.*m.field, m.published);
}

void WorkerMetrics::OnStep(const StepReport& step) {
  iterations_->Increment();
  samples_->Increment(static_cast<double>(step.samples));
  AdvanceCounter(*rejoins_, step.rejoins, rejoins_published_);
  iteration_seconds_->Observe(step.seconds);
  clock_->Set(static_cast<double>(step.clock));
  epoch_->Set(static_cast<double>(step.epoch) + 1);
  PublishClient();
  if (client_ != nullptr) {
    int64_t pulled = client_->counters().pulled_min_clock;
    if (pulled >= 0)
      staleness_->Set(static_cast<double>(std::max<int64_t>(0, step.clock - pulled)));
  }

  if (!started_) window_start_ = step.elapsed_seconds - step.seconds;
  started_ = true;
  window_samples_ += step.samples;
  window_loss_ += step.loss * static_cast<double>(step.samples);
  double span = step.elapsed_seconds - window_start_;
  if ((span >= kWindowSeconds || !published_rate_) && span > 0 && window_samples_ > 0) {
    samples_per_second_->Set(static_cast<double>(window_samples_) / span);
    loss_->Set(window_loss_ / static_cast<double>(window_samples_));
    published_rate_ = true;
    window_start_ = step.elapsed_seconds;
    window_samples_ = 0;
    window_loss_ = 0;
  }
}

void WorkerMetrics::OnEpoch(const EpochResult& epoch) {
  epochs_done_->Set(static_cast<double>(epoch.epoch));
  if (epoch.test_accuracy >= 0) test_accuracy_->Set(epoch.test_accuracy);
  if (epoch.test_auc >= 0) test_auc_->Set(epoch.test_auc);
}

}  // namespace leash::worker

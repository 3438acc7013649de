// Tests that WorkerMetrics turns step and epoch reports into counters, windowed
// samples/s and loss, and the test accuracy.
#include "leash/worker/worker_metrics.h"

#include <gtest/gtest.h>

#include "leash/common/metrics.h"

namespace leash::worker {
namespace {

double Value(const prometheus::Registry& r, const std::string& name) {
  auto v = CollectedValue(r, name, {{"worker", "w0"}});
  EXPECT_TRUE(v.has_value()) << name << " missing";
  return v.value_or(-1e9);
}

StepReport Step(int64_t step, double elapsed, double seconds, int64_t samples, double loss) {
  StepReport s;
  s.step = step;
  s.clock = step;
  s.epoch = 0;
  s.samples = samples;
  s.loss = loss;
  s.seconds = seconds;
  s.elapsed_seconds = elapsed;
  return s;
}

TEST(WorkerMetricsTest, PublishesTheFirstStepAtOnceThenWholeWindows) {
  prometheus::Registry r;
  WorkerMetrics m(r, "w0", 2, nullptr);
  EXPECT_EQ(Value(r, "leash_worker_staleness_bound"), 2);
  EXPECT_EQ(Value(r, "leash_worker_test_accuracy"), -1);
  EXPECT_EQ(Value(r, "leash_worker_samples_per_second"), 0);

  m.OnStep(Step(1, 0.6, 0.5, 50, 2.0));  // first step: 50 samples in 0.5 s
  EXPECT_EQ(Value(r, "leash_worker_samples_per_second"), 100);
  EXPECT_EQ(Value(r, "leash_worker_loss"), 2.0);
  m.OnStep(Step(2, 1.0, 0.4, 100, 1.0));  // window from 0.6 s: not complete yet
  EXPECT_EQ(Value(r, "leash_worker_samples_per_second"), 100);
  m.OnStep(Step(3, 1.6, 0.5, 100, 0.5));  // 200 samples in 1.0 s, mean loss 0.75
  EXPECT_DOUBLE_EQ(Value(r, "leash_worker_samples_per_second"), 200);
  EXPECT_DOUBLE_EQ(Value(r, "leash_worker_loss"), 0.75);

  EXPECT_EQ(Value(r, "leash_worker_iterations_total"), 3);
  EXPECT_EQ(Value(r, "leash_worker_samples_total"), 250);
  EXPECT_EQ(Value(r, "leash_worker_clock"), 3);
  EXPECT_EQ(Value(r, "leash_worker_epoch"), 1);
  EXPECT_EQ(Value(r, "leash_worker_iteration_duration_seconds_count"), 3);
  EXPECT_DOUBLE_EQ(Value(r, "leash_worker_iteration_duration_seconds_sum"), 1.4);
  // Without a client (--local) there are no wire metrics.
  EXPECT_FALSE(CollectedValue(r, "leash_worker_pushes_total").has_value());
}

TEST(WorkerMetricsTest, RecordsEpochsAndRejoins) {
  prometheus::Registry r;
  WorkerMetrics m(r, "w0", 0, nullptr);
  StepReport s = Step(1, 0.1, 0.1, 10, 1);
  s.rejoins = 2;
  m.OnStep(s);
  m.OnStep(s);
  EXPECT_EQ(Value(r, "leash_worker_rejoins_total"), 2);
  EpochResult e;
  e.epoch = 1;
  m.OnEpoch(e);  // not evaluated
  EXPECT_EQ(Value(r, "leash_worker_epochs_done"), 1);
  EXPECT_EQ(Value(r, "leash_worker_test_accuracy"), -1);
  e.epoch = 2;
  e.test_accuracy = 0.85;
  e.test_auc = 0.79;
  m.OnEpoch(e);
  EXPECT_EQ(Value(r, "leash_worker_epochs_done"), 2);
  EXPECT_DOUBLE_EQ(Value(r, "leash_worker_test_accuracy"), 0.85);
  EXPECT_DOUBLE_EQ(Value(r, "leash_worker_test_auc"), 0.79);
}

}  // namespace
}  // namespace leash::worker

// End-to-end: a persistent straggler (--step-delay-factor) among three real leash-worker
// processes and one leash-server shard, with backup workers (--backup-workers) and with
// work in proportion to speed (--global-batch). Asserts clocks, iterations, samples and
// coverage, never timings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>

#include "support/cluster.h"
#include "support/files.h"

namespace leash {
namespace {

using testing::Cluster;
using testing::JsonNumbers;
using testing::Process;
using testing::TempDir;

constexpr const char* kData = "/usr/share/datasets/fashion-mnist";
constexpr int kTrainSamples = 24000;

class StragglerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::string(kData) + "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST not found at " << kData;
    }
  }

  // Runs w0 and w1 at full speed and w2 `factor` times slower, each with `flags`, to the
  // end of one epoch; returns false (with a failed expectation) if one did not finish.
  // With `straggler_first`, w2 starts first and the others once it has registered: the job
  // lasts about a second, and a straggler slow to start on a loaded machine could otherwise
  // find every chunk taken and train nothing.
  bool RunJob(Cluster& cluster, double factor, const std::vector<std::string>& flags,
              bool straggler_first = false, int epochs = 1) {
    std::vector<std::unique_ptr<Process>> workers(3);
    for (int i : {2, 0, 1}) {
      std::vector<std::string> f = {"--epochs=" + std::to_string(epochs),
                                    "--chunk-size=500",
                                    "--train-limit=24000",
                                    "--test-limit=500",
                                    "--no-eval",
                                    "--log-every=0"};
      if (i == 2) f.push_back("--step-delay-factor=" + std::to_string(factor));
      f.insert(f.end(), flags.begin(), flags.end());
      auto& w = workers[static_cast<size_t>(i)];
      w = cluster.StartWorker("w" + std::to_string(i), f);
      if (i == 2 && straggler_first) {
        const bool registered = testing::WaitFor(
            [&] { return w->ReadLog().find("registered with") != std::string::npos; },
            std::chrono::seconds(60));
        EXPECT_TRUE(registered) << w->ReadLog();
        if (!registered) return false;
      }
    }
    bool ok = true;
    for (auto& w : workers) {
      auto code = w->Wait(std::chrono::minutes(5));
      EXPECT_TRUE(code.has_value() && *code == 0) << w->ReadLog();
      ok = ok && code.has_value() && *code == 0;
    }
    return ok;
  }

  // One number of worker `i`'s metrics file (the first if several).
  double Metric(const Cluster& cluster, int i, const std::string& key) {
    auto v = JsonNumbers(cluster.WorkerMetrics("w" + std::to_string(i)), key);
    EXPECT_FALSE(v.empty()) << key << " of w" << i;
    return v.empty() ? -1 : v[0];
  }

  // The samples worker `i` trained of epoch `epoch` (numbered from 1; 0 if none).
  double EpochSamples(const Cluster& cluster, int i, int epoch) {
    const std::string path = cluster.WorkerMetrics("w" + std::to_string(i));
    auto epochs = JsonNumbers(path, "epoch");
    auto samples = JsonNumbers(path, "samples");
    EXPECT_EQ(epochs.size(), samples.size()) << path;
    for (size_t k = 0; k < std::min(epochs.size(), samples.size()); ++k) {
      if (epochs[k] == epoch) return samples[k];
    }
    return 0;
  }

  // Coverage is exact: the three workers together trained every sample of each of the
  // job's `epochs` once.
  void ExpectEachEpochTrainedOnce(const Cluster& cluster, int epochs) {
    for (int e = 1; e <= epochs; ++e) {
      double n = 0;
      for (int i = 0; i < 3; ++i) n += EpochSamples(cluster, i, e);
      EXPECT_EQ(n, kTrainSamples) << "epoch " << e;
    }
  }

  TempDir dir_;
};

TEST_F(StragglerTest, WithABackupWorkerTheFastWorkersAdvanceAtTheirOwnRate) {
  Cluster cluster(1, dir_.path(), {"--backup-workers=1"});
  // Two epochs, the rates judged in the second: the straggler starts first (so that it has
  // chunks to train) and the first epoch is well under a second of the fast workers'
  // training, so on a loaded machine the straggler trains much of it alone while they start
  // (seen in CI: w0 224, w1 0, w2 160 iterations, w1 still starting when the epoch ended).
  ASSERT_TRUE(RunJob(cluster, 30, {"--staleness=1"}, /*straggler_first=*/true, /*epochs=*/2));
  const double fast0 = Metric(cluster, 0, "iterations");
  const double fast1 = Metric(cluster, 1, "iterations");
  const double slow = Metric(cluster, 2, "iterations");
  const double clock =
      std::max(Metric(cluster, 0, "final_clock"), Metric(cluster, 1, "final_clock"));
  const double slow_clock = Metric(cluster, 2, "final_clock");
  double second[3];
  for (int i = 0; i < 3; ++i) second[i] = EpochSamples(cluster, i, 2);
  std::printf(
      "iterations: w0 %.0f, w1 %.0f, w2 (30x slower) %.0f; final clocks: the fast workers' %.0f, "
      "w2's %.0f; second epoch's samples %.0f %.0f %.0f\n",
      fast0, fast1, slow, clock, slow_clock, second[0], second[1], second[2]);
  for (int i = 0; i < 3; ++i) {
    std::printf("w%d: compute %.3f s, injected delay %.3f s, pull %.3f s, train %.3f s\n", i,
                Metric(cluster, i, "compute_seconds"), Metric(cluster, i, "injected_delay_seconds"),
                Metric(cluster, i, "pull_seconds"), Metric(cluster, i, "train_seconds"));
  }
  // Under SSP the job's clock cannot pass the straggler's by more than the bound (1 here), and
  // the fast workers train about as many iterations as it does. Left out of the minimum, it
  // holds nobody back: the clock moves at the fast workers' pace, at least twice the
  // straggler's count, and in the second epoch, when all three train, the two together
  // train at least three times its samples. Not asserted per fast worker: on a loaded
  // machine one of them can be starved of CPU (seen in CI: w0 104, w1 208, w2 72
  // iterations) while the clock still moves at the other's pace.
  EXPECT_GE(clock, 2 * slow) << "clock " << clock << ", w2 " << slow;
  EXPECT_GE(second[0] + second[1], 3 * second[2])
      << "second epoch: w0 " << second[0] << ", w1 " << second[1] << ", w2 " << second[2];
  // The straggler caught up with the minimum rather than trailing it by its own count.
  EXPECT_GT(slow_clock, slow);
  // Coverage is exact: every sample of each epoch trained once, by one worker or another.
  ExpectEachEpochTrainedOnce(cluster, 2);
  // Its pushes, computed on values the fast workers had moved more than one clock past
  // by the time they arrived, were dropped and counted.
  auto stats = cluster.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->at(0).backup_workers, 1u);
  EXPECT_GT(stats->at(0).stale_pushes_dropped, 0u);
}

TEST_F(StragglerTest, WorkInProportionToSpeedKeepsClocksTogetherWhileTheStragglerTrainsLess) {
  Cluster cluster(1, dir_.path());
  // Two epochs, the shares judged in the second: the first is about a second long, and on a
  // loaded machine the fast workers can start so late that the straggler, alone and with
  // the whole global batch, trains much of it before there is anyone to share with (seen
  // in CI: w2 7500 samples against the fast workers' mean of 8250). By the second epoch all
  // three have trained together for a hundred clocks or more.
  ASSERT_TRUE(RunJob(cluster, 4, {"--staleness=1", "--global-batch=192", "--batch=64"},
                     /*straggler_first=*/false, /*epochs=*/2));
  double clock[3], samples[3];
  for (int i = 0; i < 3; ++i) {
    clock[i] = Metric(cluster, i, "final_clock");
    samples[i] = EpochSamples(cluster, i, 2);
  }
  std::printf("final clocks %.0f %.0f %.0f; second epoch's samples %.0f %.0f %.0f (w2 4x slower)\n",
              clock[0], clock[1], clock[2], samples[0], samples[1], samples[2]);
  // The clocks stay together (the bound holds them within s = 1 of the minimum while all
  // three train) ...
  for (int i = 1; i < 3; ++i) EXPECT_LE(std::abs(clock[i] - clock[0]), 3) << "w" << i;
  // ... while the 4x slower worker trains a smaller share of the samples: with equal
  // batches it would train as many as each fast one. Held against the fast workers' mean,
  // not each: on a loaded machine one of them can be starved of CPU, measure itself slow
  // and rightly train a small share too (seen with the other straggler test beside it:
  // w0 4500, w1 16000, w2 3500 samples).
  const double fast_mean = (samples[0] + samples[1]) / 2;
  EXPECT_LT(samples[2], 0.6 * fast_mean) << samples[2] << " vs " << fast_mean;
  // Coverage is exact, epoch by epoch.
  ExpectEachEpochTrainedOnce(cluster, 2);
  // A step per push (the default): nothing summed.
  auto stats = cluster.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->at(0).clock_steps, 0u);
  EXPECT_EQ(stats->at(0).pushes_summed, 0u);
  // --lr (0.01, momentum, the defaults) keeps its step per sample: every worker gives the
  // shard's optimizer 0.01 x 192 / 64 for the pushes weighted by samples / 192.
  for (int i = 0; i < 3; ++i) {
    std::ifstream in(std::string(dir_.path()) + "/w" + std::to_string(i) + ".log");
    std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(log.find("the shards' momentum at learning rate 0.03,"), std::string::npos) << log;
  }
}

// With --clock-steps the shard sums the weighted pushes of each iteration into one step per
// table (at most one per table and clock the job reached), not one step per push, and the
// workers give its momentum the decay of global-batch / batch pushes.
TEST_F(StragglerTest, WithClockStepsTheShardStepsOncePerTableAndClock) {
  Cluster cluster(1, dir_.path());
  ASSERT_TRUE(
      RunJob(cluster, 4, {"--staleness=0", "--global-batch=192", "--batch=64", "--clock-steps"}));
  double clock[3], samples[3];
  for (int i = 0; i < 3; ++i) {
    clock[i] = Metric(cluster, i, "final_clock");
    samples[i] = Metric(cluster, i, "samples");
  }
  EXPECT_EQ(samples[0] + samples[1] + samples[2], kTrainSamples);
  auto stats = cluster.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  const ShardStats& st = stats->at(0);
  const double last_clock = std::max({clock[0], clock[1], clock[2]});
  std::printf("clock steps %llu on %llu pushes summed, %zu tables, last clock %.0f\n",
              static_cast<unsigned long long>(st.clock_steps),
              static_cast<unsigned long long>(st.pushes_summed), st.tables.size(), last_clock);
  EXPECT_GT(st.clock_steps, 0u);
  EXPECT_LE(static_cast<double>(st.clock_steps),
            last_clock * static_cast<double>(st.tables.size()));
  EXPECT_GT(st.pushes_summed, st.clock_steps);  // steps that summed more than one push
  for (int i = 0; i < 3; ++i) {
    std::ifstream in(std::string(dir_.path()) + "/w" + std::to_string(i) + ".log");
    std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // 0.01 x 3 x (1 - 0.9^3) / (1 - 0.9) and 0.9^3.
    EXPECT_NE(log.find("the shards' momentum at learning rate 0.0813, momentum 0.729,"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("one step per clock on their sum"), std::string::npos);
  }
}

}  // namespace
}  // namespace leash

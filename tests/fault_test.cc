// Fault tests with real processes: workers killed, paused past their lease, added and
// removed while a job trains; a shard killed and restarted; a push delivered twice.
// Every process is started by the test and killed by PID when the test ends.
#include <gtest/gtest.h>
#include <signal.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>
#include <variant>
#include <zmq.hpp>

#include "leash/common/wire.h"
#include "support/cluster.h"

namespace leash {
namespace {

using namespace std::chrono_literals;
using testing::Cluster;
using testing::Process;
using testing::TempDir;
using testing::WaitFor;
using SteadyClock = std::chrono::steady_clock;

int64_t Ms(SteadyClock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

// Minimum clock over shards (-1 if a shard does not answer).
int64_t MinClock(Cluster& c) {
  auto s = c.Stats();
  if (!s.ok()) return -1;
  int64_t m = INT64_MAX;
  for (const auto& st : *s) m = std::min(m, st.min_clock);
  return m;
}

// Live workers as seen by every shard (-1 if shards disagree or do not answer).
int LiveWorkers(Cluster& c) {
  auto s = c.Stats();
  if (!s.ok()) return -1;
  int n = static_cast<int>((*s)[0].workers.size());
  for (const auto& st : *s) {
    if (static_cast<int>(st.workers.size()) != n) return -1;
  }
  return n;
}

// Clock of worker `name` on shard 0, -1 if it is not live there.
int64_t WorkerClock(Cluster& c, const std::string& name) {
  auto s = c.Stats();
  if (!s.ok()) return -1;
  for (const auto& w : (*s)[0].workers) {
    if (w.name == name) return w.clock;
  }
  return -1;
}

// Processes whose parent is this test process (alive or zombie).
std::vector<int> ChildProcesses() {
  std::vector<int> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "stat");
    std::string stat;
    std::getline(f, stat);
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state;
    int ppid = 0;
    rest >> state >> ppid;
    if (ppid == getpid()) out.push_back(std::stoi(name));
  }
  return out;
}

// Every fault test must leave no process behind, whatever its outcome.
class FaultTest : public ::testing::Test {
 protected:
  void TearDown() override {
    EXPECT_TRUE(ChildProcesses().empty()) << "a test left processes behind";
  }
};

const std::vector<std::string> kQuickJob = {"--train-limit=6000", "--test-limit=1000",
                                            "--chunk-size=250",   "--log-every=0",
                                            "--batch=32",         "--connect-timeout=30"};

std::vector<std::string> Job(std::vector<std::string> more) {
  std::vector<std::string> f = kQuickJob;
  f.insert(f.end(), more.begin(), more.end());
  return f;
}

TEST_F(FaultTest, KilledWorkerStallsBulkSynchronousSurvivorsUntilItsLeaseEvictsIt) {
  TempDir dir;
  constexpr int64_t kLeaseMs = 2000;
  Cluster cluster(2, dir.path(), {"--lease-timeout=2s"});
  std::vector<std::unique_ptr<Process>> w;
  for (int i = 0; i < 3; ++i) {
    w.push_back(cluster.StartWorker("w" + std::to_string(i),
                                    Job({"--epochs=3", "--staleness=0", "--no-eval"})));
  }
  ASSERT_TRUE(WaitFor([&] { return LiveWorkers(cluster) == 3; }, 90s)) << w[0]->ReadLog();
  // A worker that joins late starts at the others' clock: wait until w2 has trained a few
  // iterations of its own, so it holds a data chunk when it dies (the others can reach
  // clock 30 before it has even loaded the data set).
  const int64_t joined_at = WorkerClock(cluster, "w2");
  ASSERT_TRUE(WaitFor(
      [&] { return MinClock(cluster) >= 30 && WorkerClock(cluster, "w2") >= joined_at + 3; }, 90s))
      << w[2]->ReadLog();
  w[2]->Kill();
  auto killed_at = SteadyClock::now();
  int64_t dead_clock = WorkerClock(cluster, "w2");
  ASSERT_GE(dead_clock, 30);
  // Survivors go past the dead worker's clock only once its lease has run out and the
  // shards evicted it. (How soon after the lease is a ShardTest with an injected clock:
  // ExpiredLeaseEvictsAndReleasesParkedPulls. Here the stall is printed, not judged, as
  // a loaded machine stretches it.)
  ASSERT_TRUE(WaitFor([&] { return MinClock(cluster) > dead_clock; }, 300s));
  int64_t stall_ms = Ms(SteadyClock::now() - killed_at);
  std::printf("survivors resumed %lld ms after the kill (lease %lld ms)\n",
              static_cast<long long>(stall_ms), static_cast<long long>(kLeaseMs));
  for (int s = 0; s < 2; ++s) {
    EXPECT_NE(cluster.shard(s).ReadLog().find("'w2' at clock"), std::string::npos)
        << "shard " << s << " evicted w2 when its lease ran out\n"
        << cluster.shard(s).ReadLog();
  }
  EXPECT_EQ(LiveWorkers(cluster), 2);
  for (int i = 0; i < 2; ++i) {
    auto code = w[static_cast<size_t>(i)]->Wait(180s);
    ASSERT_TRUE(code.has_value()) << "worker " << i << " did not finish";
    EXPECT_EQ(*code, 0) << w[static_cast<size_t>(i)]->ReadLog();
  }
  auto stats = cluster.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ((*stats)[0].coverage.epochs_done, 3u) << "every chunk of every epoch was trained";
  EXPECT_NE(cluster.shard(0).ReadLog().find("go to other workers"), std::string::npos)
      << "the dead worker's chunk was handed to a survivor";
}

TEST_F(FaultTest, WorkerJoinsLiveAtTheMinimumClockAndLeavesAtOnce) {
  TempDir dir;
  Cluster cluster(2, dir.path(), {"--lease-timeout=30s"});
  auto first = cluster.StartWorker("first", Job({"--epochs=50", "--staleness=1", "--no-eval"}));
  ASSERT_TRUE(WaitFor([&] { return MinClock(cluster) >= 40; }, 90s)) << first->ReadLog();
  int64_t before = MinClock(cluster);
  auto second = cluster.StartWorker("second", Job({"--epochs=50", "--staleness=1", "--no-eval"}));
  ASSERT_TRUE(WaitFor([&] { return LiveWorkers(cluster) == 2; }, 60s)) << second->ReadLog();
  int64_t joined = WorkerClock(cluster, "second");
  EXPECT_GE(joined, before) << "a joining worker starts at the current minimum clock, not at 0";
  ASSERT_TRUE(WaitFor([&] { return WorkerClock(cluster, "second") >= joined + 20; }, 60s))
      << second->ReadLog();
  second->Signal(SIGTERM);
  auto t0 = SteadyClock::now();
  ASSERT_TRUE(WaitFor([&] { return LiveWorkers(cluster) == 1; }, 300s)) << second->ReadLog();
  int64_t gone_ms = Ms(SteadyClock::now() - t0);
  std::printf("a worker stopped with SIGTERM was dropped after %lld ms (lease 30000 ms)\n",
              static_cast<long long>(gone_ms));
  // A graceful leave does not wait for the lease: every shard dropped it on its leave
  // message, none evicted it.
  for (int s = 0; s < 2; ++s) {
    const std::string log = cluster.shard(s).ReadLog();
    EXPECT_NE(log.find("'second' left"), std::string::npos) << "shard " << s << "\n" << log;
    EXPECT_EQ(log.find("evicting worker"), std::string::npos) << "shard " << s << "\n" << log;
  }
  auto code = second->Wait(300s);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << second->ReadLog();
  int64_t after = MinClock(cluster);
  EXPECT_TRUE(WaitFor([&] { return MinClock(cluster) >= after + 20; }, 60s))
      << "the first worker goes on";
}

TEST_F(FaultTest, PausedWorkerIsEvictedThenRejoinsWithANewIncarnation) {
  TempDir dir;
  Cluster cluster(2, dir.path(), {"--lease-timeout=1500ms"});
  auto a = cluster.StartWorker("a", Job({"--epochs=60", "--staleness=0", "--no-eval"}));
  auto b = cluster.StartWorker("b", Job({"--epochs=60", "--staleness=0", "--no-eval"}));
  ASSERT_TRUE(WaitFor([&] { return LiveWorkers(cluster) == 2 && MinClock(cluster) >= 20; }, 90s))
      << b->ReadLog();
  b->Signal(SIGSTOP);
  ASSERT_TRUE(WaitFor([&] { return LiveWorkers(cluster) == 1; }, 300s))
      << "the paused worker is evicted";
  int64_t evicted_at = MinClock(cluster);
  ASSERT_TRUE(WaitFor([&] { return MinClock(cluster) >= evicted_at + 20; }, 60s))
      << "the other worker went on";
  b->Signal(SIGCONT);
  ASSERT_TRUE(WaitFor([&] { return LiveWorkers(cluster) == 2; }, 30s)) << b->ReadLog();
  int64_t rejoined = WorkerClock(cluster, "b");
  ASSERT_TRUE(WaitFor([&] { return WorkerClock(cluster, "b") >= rejoined + 10; }, 60s))
      << b->ReadLog();
  EXPECT_NE(b->ReadLog().find("rejoining as incarnation"), std::string::npos) << b->ReadLog();
  a->Signal(SIGTERM);
  b->Signal(SIGTERM);
  EXPECT_EQ(a->Wait(30s), 0) << a->ReadLog();
  EXPECT_EQ(b->Wait(30s), 0) << b->ReadLog();
}

TEST_F(FaultTest, StopSignalWithAShardDownExitsAfterTheLeaveTimeoutInsteadOfHanging) {
  TempDir dir;
  Cluster cluster(2, dir.path());
  auto w = cluster.StartWorker(
      "w", Job({"--epochs=100", "--staleness=0", "--no-eval", "--leave-timeout=2"}));
  ASSERT_TRUE(WaitFor([&] { return MinClock(cluster) >= 20; }, 90s)) << w->ReadLog();
  cluster.shard(1).Kill();  // and it never comes back
  std::this_thread::sleep_for(300ms);
  w->Signal(SIGTERM);
  // The leave to the dead shard times out (--leave-timeout=2) and the worker exits; a
  // worker that hangs never does, so the deadline only ends a stuck run.
  auto code = w->Wait(300s);
  ASSERT_TRUE(code.has_value()) << "the worker hung after SIGTERM\n" << w->ReadLog();
  EXPECT_EQ(*code, 3) << w->ReadLog();
  EXPECT_NE(w->ReadLog().find("exiting without leaving"), std::string::npos) << w->ReadLog();
}

TEST_F(FaultTest, SamePushDeliveredTwiceIsAppliedOnce) {
  TempDir dir;
  Cluster cluster(1, dir.path());
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::rcvtimeo, 10000);
  s.connect(cluster.endpoints()[0]);
  auto send = [&](const Message& m) {
    for (size_t i = 0; i < m.size(); ++i) {
      s.send(zmq::buffer(m[i].data(), m[i].size()),
             i + 1 < m.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  };
  auto reply = [&]() -> Message {
    Message m;
    while (true) {
      zmq::message_t part;
      if (!s.recv(part)) return m;
      bool more = part.more();
      m.push_back(Frame::Copy(part.data(), part.size()));
      if (!more) return m;
    }
  };
  TableSpec spec;
  spec.name = "w";
  spec.rows = 2;
  spec.cols = 1;
  spec.optimizer.lr = 1.f;
  send(MakeCreateTable(1, spec));
  ASSERT_TRUE(std::holds_alternative<TableCreated>(DecodeReply(reply()).value().value));
  send(MakeRegister(2, 77, 1, "dup"));
  ASSERT_TRUE(std::holds_alternative<Welcome>(DecodeReply(reply()).value().value));
  Message push = MakePush(3, 0, Rows::Range(0, 2), 77, 1, 1, DType::kF32,
                          EncodeValues(std::vector<float>{1, 2}, DType::kF32));
  send(push);
  Message r1 = reply();
  send(push);  // the client's retry after a lost reply
  Message r2 = reply();
  auto d1 = DecodeReply(r1);
  auto d2 = DecodeReply(r2);
  ASSERT_TRUE(d1.ok() && d2.ok());
  ASSERT_TRUE(std::holds_alternative<PushReply>(d1->value) &&
              std::holds_alternative<PushReply>(d2->value));
  EXPECT_TRUE(std::get<PushReply>(d1->value).applied);
  EXPECT_FALSE(std::get<PushReply>(d2->value).applied);
  send(MakePull(4, 0, Rows::Range(0, 2), 77, 0, 0));
  Message pulled = reply();
  std::vector<float> v(2);
  ASSERT_TRUE(DecodeValues(pulled.at(1), DType::kF32, 2, v.data()).ok());
  EXPECT_EQ(v, (std::vector<float>{-1, -2}));
}

TEST_F(FaultTest, KilledShardRecoversItsLastSnapshotAndTheJobFinishes) {
  TempDir dir;
  // The job must outlast the first periodic snapshot by a margin: on idle cores the
  // workers train 4 epochs of the quick job in well under a second.
  Cluster cluster(2, dir.path(), {"--lease-timeout=5s", "--checkpoint-interval=500ms"});
  auto a = cluster.StartWorker("a", Job({"--epochs=16", "--staleness=1"}));
  auto b = cluster.StartWorker("b", Job({"--epochs=16", "--staleness=1"}));
  ASSERT_TRUE(WaitFor([&] { return MinClock(cluster) >= 60; }, 90s)) << a->ReadLog();
  // The sequence number and clock of the last snapshot in a shard's log.
  auto last_snapshot = [](const std::string& log) {
    std::regex snap_re("snapshot #([0-9]+) at clock ([0-9]+) written");
    std::pair<std::string, int64_t> last{"", -1};
    for (auto it = std::sregex_iterator(log.begin(), log.end(), snap_re);
         it != std::sregex_iterator(); ++it) {
      last = {(*it)[1], std::stoll((*it)[2])};
    }
    return last;
  };
  // Kill it once it holds a periodic snapshot taken while the job was training.
  ASSERT_TRUE(WaitFor([&] { return last_snapshot(cluster.shard(1).ReadLog()).second >= 20; }, 30s));
  cluster.shard(1).Kill();
  ASSERT_FALSE(a->Wait(0ms).has_value() && b->Wait(0ms).has_value())
      << "the job ended before the shard was killed: nothing to recover during training";
  std::string before = cluster.shard(1).ReadLog();
  auto [last_seq, clock] = last_snapshot(before);
  std::string last_clock = std::to_string(clock);
  std::this_thread::sleep_for(1s);
  cluster.Start(1);
  auto ca = a->Wait(90s);
  auto cb = b->Wait(ca ? 90s : 1s);
  if (!ca || !cb) {
    auto st = cluster.Stats();
    std::string where;
    if (st.ok()) {
      for (const auto& sh : *st) {
        where += "shard " + std::to_string(sh.shard) + " min clock " +
                 std::to_string(sh.min_clock) + " parked " + std::to_string(sh.parked_pulls) + ";";
        for (const auto& w : sh.workers) where += " " + w.name + "@" + std::to_string(w.clock);
        where += "\n";
      }
    }
    FAIL() << "workers did not finish\n"
           << where << "--- a\n"
           << a->ReadLog() << "--- b\n"
           << b->ReadLog() << "--- shard 1\n"
           << cluster.shard(1).ReadLog();
  }
  EXPECT_EQ(*ca, 0) << a->ReadLog();
  EXPECT_EQ(*cb, 0) << b->ReadLog();
  std::string after = cluster.shard(1).ReadLog().substr(before.size());
  EXPECT_NE(after.find("recovered snapshot #" + last_seq + " "), std::string::npos) << after;
  EXPECT_NE(after.find("at clock " + last_clock + ":"), std::string::npos) << after;
  auto stats = cluster.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ((*stats)[0].coverage.epochs_done, 16u);
  EXPECT_NE(a->ReadLog().find("final test accuracy"), std::string::npos);
  // The workers noticed the restart and sent again what the dead shard had lost.
  EXPECT_NE((a->ReadLog() + b->ReadLog()).find("shard 1 restarted; resent"), std::string::npos)
      << a->ReadLog();
}

}  // namespace
}  // namespace leash

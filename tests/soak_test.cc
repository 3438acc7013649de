// Soak test (ctest label `soak`, not in the default run): a real job on full Fashion-MNIST
// (2 replicated shards of 2 replicas each, coordinated through a real etcd; 4 MLP workers
// that follow the primaries) that for a bounded window SIGKILLs, SIGTERMs and restarts
// workers at random (seeded; the seed is logged) and SIGKILLs shard 1's primary repeatedly
// (3 times, restarting it as a backup each time; the backup takes over within the etcd
// lease). At the end every table on every shard is finite, the job's epochs are complete
// (leashctl --json status), every replica is back in sync, and the long-lived processes
// (shard 0's two replicas, and one worker never killed) neither leaked file descriptors nor
// grew in RSS beyond a stated bound.
//
// Runs only when LEASH_SOAK=1 (otherwise it skips; also without etcd). LEASH_SOAK_SECONDS
// sets the chaos window (default 200), LEASH_SOAK_EPOCHS the job's epochs (default: one per
// 4 s of the window), LEASH_SOAK_SEED the seed. Every process is started by the test and
// killed by PID when it ends. Single-threaded.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "support/cluster.h"
#include "support/etcd_process.h"
#include "support/replicated_cluster.h"

namespace leash {
namespace {

using namespace std::chrono_literals;
using testing::EtcdProcess;
using testing::Process;
using testing::ReplicatedCluster;
using testing::TempDir;
using testing::WaitFor;
using SteadyClock = std::chrono::steady_clock;

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoll(v, nullptr, 10) : fallback;
}

// Resident set of `pid` in KiB (VmRSS), -1 if it is gone.
int64_t RssKiB(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoll(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

// Open file descriptors of `pid`, -1 if it is gone.
int OpenFds(pid_t pid) {
  DIR* d = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// The open file descriptors of `pid` by kind: "files under <dir>" (a shard's RocksDB table,
// log and manifest files: their number follows flushes and compactions, not the job),
// "TCP socket to etcd" (connections to port `etcd_port`: each etcd client handle's libcurl
// keeps one alive), "TCP socket" (every other connection and listener), "other socket"
// (socket pairs: each etcd client handle's libcurl keeps one), and everything else by its
// target with any number stripped ("anon_inode:[eventfd]", "pipe:[]",
// "/dev/shm/leash-shm-.bell"). Empty if it is gone.
std::map<std::string, int> FdKinds(pid_t pid, const std::string& dir, int etcd_port) {
  std::map<std::string, int> kinds;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  std::set<std::string> tcp, to_etcd;
  for (const testing::TcpSocket& s : testing::TcpSocketsOf(pid))
    (s.remote_port == etcd_port ? to_etcd : tcp).insert(s.inode);
  DIR* d = opendir(fd_dir.c_str());
  if (d == nullptr) return kinds;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[4096];
    ssize_t n = readlink((fd_dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
    if (n < 0) continue;  // closed while listing
    std::string t(target, static_cast<size_t>(n));
    if (t.rfind(dir, 0) == 0) {
      t = "files under " + dir;
    } else if (t.rfind("socket:[", 0) == 0) {
      const std::string inode = t.substr(8, t.size() - 9);
      t = tcp.count(inode)       ? "TCP socket"
          : to_etcd.count(inode) ? "TCP socket to etcd"
                                 : "other socket";
    } else {
      t = std::regex_replace(t, std::regex(R"([0-9]+)"), "");
    }
    ++kinds[t];
  }
  closedir(d);
  return kinds;
}

int Count(const std::map<std::string, int>& kinds, const std::string& kind) {
  auto it = kinds.find(kind);
  return it == kinds.end() ? 0 : it->second;
}

// The descriptors that must come back to their number at rest: all but RocksDB's files and
// the etcd client's pooled handles (their socket pairs and their connections to etcd), both
// bounded apart.
int FdsBackAtRest(const std::map<std::string, int>& kinds, const std::string& dir) {
  int n = 0;
  for (const auto& [kind, count] : kinds) {
    const bool apart =
        kind == "files under " + dir || kind == "other socket" || kind == "TCP socket to etcd";
    n += apart ? 0 : count;
  }
  return n;
}

std::string FdKindsString(const std::map<std::string, int>& kinds) {
  std::string s;
  for (const auto& [kind, count] : kinds)
    s += (s.empty() ? "" : ", ") + std::to_string(count) + " " + kind;
  return s;
}

struct Sample {
  double t = 0;  // seconds since the chaos started
  int64_t rss_kib = 0;
  int fds = 0;
};

// RSS and fd samples of one long-lived process.
struct Series {
  std::string name;
  pid_t pid = -1;
  std::vector<Sample> samples;

  void Take(double t) {
    int64_t rss = RssKiB(pid);
    int fds = OpenFds(pid);
    if (rss >= 0 && fds >= 0) samples.push_back({t, rss, fds});
  }
  // The first sample at or after time t.
  const Sample& At(double t) const {
    for (const Sample& s : samples) {
      if (s.t >= t) return s;
    }
    return samples.back();
  }
  int64_t MaxRssFrom(double t) const {
    int64_t m = 0;
    for (const Sample& s : samples) {
      if (s.t >= t) m = std::max(m, s.rss_kib);
    }
    return m;
  }
};

// leashctl --json status of the job in etcd, or "" if it failed.
std::string LeashctlStatus(const std::string& etcd, const std::string& job,
                           const std::string& dir) {
  Process p({LEASHCTL_BIN, "--etcd=" + etcd, "--job=" + job, "--json", "status"},
            dir + "/leashctl.out");
  auto code = p.Wait(30s);
  std::string out = p.ReadLog();
  std::remove((dir + "/leashctl.out").c_str());
  return code == std::optional<int>(0) ? out : "";
}

// Pulls every table of every shard through an unregistered client and counts the values
// that are NaN or Inf. Tables are numbered by creation order on each shard, which Stats lists.
Result<std::pair<size_t, size_t>> NonFiniteValues(ReplicatedCluster& c) {
  auto client = c.Follower("soak-checker", /*register_worker=*/false);
  if (!client) return Unavailable("cannot reach the cluster");
  LEASH_ASSIGN_OR_RETURN(std::vector<ShardStats> stats, client->Stats());
  size_t values = 0;
  size_t bad = 0;
  for (size_t t = 0; t < stats[0].tables.size(); ++t) {
    TableHandle h;
    h.name = stats[0].tables[t].name;
    h.rows = stats[0].tables[t].rows;
    h.cols = stats[0].tables[t].cols;
    for (const ShardStats& s : stats) {
      uint32_t id = UINT32_MAX;
      for (size_t i = 0; i < s.tables.size(); ++i) {
        if (s.tables[i].name == h.name) id = static_cast<uint32_t>(i);
      }
      if (id == UINT32_MAX)
        return NotFound("shard " + std::to_string(s.shard) + " lacks table " + h.name);
      h.shard_ids.push_back(id);
    }
    std::vector<float> v(h.size());
    LEASH_RETURN_IF_ERROR(client->Pull(h, v.data()).get());
    for (float x : v) bad += !std::isfinite(x);
    values += v.size();
  }
  return std::make_pair(values, bad);
}

TEST(SoakTest, JobSurvivesRandomWorkerKillsAndRepeatedPrimaryKillsWithoutLeaks) {
  if (EnvInt("LEASH_SOAK", 0) != 1)
    GTEST_SKIP() << "set LEASH_SOAK=1 to run the soak test (ctest -L soak)";
  if (std::string why = EtcdProcess::SkipReason(); !why.empty()) GTEST_SKIP() << why;
  const int64_t window_s = std::max<int64_t>(20, EnvInt("LEASH_SOAK_SECONDS", 200));
  // About 4.5 s per epoch on the 2-core development machine under load unreplicated, more
  // with every shard's backup applying the same pushes: the job outlasts the window, and the
  // drain after it finishes the rest.
  const int64_t epochs = std::max<int64_t>(2, EnvInt("LEASH_SOAK_EPOCHS", window_s / 4));
  const auto seed = static_cast<uint64_t>(
      EnvInt("LEASH_SOAK_SEED", static_cast<int64_t>(std::random_device{}() % 1000000)));
  std::printf(
      "soak: seed %llu (LEASH_SOAK_SEED to repeat), window %llds, %lld epochs of full "
      "Fashion-MNIST, 2 shards x 2 replicas\n",
      static_cast<unsigned long long>(seed), static_cast<long long>(window_s),
      static_cast<long long>(epochs));
  std::fflush(stdout);
  std::mt19937_64 rng(seed);
  auto uniform = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };

  TempDir dir;
  EtcdProcess etcd(dir.path());
  const std::string job = "soak";
  ReplicatedCluster::Options co;
  co.dir = dir.path();
  co.etcd = etcd.endpoint();
  co.job = job;
  co.num_shards = 2;
  co.replicas = 2;
  co.extra = {"--lease-timeout=3s", "--checkpoint-interval=5s"};
  ReplicatedCluster cluster(co);
  ASSERT_TRUE(WaitFor([&] { return cluster.AllInSync(); }, 60s)) << cluster.Logs();
  // --lr: up to kSlots workers push at once; the default 0.01 with momentum diverged in CI
  // once (NaN gradients, a worker exited 1); docs/running.md advises lr / N.
  const std::vector<std::string> flags_common = {"--epochs=" + std::to_string(epochs),
                                                 "--staleness=2",
                                                 "--lr=0.0025",
                                                 "--batch=64",
                                                 "--chunk-size=2000",
                                                 "--log-every=0",
                                                 "--connect-timeout=60",
                                                 "--leave-timeout=15",
                                                 "--threads=1"};
  auto flags = [&](bool eval) {
    auto f = flags_common;
    if (!eval) f.push_back("--no-eval");
    return f;
  };

  // Shard 0's replicas are never killed: their fds at rest (peers connected, no worker).
  const std::array<pid_t, 2> shard0 = {cluster.replica(0, 0).pid(), cluster.replica(0, 1).pid()};
  const std::string& etcd_url = etcd.endpoint();
  const int etcd_port = std::stoi(etcd_url.substr(etcd_url.rfind(':') + 1));
  const std::array<std::map<std::string, int>, 2> rest_fds = {
      FdKinds(shard0[0], dir.path(), etcd_port), FdKinds(shard0[1], dir.path(), etcd_port)};

  // Slot 0 is never killed (a long-lived worker to measure); slots 1..3 are churned.
  constexpr int kSlots = 4;
  std::vector<std::unique_ptr<Process>> workers(kSlots);
  std::vector<int> incarnation(kSlots, 0);
  auto start = [&](int slot) {
    std::string name = "w" + std::to_string(slot) + "-" + std::to_string(incarnation[slot]++);
    workers[slot] = cluster.StartWorker(name, flags(slot == 0));
  };
  for (int i = 0; i < kSlots; ++i) start(i);

  std::map<std::string, Series> series;
  series["shard0 r0"] = {"shard0 r0", cluster.replica(0, 0).pid(), {}};
  series["shard0 r1"] = {"shard0 r1", cluster.replica(0, 1).pid(), {}};
  series["steady worker"] = {"steady worker", workers[0]->pid(), {}};

  int sigkills = 0, sigterms = 0, restarts = 0, graceful_exits = 0, early_terms = 0,
      primary_kills = 0;
  std::vector<double> primary_kill_t;
  const auto t0 = SteadyClock::now();
  auto now_s = [&] { return std::chrono::duration<double>(SteadyClock::now() - t0).count(); };
  double next_action = uniform(3, 8);
  double next_sample = 0;
  // Shard 1's primary is SIGKILLed at a quarter, half and three quarters of the window (later
  // if its replicas are not both in sync then: a kill before the restarted one caught up
  // would leave the shard without a replica that may lead), and restarted at once.
  constexpr int kPrimaryKills = 3;
  auto primary_kill_at = [&](int k) { return static_cast<double>(window_s) * (k + 1) / 4; };
  bool job_done_early = false;

  while (now_s() < static_cast<double>(window_s)) {
    const double t = now_s();
    if (t >= next_sample) {
      for (auto& [name, s] : series) s.Take(t);
      next_sample = t + 2;
    }
    ASSERT_TRUE(cluster.replica(0, 0).running()) << cluster.Logs();
    ASSERT_TRUE(cluster.replica(0, 1).running()) << cluster.Logs();
    if (primary_kills < kPrimaryKills && t >= primary_kill_at(primary_kills) &&
        cluster.InSync(1) == 2) {
      const int r = cluster.KillPrimary(1);
      ASSERT_GE(r, 0) << cluster.Logs();
      std::printf("soak %.0fs: SIGKILL shard 1's primary (replica %d) and restart it\n", t, r);
      cluster.Start(1, r);
      ++primary_kills;
      primary_kill_t.push_back(t);
    }
    if (workers[0] && !workers[0]->running()) {
      auto code = workers[0]->Wait(0ms);
      ASSERT_EQ(code, std::optional<int>(0)) << workers[0]->ReadLog();
      job_done_early = true;  // the steady worker leaves only when the job is finished
      std::printf("soak %.0fs: the job finished before the window ended\n", t);
      break;
    }
    if (t >= next_action) {
      int slot = uniform(1, kSlots - 1);
      auto& w = workers[slot];
      if (w && w->running()) {
        if (uniform(0, 9) < 6) {
          std::printf("soak %.0fs: SIGKILL %s\n", t, w->log_path().c_str());
          w->Kill();
          ++sigkills;
        } else {
          std::printf("soak %.0fs: SIGTERM %s\n", t, w->log_path().c_str());
          w->Signal(SIGTERM);
          auto code = w->Wait(30s);
          ASSERT_TRUE(code.has_value()) << "a SIGTERMed worker did not leave: " << w->ReadLog();
          // A worker still loading the data set has not joined and installed no handler yet:
          // the signal's default action ends it (143), which costs the job nothing.
          const bool joined = w->ReadLog().find("] training ") != std::string::npos;
          if (joined || *code != 128 + SIGTERM) {
            EXPECT_EQ(*code, 0) << w->ReadLog();
          }
          ++sigterms;
          graceful_exits += *code == 0;
          early_terms += *code == 128 + SIGTERM && !joined;
        }
        w.reset();
      } else {
        if (w) {
          auto code = w->Wait(0ms);
          EXPECT_EQ(code, std::optional<int>(0)) << w->ReadLog();
        }
        start(slot);
        ++restarts;
      }
      std::fflush(stdout);
      next_action = t + uniform(2, 8);
    }
    std::this_thread::sleep_for(200ms);
  }

  // Drain: every churned slot runs again, and the job goes to its end.
  const double chaos_end = now_s();
  for (int i = 1; i < kSlots; ++i) {
    if (!workers[i] || !workers[i]->running()) {
      if (workers[i]) {
        EXPECT_EQ(workers[i]->Wait(0ms), std::optional<int>(0)) << workers[i]->ReadLog();
      }
      start(i);
      ++restarts;
    }
  }
  std::printf(
      "soak %.0fs: chaos over (%d SIGKILL, %d SIGTERM, %d restarts, %d primary kills); "
      "draining\n",
      chaos_end, sigkills, sigterms, restarts, primary_kills);
  std::fflush(stdout);
  EXPECT_TRUE(job_done_early || primary_kills == kPrimaryKills)
      << "shard 1's replicas were not in sync in time for every primary kill\n"
      << cluster.Logs();
  const auto drain_deadline =
      SteadyClock::now() + std::chrono::seconds(std::max<int64_t>(600, window_s * 2));
  for (int i = 0; i < kSlots; ++i) {
    while (SteadyClock::now() < drain_deadline && !workers[i]->Wait(2s)) {
      const double t = now_s();
      if (t >= next_sample) {
        for (auto& [name, s] : series) s.Take(t);
        next_sample = t + 2;
      }
    }
    auto code = workers[i]->Wait(0ms);
    ASSERT_EQ(code, std::optional<int>(0))
        << "worker slot " << i << " did not finish the job: " << workers[i]->ReadLog();
  }
  const double end_t = now_s();
  for (auto& [name, s] : series) {
    if (name != "steady worker") s.Take(end_t);
  }

  // Epochs complete.
  const std::string status = LeashctlStatus(etcd.endpoint(), job, dir.path());
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(status, m, std::regex(R"re("epochs_done": (\d+), "epochs": (\d+))re")))
      << status;
  EXPECT_EQ(std::stoll(m[1]), epochs) << status;
  EXPECT_EQ(std::stoll(m[2]), epochs) << status;

  // Every table on every shard finite; every replica back in sync.
  auto finite = NonFiniteValues(cluster);
  ASSERT_TRUE(finite.ok()) << finite.status();
  EXPECT_GT(finite->first, 200000u) << "the MLP's tables hold about 235k values";
  EXPECT_EQ(finite->second, 0u) << "non-finite values in the tables";
  EXPECT_TRUE(WaitFor([&] { return cluster.AllInSync(); }, 60s)) << cluster.Logs();

  // Final accuracy, from the steady worker.
  std::string steady_log = workers[0]->ReadLog();
  std::smatch acc;
  double accuracy = -1;
  if (std::regex_search(steady_log, acc, std::regex(R"(final test accuracy ([0-9.]+)%)")))
    accuracy = std::stod(acc[1]);
  EXPECT_GT(accuracy, 70.0) << steady_log.substr(steady_log.size() > 3000 ? steady_log.size() - 3000
                                                                          : 0);

  // Leaks. Shard 0's replicas: fds back to their at-rest count once every worker is gone
  // (below); RSS growth over the second half of the run under 16 MiB. The steady
  // worker: fds and RSS over the second half (its connections stay open) within 8 fds and
  // 64 MiB.
  std::string kills;
  for (double t : primary_kill_t)
    kills += (kills.empty() ? "" : ", ") + std::to_string(static_cast<int>(t));
  std::printf(
      "soak: %.0fs chaos + %.0fs drain; %d SIGKILL, %d SIGTERM (%d left gracefully, %d still "
      "starting up), %d worker restarts, %d primary kills of shard 1 at %ss; %lld epochs done; "
      "%zu values finite; final test accuracy %.2f%%\n",
      chaos_end, end_t - chaos_end, sigkills, sigterms, graceful_exits, early_terms, restarts,
      primary_kills, kills.c_str(), static_cast<long long>(epochs), finite->first, accuracy);
  for (auto& [name, s] : series) {
    ASSERT_GE(s.samples.size(), 4u) << name;
    const double first_t = s.samples.front().t;
    const double half = first_t + (s.samples.back().t - first_t) / 2;
    const Sample& first = s.samples.front();
    const Sample& mid = s.At(half);
    const Sample& last = s.samples.back();
    const int64_t growth_kib = s.MaxRssFrom(half) - mid.rss_kib;
    std::printf(
        "soak: %-13s pid %d: RSS %.1f MiB at %.0fs, %.1f MiB at %.0fs (mid), %.1f MiB at the end, "
        "max growth over the second half %.1f MiB; fds %d -> %d -> %d\n",
        name.c_str(), s.pid, first.rss_kib / 1024.0, first.t, mid.rss_kib / 1024.0, mid.t,
        last.rss_kib / 1024.0, growth_kib / 1024.0, first.fds, mid.fds, last.fds);
    if (name == "steady worker") {
      EXPECT_LT(growth_kib, 64 * 1024) << name;
      EXPECT_LE(last.fds, mid.fds + 8) << name;
    } else {
      EXPECT_LT(growth_kib, 16 * 1024) << name;
    }
  }
  // Shard 0's replicas ran the whole time: once every worker and client is gone, their
  // connections, listeners, pipes, eventfds and shared-memory segments are exactly those they
  // had before any worker came (a worker's connection closes on the shard's side a moment
  // after the worker exits, and the etcd watch reconnects now and then: waited for; a worker
  // killed near the end whose segment no later worker removed is let go 30 s after it fell
  // silent, docs/internals.md, so the wait is 35 s). Bounded
  // apart: RocksDB's files follow flushes and compactions (a snapshot every 5 s), and the etcd
  // client keeps up to 4 idle handles, each with libcurl's socket pair and its connection to
  // etcd kept alive (how many it holds after a busy spell is the pool's business).
  for (int r = 0; r < 2; ++r) {
    const std::string name = "shard0 r" + std::to_string(r);
    const int rest = FdsBackAtRest(rest_fds[r], dir.path());
    std::map<std::string, int> now;
    WaitFor(
        [&] {
          now = FdKinds(shard0[r], dir.path(), etcd_port);
          return FdsBackAtRest(now, dir.path()) == rest;
        },
        35s);
    std::printf("soak: %s fds before the job: %s\nsoak: %s fds after it:   %s\n", name.c_str(),
                FdKindsString(rest_fds[r]).c_str(), name.c_str(), FdKindsString(now).c_str());
    EXPECT_EQ(FdsBackAtRest(now, dir.path()), rest)
        << name << ": connections, pipes or shared-memory segments left open after the job";
    EXPECT_LE(Count(now, "other socket"), Count(rest_fds[r], "other socket") + 8)
        << name << ": socket pairs beyond the etcd client's pool of handles";
    // Up to 4 idle handles, each with its connection kept alive, and the watch's.
    EXPECT_LE(Count(now, "TCP socket to etcd"), Count(rest_fds[r], "TCP socket to etcd") + 5)
        << name << ": connections to etcd beyond the etcd client's pool of handles";
    const std::string files = "files under " + dir.path();
    EXPECT_LE(Count(now, files), Count(rest_fds[r], files) + 16)
        << name << ": RocksDB's open files grew past what compaction bounds";
  }
  EXPECT_FALSE(job_done_early && chaos_end < static_cast<double>(window_s) / 3)
      << "the job ended in the first third of the window, too early for a soak: raise "
         "LEASH_SOAK_EPOCHS";
  std::fflush(stdout);
}

}  // namespace
}  // namespace leash

// Tests of the etcd Coordinator and ShardDirectory against a real etcd process. The
// conformance suite (CoordinatorConformanceTest) runs on every backend of Backends(): etcd,
// and the in-memory coordinator of tests/support/memory_coordinator.h that the unit tests of
// replicated shards rely on, so it keeps etcd's contract.
// EtcdCoordinatorTest holds what only etcd has: etcd itself dying, its error messages.
#include <gtest/gtest.h>

#include <unistd.h>
#include <atomic>
#include <functional>
#include <future>
#include <ostream>
#include <thread>

#include "leash/common/etcd_coordinator.h"
#include "support/etcd_test.h"
#include "support/memory_coordinator.h"
#include "support/scrape.h"

namespace leash {
namespace {

using std::chrono::milliseconds;
using testing::EtcdProcess;
using testing::TempDir;
using testing::WaitFor;

constexpr milliseconds kTtl{2000};  // etcd's minimum with its default election timeout

// What the conformance tests need of a coordinator implementation.
class CoordinatorBackend {
 public:
  virtual ~CoordinatorBackend() = default;
  // A replica's coordinator for a job of `num_shards` x `replicas` (not joined yet).
  virtual std::unique_ptr<Coordinator> NewReplica(uint32_t num_shards, uint32_t replicas) = 0;
  virtual std::unique_ptr<ShardDirectory> NewDirectory() = 0;
  // Cuts `c` off from the coordinator (its lease lapses after the TTL), or restores it.
  virtual void CutOff(Coordinator& c, bool cut) = 0;
  virtual milliseconds ttl() const = 0;
};

// One etcd for the whole suite; every backend (test) has a job of its own.
class EtcdBackend : public CoordinatorBackend {
 public:
  static void Start() {
    if (etcd_ == nullptr) {
      dir_ = new TempDir();
      etcd_ = new EtcdProcess(dir_->path());
    }
  }
  static void Stop() {
    delete etcd_;
    delete dir_;
    etcd_ = nullptr;
    dir_ = nullptr;
  }
  EtcdBackend() {
    static std::atomic<int> jobs{0};
    options_.endpoints = {etcd_->endpoint()};
    options_.job = "conformance-" + std::to_string(getpid()) + "-" + std::to_string(jobs++);
    options_.ttl = kTtl;
  }
  std::unique_ptr<Coordinator> NewReplica(uint32_t num_shards, uint32_t replicas) override {
    auto c = EtcdCoordinator::Create(options_, JobShape{num_shards, replicas});
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(c).value();
  }
  std::unique_ptr<ShardDirectory> NewDirectory() override {
    auto d = NewEtcdShardDirectory(options_);
    EXPECT_TRUE(d.ok()) << d.status();
    return std::move(d).value();
  }
  void CutOff(Coordinator& c, bool cut) override {
    dynamic_cast<EtcdCoordinator&>(c).PauseKeepAlivesForTesting(cut);
  }
  milliseconds ttl() const override { return kTtl; }

 private:
  static inline TempDir* dir_ = nullptr;
  static inline EtcdProcess* etcd_ = nullptr;
  EtcdOptions options_;
};

// The in-memory coordinator on the steady clock, with a short TTL (it has no minimum).
class MemoryBackend : public CoordinatorBackend {
 public:
  MemoryBackend()
      : service_(
            [] {
              return std::chrono::duration_cast<milliseconds>(
                         std::chrono::steady_clock::now().time_since_epoch())
                  .count();
            },
            kMemoryTtl.count(), kMemoryTtl.count() / 5) {}
  std::unique_ptr<Coordinator> NewReplica(uint32_t num_shards, uint32_t replicas) override {
    return service_.Connect(num_shards, replicas);
  }
  std::unique_ptr<ShardDirectory> NewDirectory() override { return service_.Directory(); }
  void CutOff(Coordinator& c, bool cut) override { service_.PauseKeepAlives(c, cut); }
  milliseconds ttl() const override { return kMemoryTtl; }

 private:
  static constexpr milliseconds kMemoryTtl{500};
  testing::MemoryCoordinatorService service_;
};

struct BackendParam {
  std::string name;
  std::function<std::unique_ptr<CoordinatorBackend>()> make;
  std::function<std::string()> unavailable;  // why it cannot run here ("" if it can)
};

// ctest lists a parameter by its backend's name, not its bytes.
void PrintTo(const BackendParam& p, std::ostream* os) { *os << p.name; }

std::vector<BackendParam> Backends() {
  return {
      {"etcd", [] { return std::make_unique<EtcdBackend>(); },
       [] { return EtcdProcess::SkipReason(); }},
      {"memory", [] { return std::make_unique<MemoryBackend>(); }, [] { return std::string(); }}};
}

ReplicaAddress Replica(uint32_t r) {
  return ReplicaAddress{r, "tcp://127.0.0.1:" + std::to_string(7000 + r), 1000 + r};
}

bool IsLive(const ShardView& s, uint32_t replica) {
  for (const ReplicaAddress& a : s.live) {
    if (a.replica == replica) return true;
  }
  return false;
}

// Campaigns until elected or `timeout` passes.
std::optional<uint64_t> CampaignUntilElected(Coordinator& c, milliseconds timeout) {
  std::optional<uint64_t> term;
  WaitFor(
      [&] {
        auto r = c.Campaign();
        if (r.ok() && r->has_value()) term = **r;
        return term.has_value();
      },
      timeout);
  return term;
}

class CoordinatorConformanceTest : public ::testing::TestWithParam<BackendParam> {
 protected:
  static void TearDownTestSuite() { EtcdBackend::Stop(); }
  void SetUp() override {
    if (std::string why = GetParam().unavailable(); !why.empty()) GTEST_SKIP() << why;
    if (GetParam().name == "etcd") EtcdBackend::Start();
    backend_ = GetParam().make();
    dir_ = backend_->NewDirectory();
  }
  ClusterView View() {
    auto v = dir_->View();
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : ClusterView{};
  }
  std::unique_ptr<Coordinator> Joined(uint32_t shards, uint32_t replicas, uint32_t shard,
                                      uint32_t replica) {
    auto c = backend_->NewReplica(shards, replicas);
    Status s = c->Join(shard, Replica(replica));
    EXPECT_TRUE(s.ok()) << s;
    return c;
  }

  std::unique_ptr<CoordinatorBackend> backend_;
  std::unique_ptr<ShardDirectory> dir_;
};

TEST_P(CoordinatorConformanceTest, ViewIsNotFoundBeforeAnyReplicaJoins) {
  auto v = dir_->View();
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kNotFound) << v.status();
}

TEST_P(CoordinatorConformanceTest, JoinAndLeaveAreVisibleInTheView) {
  auto a = Joined(2, 2, 0, 0);
  auto b = Joined(2, 2, 0, 1);
  auto c = Joined(2, 2, 1, 1);
  EXPECT_TRUE(a->LeaseValid());
  ClusterView v = View();
  EXPECT_EQ(v.num_shards, 2u);
  EXPECT_EQ(v.replicas, 2u);
  ASSERT_EQ(v.shards.size(), 2u);
  EXPECT_EQ(v.shards[0].shard, 0u);
  EXPECT_EQ(v.shards[0].live, (std::vector<ReplicaAddress>{Replica(0), Replica(1)}));
  EXPECT_EQ(v.shards[1].live, (std::vector<ReplicaAddress>{Replica(1)}));
  EXPECT_FALSE(v.shards[0].primary.has_value());
  EXPECT_EQ(v.shards[0].term, 0u);
  EXPECT_TRUE(v.shards[0].in_sync.empty());

  ASSERT_TRUE(a->Leave().ok());
  EXPECT_FALSE(a->LeaseValid());
  ClusterView after = View();
  EXPECT_GT(after.revision, v.revision);
  EXPECT_EQ(after.shards[0].live, (std::vector<ReplicaAddress>{Replica(1)}));
  EXPECT_EQ(after.shards[1].live, (std::vector<ReplicaAddress>{Replica(1)}));

  // A replica that answers pushes and clocks as a backup (--backup-answers) says so in its
  // live record and in the primary key; the others' records read false.
  ReplicaAddress answering = Replica(0);
  answering.answers = true;
  auto d = backend_->NewReplica(2, 2);
  ASSERT_TRUE(d->Join(1, answering).ok());
  ClusterView with = View();
  ASSERT_EQ(with.shards[1].live, (std::vector<ReplicaAddress>{answering, Replica(1)}));
  EXPECT_TRUE(with.shards[1].live[0].answers);
  EXPECT_FALSE(with.shards[1].live[1].answers);
  EXPECT_FALSE(with.shards[0].live[0].answers);
  auto term = d->Campaign();
  ASSERT_TRUE(term.ok()) << term.status();
  ASSERT_TRUE(term->has_value());
  EXPECT_EQ(View().shards[1].primary, answering);
  auto b_term = b->Campaign();
  ASSERT_TRUE(b_term.ok()) << b_term.status();
  ASSERT_TRUE(b_term->has_value());
  EXPECT_EQ(View().shards[0].primary, Replica(1));
  EXPECT_FALSE(View().shards[0].primary->answers);
}

TEST_P(CoordinatorConformanceTest, CutOffReplicaLosesRegistrationAndPrimaryAfterTheTtl) {
  auto a = Joined(1, 2, 0, 0);
  auto b = Joined(1, 2, 0, 1);
  auto term = a->Campaign();
  ASSERT_TRUE(term.ok()) << term.status();
  ASSERT_EQ(*term, std::optional<uint64_t>(1));
  ASSERT_EQ(View().shards[0].primary, Replica(0));

  backend_->CutOff(*a, true);
  // Each round reads the view, then LeaseValid: once the registration is gone, LeaseValid
  // must already be false (a primary stops acknowledging before its key can go).
  int first_invalid = -1, first_gone = -1;
  bool valid_after_gone = true;
  for (int round = 0; first_gone < 0 && round < 1000; ++round) {
    ClusterView v = View();
    bool gone = !IsLive(v.shards[0], 0) && !v.shards[0].primary.has_value();
    bool valid = a->LeaseValid();
    if (!valid && first_invalid < 0) first_invalid = round;
    if (gone) {
      first_gone = round;
      valid_after_gone = valid;
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_GE(first_gone, 0) << "the cut-off replica's keys outlived 20 s";
  EXPECT_FALSE(valid_after_gone);
  EXPECT_GE(first_invalid, 0);
  EXPECT_LE(first_invalid, first_gone);
  EXPECT_TRUE(b->LeaseValid());
  EXPECT_EQ(View().shards[0].live, (std::vector<ReplicaAddress>{Replica(1)}));
  EXPECT_EQ(View().shards[0].term, 0u);  // no primary now
}

TEST_P(CoordinatorConformanceTest, CampaignIsExclusiveAndTermsGrowAcrossFailovers) {
  std::vector<std::unique_ptr<Coordinator>> r;
  for (uint32_t i = 0; i < 3; ++i) r.push_back(Joined(1, 3, 0, i));
  std::vector<std::future<Result<std::optional<uint64_t>>>> tries;
  for (auto& c : r) tries.push_back(std::async(std::launch::async, [&c] { return c->Campaign(); }));
  int winner = -1;
  for (int i = 0; i < 3; ++i) {
    auto t = tries[i].get();
    ASSERT_TRUE(t.ok()) << t.status();
    if (t->has_value()) {
      EXPECT_EQ(winner, -1) << "two replicas won the first election";
      EXPECT_EQ(**t, 1u);
      winner = i;
    }
  }
  ASSERT_GE(winner, 0);
  // While it is primary, the others are refused.
  EXPECT_EQ(*r[(winner + 1) % 3]->Campaign(), std::nullopt);

  // The primary is cut off: another replica wins term 2 once its key has gone.
  backend_->CutOff(*r[winner], true);
  const int second = (winner + 1) % 3;
  auto t2 = CampaignUntilElected(*r[second], 10 * backend_->ttl());
  ASSERT_EQ(t2, std::optional<uint64_t>(2));
  EXPECT_EQ(View().shards[0].primary, Replica(second));
  EXPECT_EQ(View().shards[0].term, 2u);

  // A clean hand-over: resigning frees the key at once, and the term grows again.
  ASSERT_TRUE(r[second]->Resign(2).ok());
  const int third = (winner + 2) % 3;
  auto t3 = r[third]->Campaign();
  ASSERT_TRUE(t3.ok()) << t3.status();
  EXPECT_EQ(*t3, std::optional<uint64_t>(3));
  EXPECT_EQ(View().shards[0].term, 3u);
}

TEST_P(CoordinatorConformanceTest, ReplicaOutsideTheInSyncSetCannotWin) {
  auto a = Joined(1, 3, 0, 0);
  auto b = Joined(1, 3, 0, 1);
  auto c = Joined(1, 3, 0, 2);
  ASSERT_EQ(*a->Campaign(), std::optional<uint64_t>(1));
  ASSERT_TRUE(a->SetInSync(1, {1, 0}).ok());
  EXPECT_EQ(View().shards[0].in_sync, (std::vector<uint32_t>{0, 1}));
  ASSERT_TRUE(a->Resign(1).ok());
  EXPECT_FALSE(View().shards[0].primary.has_value());

  auto lost = c->Campaign();
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_EQ(*lost, std::nullopt);
  EXPECT_FALSE(View().shards[0].primary.has_value());
  EXPECT_EQ(*b->Campaign(), std::optional<uint64_t>(2));
  EXPECT_EQ(View().shards[0].primary, Replica(1));
}

TEST_P(CoordinatorConformanceTest, InSyncSetMustHoldItsPrimary) {
  auto a = Joined(1, 2, 0, 0);
  ASSERT_EQ(*a->Campaign(), std::optional<uint64_t>(1));
  EXPECT_EQ(a->SetInSync(1, {1}).code(), StatusCode::kInvalidArgument);
}

TEST_P(CoordinatorConformanceTest, DeposedPrimaryCannotSetInSyncOrResignItsSuccessor) {
  auto a = Joined(1, 2, 0, 0);
  auto b = Joined(1, 2, 0, 1);
  ASSERT_EQ(*a->Campaign(), std::optional<uint64_t>(1));
  ASSERT_TRUE(a->SetInSync(1, {0, 1}).ok());

  backend_->CutOff(*a, true);
  ASSERT_EQ(CampaignUntilElected(*b, 10 * backend_->ttl()), std::optional<uint64_t>(2));
  EXPECT_FALSE(a->LeaseValid());
  Status s = a->SetInSync(1, {0});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(a->Resign(1).ok());  // a no-op: term 1 is over
  ClusterView v = View();
  EXPECT_EQ(v.shards[0].primary, Replica(1));
  EXPECT_EQ(v.shards[0].term, 2u);
  EXPECT_EQ(v.shards[0].in_sync, (std::vector<uint32_t>{0, 1}));
  // The new primary's own updates go through.
  EXPECT_TRUE(b->SetInSync(2, {1}).ok());
  EXPECT_EQ(View().shards[0].in_sync, (std::vector<uint32_t>{1}));
  EXPECT_EQ(a->SetInSync(2, {0}).code(), StatusCode::kFailedPrecondition);
}

TEST_P(CoordinatorConformanceTest, WaitForChangeWakesOnFailover) {
  auto a = Joined(1, 2, 0, 0);
  auto b = Joined(1, 2, 0, 1);
  ASSERT_EQ(*a->Campaign(), std::optional<uint64_t>(1));
  ClusterView start = View();
  ASSERT_EQ(start.shards[0].primary, Replica(0));

  // A follower, as a worker would run it: wait, read, until the new primary shows.
  auto follower = std::async(std::launch::async, [&] {
    int64_t revision = start.revision;
    for (int wakeups = 0; wakeups < 50; ++wakeups) {
      auto v = dir_->WaitForChange(revision, milliseconds(30000));
      if (!v.ok()) return v;
      if (v->revision <= revision) return Result<ClusterView>(Internal("woke without a change"));
      revision = v->revision;
      if (v->shards[0].primary == Replica(1)) return v;
    }
    return Result<ClusterView>(Internal("the failover never showed"));
  });
  backend_->CutOff(*a, true);
  ASSERT_EQ(CampaignUntilElected(*b, 10 * backend_->ttl()), std::optional<uint64_t>(2));
  auto seen = follower.get();
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_EQ(seen->shards[0].term, 2u);
}

TEST_P(CoordinatorConformanceTest, WaitForChangeReturnsTheCurrentViewOnTimeout) {
  auto a = Joined(1, 1, 0, 0);
  ClusterView v = View();
  auto same = dir_->WaitForChange(v.revision, milliseconds(300));
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->shards, v.shards);
  // An old revision returns at once with the newer view.
  auto newer = dir_->WaitForChange(v.revision - 1, milliseconds(30000));
  ASSERT_TRUE(newer.ok()) << newer.status();
  EXPECT_EQ(newer->shards, v.shards);
}

TEST_P(CoordinatorConformanceTest, JobShapeMismatchIsRefused) {
  auto a = Joined(2, 2, 0, 0);
  auto wrong = backend_->NewReplica(3, 2);
  Status s = wrong->Join(1, Replica(1));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("2 shards x 2 replicas"), std::string::npos) << s;
  EXPECT_NE(s.message().find("3 shards x 2 replicas"), std::string::npos) << s;
  EXPECT_EQ(View().shards.size(), 2u);
  auto outside = backend_->NewReplica(2, 2);
  EXPECT_EQ(outside->Join(2, Replica(0)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(outside->Join(0, Replica(2)).code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Backends, CoordinatorConformanceTest, ::testing::ValuesIn(Backends()),
                         [](const auto& p) { return p.param.name; });

// ---------------------------------------------------------------------- etcd only

// How many calls of gRPC `label`="`value`" (e.g. grpc_service "etcdserverpb.Watch": each
// watch through the JSON gateway opens one stream) etcd has started, from its own metrics.
double EtcdCallsStarted(const std::string& endpoint, const std::string& label,
                        const std::string& value) {
  const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  auto body = testing::HttpGet(port, "/metrics");
  EXPECT_TRUE(body.ok()) << body.status();
  if (!body.ok()) return -1;
  auto scrape = testing::ParsePrometheusText(*body);
  EXPECT_TRUE(scrape.ok()) << scrape.status();
  if (!scrape.ok()) return -1;
  auto n = scrape->Find("grpc_server_started_total", label, value);
  EXPECT_TRUE(n.has_value()) << "etcd's metrics have no grpc_server_started_total of " << value;
  return n.value_or(-1);
}

class EtcdCoordinatorTest : public testing::EtcdTest {
 protected:
  void SetUp() override {
    EtcdTest::SetUp();
    if (IsSkipped()) return;
    options_.endpoints = {etcd_->endpoint()};
    options_.job = "etcd-test";
    options_.ttl = kTtl;
  }
  std::unique_ptr<EtcdCoordinator> Joined(uint32_t replica) {
    auto c = EtcdCoordinator::Create(options_, JobShape{1, 2});
    EXPECT_TRUE(c.ok()) << c.status();
    Status s = (*c)->Join(0, Replica(replica));
    EXPECT_TRUE(s.ok()) << s;
    return std::move(c).value();
  }

  EtcdOptions options_;
};

TEST_F(EtcdCoordinatorTest, EtcdDownGivesUnavailableAndTheCoordinatorRecoversAfterRestart) {
  auto a = Joined(0);
  auto dir = NewEtcdShardDirectory(options_);
  ASSERT_TRUE(dir.ok()) << dir.status();
  ASSERT_EQ(*a->Campaign(), std::optional<uint64_t>(1));
  EXPECT_EQ(*a->Campaign(), std::optional<uint64_t>(1));  // the primary's own: its term

  // A watch in progress ends when etcd dies (rather than waiting out its timeout).
  auto view = (*dir)->View();
  ASSERT_TRUE(view.ok()) << view.status();
  auto watching = std::async(std::launch::async, [&] {
    return (*dir)->WaitForChange(view->revision, milliseconds(600000));
  });
  std::this_thread::sleep_for(milliseconds(300));  // most likely watching by now
  etcd_->Kill();
  ASSERT_EQ(watching.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "a watch outlived etcd by a minute";
  auto watched = watching.get();
  EXPECT_EQ(watched.status().code(), StatusCode::kUnavailable) << watched.status();
  auto v = (*dir)->View();
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kUnavailable) << v.status();
  EXPECT_NE(v.status().message().find(etcd_->endpoint()), std::string::npos) << v.status();
  EXPECT_NE(v.status().message().find("start etcd"), std::string::npos) << v.status();
  EXPECT_EQ((*dir)->WaitForChange(0, milliseconds(5000)).status().code(), StatusCode::kUnavailable);
  auto c = a->Campaign();
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable) << c.status();
  EXPECT_EQ(a->SetInSync(1, {0}).code(), StatusCode::kUnavailable);
  EXPECT_TRUE(WaitFor([&] { return !a->LeaseValid(); }, 3 * kTtl));

  // etcd renews every lease when it comes back, so the primary keeps its term.
  etcd_->Restart();
  // A follower waiting in a loop from the moment etcd is back (its watch reopens within
  // 200 ms) reads the view a few times, not in a loop: etcd (restarted, so its counters
  // start at 0) counts the range requests.
  int64_t revision = view->revision;
  for (auto end = std::chrono::steady_clock::now() + milliseconds(1500);
       std::chrono::steady_clock::now() < end;) {
    auto next = (*dir)->WaitForChange(revision, milliseconds(100));
    ASSERT_TRUE(next.ok()) << next.status();
    revision = std::max(revision, next->revision);
  }
  const double ranges = EtcdCallsStarted(etcd_->endpoint(), "grpc_method", "Range");
  ASSERT_GE(ranges, 0);
  EXPECT_LE(ranges, 40) << ranges
                        << " range requests: the follower read etcd in a loop after it came back";
  EXPECT_TRUE(WaitFor([&] { return a->LeaseValid(); }, milliseconds(20000)));
  auto back = (*dir)->View();
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->shards[0].live, (std::vector<ReplicaAddress>{Replica(0)}));
  EXPECT_EQ(back->shards[0].primary, Replica(0));
  EXPECT_EQ(back->shards[0].term, 1u);
  EXPECT_TRUE(a->SetInSync(1, {0}).ok());
}

// A follower that waits in a loop, as a worker's client and a replica's directory do,
// holds one watch open instead of opening one per wait (before: one per wait, and a new
// connection each time, as a watch that times out closes its connection), and still wakes
// at once on a change.
TEST_F(EtcdCoordinatorTest, AFollowerWaitingInALoopHoldsOneWatchOpenAndWakesOnAChange) {
  auto a = Joined(0);
  auto dir = NewEtcdShardDirectory(options_);
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto view = (*dir)->View();
  ASSERT_TRUE(view.ok()) << view.status();
  const double before = EtcdCallsStarted(etcd_->endpoint(), "grpc_service", "etcdserverpb.Watch");
  int64_t revision = view->revision;
  for (int i = 0; i < 12; ++i) {
    auto v = (*dir)->WaitForChange(revision, milliseconds(100));
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->shards, view->shards) << "nothing changed, yet the view did";
    EXPECT_GE(v->revision, revision);
    revision = v->revision;
  }
  EXPECT_LE(EtcdCallsStarted(etcd_->endpoint(), "grpc_service", "etcdserverpb.Watch") - before, 2)
      << "12 waits of 100 ms opened a watch each";

  // A change wakes the waiter long before its timeout, with the new view.
  auto waiting = std::async(std::launch::async,
                            [&] { return (*dir)->WaitForChange(revision, milliseconds(60000)); });
  ASSERT_EQ(*a->Campaign(), std::optional<uint64_t>(1));
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "the change did not wake the waiter";
  auto changed = waiting.get();
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_GT(changed->revision, revision);
  EXPECT_EQ(changed->shards[0].primary, Replica(0));
  EXPECT_EQ(changed->shards[0].term, 1u);
}

TEST_F(EtcdCoordinatorTest, ReplicaCutOffForTheTtlRegistersAgainButItsTermIsOver) {
  auto a = Joined(0);
  auto b = Joined(1);
  auto dir = NewEtcdShardDirectory(options_);
  ASSERT_TRUE(dir.ok());
  ASSERT_EQ(*a->Campaign(), std::optional<uint64_t>(1));
  a->PauseKeepAlivesForTesting(true);
  ASSERT_EQ(CampaignUntilElected(*b, 10 * kTtl), std::optional<uint64_t>(2));
  a->PauseKeepAlivesForTesting(false);
  ASSERT_TRUE(WaitFor(
      [&] {
        auto v = (*dir)->View();
        return v.ok() && IsLive(v->shards[0], 0);
      },
      10 * kTtl));
  // Registered again, but term 1's lease is gone: no acknowledging as its primary...
  EXPECT_FALSE(a->LeaseValid());
  EXPECT_EQ(a->SetInSync(1, {0, 1}).code(), StatusCode::kFailedPrecondition);
  // ...until it has heard so; then it is a live backup with a valid lease.
  EXPECT_TRUE(WaitFor([&] { return a->LeaseValid(); }, 3 * kTtl));
  EXPECT_EQ(*a->Campaign(), std::nullopt);
}

TEST_F(EtcdCoordinatorTest, UnreachableEtcdSaysWhereAndWhatToDo) {
  EtcdOptions nowhere = options_;
  nowhere.endpoints = {"http://127.0.0.1:" + std::to_string(testing::FreePort())};
  auto c = EtcdCoordinator::Create(nowhere, JobShape{1, 1});
  ASSERT_TRUE(c.ok());
  Status s = (*c)->Join(0, Replica(0));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find(nowhere.endpoints[0] + " unreachable"), std::string::npos) << s;
  EXPECT_NE(s.message().find("start etcd or pass --etcd"), std::string::npos) << s;
  EXPECT_FALSE((*c)->LeaseValid());

  // A second endpoint that answers is used when the first cannot be reached.
  EtcdOptions two = options_;
  two.endpoints = {nowhere.endpoints[0], etcd_->endpoint()};
  auto ok = EtcdCoordinator::Create(two, JobShape{1, 1});
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE((*ok)->Join(0, Replica(0)).ok());
}

TEST_F(EtcdCoordinatorTest, OptionsAreChecked) {
  EXPECT_EQ(EtcdCoordinator::Create(EtcdOptions{}, JobShape{1, 1}).status().code(),
            StatusCode::kInvalidArgument);
  EtcdOptions bad = options_;
  bad.job = "a/b";
  EXPECT_EQ(EtcdCoordinator::Create(bad, JobShape{1, 1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EtcdCoordinator::Create(options_, JobShape{0, 1}).status().code(),
            StatusCode::kInvalidArgument);
  auto parsed = ParseEtcdEndpoints(" 127.0.0.1:2379, http://h:1/ ");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, (std::vector<std::string>{"http://127.0.0.1:2379", "http://h:1"}));
  EXPECT_EQ(ParseEtcdEndpoints(" , ").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace leash

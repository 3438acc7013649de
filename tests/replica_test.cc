// Unit tests of replicated shards (server/replica.h) on the in-memory transport with messages
// dropped, duplicated and reordered, and the in-memory coordinator: log order and
// application, acknowledgement only once every in-sync backup holds an entry, term fencing,
// failover without a lost or doubled push, removal of a lagging backup, catch-up from a
// snapshot and the log tail, and replicas identical to the bit. Single-threaded: a test turns
// every replica's loop by hand (Group::Step) on a clock it moves itself.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <thread>

#include "leash/common/metrics.h"
#include "leash/common/wire.h"
#include "leash/server/replica.h"
#include "leash/server/replica_metrics.h"
#include "leash/server/snapshot.h"
#include "support/memory_coordinator.h"
#include "support/memory_transport.h"

namespace leash::testing {
namespace {

using namespace std::chrono_literals;
using server::Replica;
using server::ReplicaOptions;
using server::ReplicaRole;

std::string Addr(int r) { return "r" + std::to_string(r); }

// R replicas of shard 0/1, their coordinator and network, turned by hand.
class Group {
 public:
  Group(int replicas, ReplicaOptions ro = {}, server::ShardOptions so = {}, uint64_t seed = 1)
      : replicas_(replicas),
        ro_(ro),
        so_(so),
        net_(seed),
        coord_(std::make_unique<MemoryCoordinatorService>(
            1, replicas, [this] { return now_; }, /*ttl_ms=*/1000)),
        nodes_(replicas) {
    ro_.replicas = static_cast<uint32_t>(replicas);
    so_.checkpoint_interval_ms = 0;
    if (so_.lease_ms == server::ShardOptions{}.lease_ms) so_.lease_ms = 1000000;  // no evictions
  }

  struct Node {
    std::unique_ptr<Coordinator> coordinator;
    std::unique_ptr<ShardDirectory> directory;
    std::unique_ptr<ServerTransport> server;
    std::unique_ptr<ClientTransport> peers;
    std::unique_ptr<server::MemorySnapshotStore> store =
        std::make_unique<server::MemorySnapshotStore>();
    std::unique_ptr<Replica> replica;
  };

  // Starts replica r as a fresh process (empty store), or on `store` (a data directory kept
  // from before): then it restores what a clean stop or its durable log left there
  // (Restore). With ReplicaOptions::durable_log_dir, replica r's durable log is in its
  // subdirectory r<r>, removed for a fresh start (a new data directory).
  void Start(int r, std::unique_ptr<server::MemorySnapshotStore> store = nullptr) {
    nodes_[r] = std::make_unique<Node>();
    Node& n = *nodes_[r];
    const bool restart = store != nullptr;
    if (restart) n.store = std::move(store);
    n.coordinator = coord_->Connect();
    n.directory = coord_->Directory();
    n.server = net_.Bind(Addr(r));
    ASSERT_TRUE(n.server);
    std::vector<std::string> addrs;
    for (int i = 0; i < replicas_; ++i) addrs.push_back(Addr(i));
    n.peers = net_.Connect(addrs, ro_.replica_user);  // with keys, the replicas' own
    ASSERT_TRUE(n.coordinator->Join(0, {static_cast<uint32_t>(r), Addr(r), next_boot_++}).ok());
    ReplicaOptions ro = ro_;
    ro.replica = static_cast<uint32_t>(r);
    if (!ro_.durable_log_dir.empty()) {
      ro.durable_log_dir = DurableDir(r);
      if (!restart) std::filesystem::remove_all(ro.durable_log_dir);
    }
    server::ShardOptions so = so_;
    if (auto it = update_threads_.find(r); it != update_threads_.end()) {
      so.update_threads = it->second;
    }
    n.replica = std::make_unique<Replica>(
        ro, so, n.store.get(), [this] { return now_; }, n.coordinator.get(), n.directory.get(),
        n.peers.get());
    if (restart || !ro_.durable_log_dir.empty()) {
      auto restored = n.replica->Restore();
      ASSERT_TRUE(restored.ok()) << restored.status();
      restored_[r] = *restored;
    }
  }
  // Stops replica r as SIGTERM does (ServeReplica's way out: its stop record, resigning, the
  // final snapshot with the record) and leaves the coordinator cleanly. Returns its store,
  // the data directory to Start it on again.
  std::unique_ptr<server::MemorySnapshotStore> Stop(int r) {
    Node& n = *nodes_[r];
    std::string record = n.replica->StopRecord();
    n.replica->Resign();
    if (n.replica->has_state()) {
      EXPECT_TRUE(n.replica->mutable_shard().Checkpoint(record).ok());
    }
    auto store = std::move(n.store);
    nodes_[r].reset();
    return store;
  }
  // Kills replica r (as Kill) and returns its store, as a SIGKILLed process leaves its data
  // directory.
  std::unique_ptr<server::MemorySnapshotStore> KillKeepingStore(int r) {
    auto store = std::move(nodes_[r]->store);
    Kill(r);
    return store;
  }
  // Replica r's shard shares large updates among `threads` (ShardOptions::update_threads)
  // from its next Start on.
  void set_update_threads(int r, int threads) { update_threads_[r] = threads; }
  // Whether replica r's last Start took its state and log back from a clean stop.
  bool restored(int r) const { return restored_.count(r) != 0 && restored_.at(r); }
  void StartAll() {
    for (int r = 0; r < replicas_; ++r) Start(r);
  }
  // Kills replica r: its process and everything on the way to it go. Its lease runs on
  // until the test expires it (ExpireLease) or its TTL passes.
  void Kill(int r) {
    // The handle would revoke the lease when destroyed (a clean Leave); a killed process
    // does not, so the handle is kept to the end and the lease left to the coordinator.
    graveyard_.push_back(std::move(nodes_[r]->coordinator));
    nodes_[r].reset();
  }
  bool up(int r) const { return nodes_[r] != nullptr; }
  std::string DurableDir(int r) const { return ro_.durable_log_dir + "/r" + std::to_string(r); }
  Replica& replica(int r) { return *nodes_[r]->replica; }
  MemoryNetwork& net() { return net_; }
  MemoryCoordinatorService& coordinator() { return *coord_; }
  // A new coordinator that knows nothing of the group (a new etcd), once every replica is
  // down.
  void NewCoordinator() {
    for (const auto& n : nodes_) ASSERT_EQ(n, nullptr);
    graveyard_.clear();
    coord_ = std::make_unique<MemoryCoordinatorService>(
        1, replicas_, [this] { return now_; }, /*ttl_ms=*/1000);
  }
  Coordinator& handle(int r) { return *nodes_[r]->coordinator; }
  int64_t& now() { return now_; }

  // One turn of replica r's loop: what has arrived, then its Tick.
  void Turn(int r) {
    if (!up(r)) return;
    Node& n = *nodes_[r];
    std::vector<server::Outgoing> out;
    for (;;) {
      auto in = n.server->Receive(0ms);
      ASSERT_TRUE(in.ok());
      if (!in->has_value()) break;
      if (lend_) Lend((*in)->message);
      std::vector<std::shared_ptr<std::vector<float>>> rings;
      if (unstable_) rings = InWorkersRing((*in)->message);
      n.replica->Handle((*in)->peer, (*in)->message, &out, (*in)->user);
      // The worker's ring room is reused as soon as the shard lets its frames go.
      for (auto& ring : rings) std::fill(ring->begin(), ring->end(), 1000.f);
    }
    n.replica->Tick(&out);
    for (auto& o : out) (void)n.server->Send(o.peer, std::move(o.message));
  }
  // A turn of every replica, then the clock moves 1 ms (and, with delays on the network,
  // a little real time passes for them).
  void Step() {
    for (int r = 0; r < replicas_; ++r) Turn(r);
    ++now_;
    if (real_sleep_) std::this_thread::sleep_for(200us);
  }
  void set_real_sleep(bool on) { real_sleep_ = on; }
  // Appends' payload frames arrive as a same-host backup gets them from a primary that lends
  // them (ZmqOptions::shm_lend): Frame::lent, in place in the primary's ring.
  void set_lend(bool on) { lend_ = on; }
  // Workers' payload frames arrive as a primary borrowing all gets them from a same-host
  // worker (ZmqOptions::shm_borrow_all): Frame::unstable, in place in the worker's ring,
  // which the worker fills with other bytes as soon as the replica's Handle returns.
  void set_unstable(bool on) { unstable_ = on; }

  std::optional<int> Primary() {
    ShardView v = coord_->View(0);
    if (!v.primary) return std::nullopt;
    return static_cast<int>(v.primary->replica);
  }

 private:
  int replicas_;
  ReplicaOptions ro_;
  server::ShardOptions so_;
  std::map<int, int> update_threads_;  // replica -> ShardOptions::update_threads
  int64_t now_ = 1000;
  MemoryNetwork net_;
  std::unique_ptr<MemoryCoordinatorService> coord_;
  std::vector<std::unique_ptr<Coordinator>> graveyard_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::map<int, bool> restored_;
  uint64_t next_boot_ = 1;
  bool real_sleep_ = false;
  bool lend_ = false;
  bool unstable_ = false;

  static std::vector<std::shared_ptr<std::vector<float>>> InWorkersRing(Message& m) {
    std::vector<std::shared_ptr<std::vector<float>>> rings;
    if (DecodeReplication(m).ok()) return rings;
    for (size_t i = 1; i < m.size(); ++i) {
      if (m[i].size() < 64 || m[i].size() % sizeof(float) != 0) continue;
      auto ring = std::make_shared<std::vector<float>>(m[i].size() / sizeof(float));
      std::memcpy(ring->data(), m[i].data(), m[i].size());
      m[i] = Frame::Wrap(ring->data(), m[i].size(), ring).Unstable();
      rings.push_back(std::move(ring));
    }
    return rings;
  }

  static void Lend(Message& m) {
    auto d = DecodeReplication(m);
    if (!d.ok() || !std::holds_alternative<ReplAppendMsg>(d->value)) return;
    for (size_t i = 1; i < m.size(); ++i) m[i] = m[i].Lent();
  }
};

// A worker that follows the shard's primary through the directory and sends its requests
// one at a time, again until answered (to the new primary after a failover).
class Worker {
 public:
  Worker(Group& g, uint64_t id) : g_(g), id_(id), directory_(g.coordinator().Directory()) {
    std::vector<std::string> addrs;
    for (int i = 0; i < 8; ++i) addrs.push_back(Addr(i));
    transport_ = g.net().Connect(addrs);
  }

  // Sends `m` (request id `rid`) and turns the group until its reply comes; nullopt if none
  // came within `max_steps`. Error replies of a backup (Unavailable) make it look for the
  // primary again.
  std::optional<Reply> Call(uint64_t rid, const Message& m, int max_steps = 20000) {
    int since_send = 1 << 30;
    for (int step = 0; step < max_steps; ++step) {
      if (heartbeat_replicas_ > 0 && step % 50 == 0) HeartbeatAll();
      if (since_send >= 100) {  // first send, or a resend after a loss or a failover
        auto p = g_.Primary();
        if (p) (void)transport_->Send(*p, m);
        since_send = 0;
      }
      g_.Step();
      ++since_send;
      for (;;) {
        auto in = transport_->Receive(0ms);
        if (!in.ok() || !in->has_value()) break;
        auto reply = DecodeReply((*in)->second);
        if (!reply.ok() || reply->request_id != rid) continue;  // a late duplicate
        if (auto* e = std::get_if<ErrorReply>(&reply->value);
            e != nullptr && e->status.code() == StatusCode::kUnavailable) {
          since_send = 90;  // a backup: try the primary again soon
          continue;
        }
        return reply->value;
      }
    }
    return std::nullopt;
  }

  void Register() {
    const uint64_t rid = NextRid();
    auto r = Call(rid, MakeRegister(rid, id_, 1, "w" + std::to_string(id_)));
    ASSERT_TRUE(r && std::holds_alternative<Welcome>(*r));
  }
  void CreateTable(const TableSpec& spec) {
    const uint64_t rid = NextRid();
    auto r = Call(rid, MakeCreateTable(rid, spec));
    ASSERT_TRUE(r && std::holds_alternative<TableCreated>(*r));
  }
  // Pushes `grad` to rows [0, rows) of table 0, with `weight` (work in proportion to speed;
  // none by default); true once acknowledged.
  bool Push(const std::vector<float>& grad, uint64_t rows, PushWeight weight = {}) {
    const uint64_t rid = NextRid();
    Message m = MakePush(rid, 0, Rows::Range(0, rows), id_, 1, ++seq_, DType::kF32,
                         EncodeValues(grad, DType::kF32), weight);
    auto r = Call(rid, m);
    return r && std::holds_alternative<PushReply>(*r);
  }
  // Pulls or pushes rows `keys` of sparse table `table`; true once answered.
  bool PullKeys(uint32_t table, std::vector<uint64_t> keys) {
    const uint64_t rid = NextRid();
    auto r = Call(rid, MakePull(rid, table, Rows::Keys(std::move(keys)), id_, 0, 1 << 20));
    return r && std::holds_alternative<PullReply>(*r);
  }
  bool PushKeys(uint32_t table, std::vector<uint64_t> keys, const std::vector<float>& grad) {
    const uint64_t rid = NextRid();
    auto r = Call(rid, MakePush(rid, table, Rows::Keys(std::move(keys)), id_, 1, ++seq_,
                                DType::kF32, EncodeValues(grad, DType::kF32)));
    return r && std::holds_alternative<PushReply>(*r);
  }
  bool Clock(int64_t c) {
    const uint64_t rid = NextRid();
    auto r = Call(rid, MakeClock(rid, id_, c));
    return r && std::holds_alternative<ClockReply>(*r);
  }
  // Reports `done` (if any) and asks shard 0 for the next chunk of `plan`.
  std::optional<ChunkGrant> NextChunk(const DataPlan& plan, const ChunkDone* done) {
    const uint64_t rid = NextRid();
    auto r = Call(rid, MakeChunkRequest(rid, id_, 1, plan, done));
    if (!r || !std::holds_alternative<ChunkGrant>(*r)) return std::nullopt;
    return std::get<ChunkGrant>(*r);
  }
  ClientTransport& transport() { return *transport_; }
  uint64_t NextRid() { return ++rid_; }
  // A heartbeat to replica r, as leash::Client sends on its connection to a backup that
  // answers (its reply, whatever it is, goes unread: its request id is no Call's).
  void Heartbeat(int r) {
    (void)transport_->Send(r, MakeHeartbeat(kHeartbeatRids + ++heartbeats_, id_, 1));
  }
  // Call sends a heartbeat to each of replicas 0..n-1 every 50 steps (0: none).
  void set_heartbeats(int n) { heartbeat_replicas_ = n; }
  void HeartbeatAll() {
    for (int r = 0; r < heartbeat_replicas_; ++r) Heartbeat(r);
  }

 private:
  Group& g_;
  uint64_t id_;
  std::unique_ptr<ShardDirectory> directory_;
  std::unique_ptr<ClientTransport> transport_;
  uint64_t rid_ = 0;
  uint64_t seq_ = 0;
  static constexpr uint64_t kHeartbeatRids = uint64_t{1} << 40;
  uint64_t heartbeats_ = 0;
  int heartbeat_replicas_ = 0;
};

TableSpec Spec(OptimizerKind kind, float lr, uint64_t rows = 8, uint32_t cols = 4) {
  TableSpec s;
  s.name = "w";
  s.rows = rows;
  s.cols = cols;
  s.optimizer.kind = kind;
  s.optimizer.lr = lr;
  return s;
}

// Turns the group until every live replica has applied the primary's whole log.
bool Settle(Group& g, int replicas, int max_steps = 20000) {
  for (int i = 0; i < max_steps; ++i) {
    g.Step();
    auto p = g.Primary();
    if (!p || !g.up(*p)) continue;
    Replica& pr = g.replica(*p);
    if (pr.role() != ReplicaRole::kPrimary || pr.commit_index() != pr.last_index()) continue;
    bool all = true;
    for (int r = 0; r < replicas; ++r) {
      if (!g.up(r)) continue;
      all = all && g.replica(r).applied_index() == pr.last_index();
    }
    if (all) return true;
  }
  return false;
}

bool SameFloats(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp's arguments must not be null, even for 0 bytes (an empty vector's data() may be).
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Every byte of the replicated state of replicas a and b: tables, optimizer state, clocks,
// the exactly-once records and the data coverage.
void ExpectIdentical(Replica& a, Replica& b) {
  server::ShardSnapshot x = a.shard().Snapshot();
  server::ShardSnapshot y = b.shard().Snapshot();
  EXPECT_EQ(x.min_clock, y.min_clock);
  EXPECT_EQ(x.coverage, y.coverage);
  // The leases and the queue too: a snapshot's progress-only coverage leaves them out.
  EXPECT_EQ(a.shard().coverage().SerializeExact(), b.shard().coverage().SerializeExact());
  ASSERT_EQ(x.workers.size(), y.workers.size());
  for (size_t i = 0; i < x.workers.size(); ++i) {
    EXPECT_EQ(x.workers[i].worker_id, y.workers[i].worker_id);
    EXPECT_EQ(x.workers[i].clock, y.workers[i].clock);
    EXPECT_EQ(x.workers[i].last_seq, y.workers[i].last_seq);
  }
  ASSERT_EQ(x.tables.size(), y.tables.size());
  for (size_t t = 0; t < x.tables.size(); ++t) {
    EXPECT_TRUE(SameFloats(x.tables[t].values, y.tables[t].values)) << "table " << t;
    ASSERT_EQ(x.tables[t].slots.size(), y.tables[t].slots.size());
    for (size_t s = 0; s < x.tables[t].slots.size(); ++s)
      EXPECT_TRUE(SameFloats(x.tables[t].slots[s], y.tables[t].slots[s])) << "slot " << s;
    EXPECT_EQ(x.tables[t].optimizer_steps, y.tables[t].optimizer_steps);
    EXPECT_EQ(x.tables[t].pending_clocks, y.tables[t].pending_clocks);
  }
}

std::vector<float> TableValues(Replica& r) { return r.shard().Snapshot().tables.at(0).values; }

// An integer-valued gradient: sums of them are exact in float.
std::vector<float> IntGrad(uint64_t seed, size_t n) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i)
    g[i] = static_cast<float>(static_cast<int>((seed * 7 + i) % 9) - 4);
  return g;
}

// Kills replica `from` (the primary) and ends its etcd lease at once, then turns the group
// until replica `to` leads, for at most `max_steps`; returns the primary then.
std::optional<int> FailOver(Group& g, int from, int to, int max_steps = 2000) {
  g.Kill(from);
  g.coordinator().ExpireLease(0, static_cast<uint32_t>(from));
  for (int s = 0; s < max_steps && g.Primary() != std::optional<int>(to); ++s) g.Step();
  return g.Primary();
}

// Replica r's table 0 holds minus `sum`, exactly (SGD at learning rate 1).
void ExpectMinus(Replica& r, const std::vector<float>& sum) {
  const std::vector<float> got = TableValues(r);
  ASSERT_GE(got.size(), sum.size());
  for (size_t k = 0; k < sum.size(); ++k) ASSERT_EQ(got[k], -sum[k]) << "value " << k;
}

// Pushes IntGrad(i, 32) to rows [0, 8) of table 0 through a worker and keeps their sum.
class SummedPushes {
 public:
  explicit SummedPushes(Worker& w) : w_(w) {}
  // True once acknowledged (then counted in sum()).
  bool Push(uint64_t i) {
    const std::vector<float> grad = IntGrad(i, 32);
    if (!w_.Push(grad, 8)) return false;
    for (size_t k = 0; k < sum_.size(); ++k) sum_[k] += grad[k];
    return true;
  }
  const std::vector<float>& sum() const { return sum_; }

 private:
  Worker& w_;
  std::vector<float> sum_ = std::vector<float>(32, 0.f);
};

// Both replicas of a group of two hold minus `sum` and are identical.
void ExpectBothHold(Group& g, const std::vector<float>& sum) {
  for (int r = 0; r < 2; ++r)
    ASSERT_NO_FATAL_FAILURE(ExpectMinus(g.replica(r), sum)) << "replica " << r;
  ExpectIdentical(g.replica(0), g.replica(1));
}

void Elect(Group& g) {
  for (int i = 0; i < 2000 && !g.Primary(); ++i) g.Step();
  ASSERT_TRUE(g.Primary());
}

// Starts every replica of `g` on a network that drops and duplicates 5% of the messages
// each way (and delays those to the shards), and elects a primary.
void StartUnderLoss(Group& g) {
  g.net().SetFaults(Direction::kToShard, "", {.drop = 0.05, .duplicate = 0.05, .jitter_ms = 1});
  g.net().SetFaults(Direction::kToClient, "", {.drop = 0.05, .duplicate = 0.05});
  g.set_real_sleep(true);
  g.StartAll();
  Elect(g);
}

// The setup most tests share: a group of `replicas` with `started` of them running (all:
// -1), a primary elected, and worker 1, which created `spec` (table 0) and registered.
class ReplicaTest : public ::testing::Test {
 protected:
  Group& SetUpGroup(int replicas, const TableSpec& spec, ReplicaOptions ro = {},
                    server::ShardOptions so = {}, int started = -1) {
    group_ = std::make_unique<Group>(replicas, ro, so);
    for (int r = 0; r < (started < 0 ? replicas : started); ++r) group_->Start(r);
    Elect(*group_);
    worker_ = std::make_unique<Worker>(*group_, 1);
    worker_->CreateTable(spec);
    worker_->Register();
    return *group_;
  }
  Worker& worker() { return *worker_; }

  // Snapshot chunks delivered to replica `r` from now on (counted as the network sees them).
  std::shared_ptr<int> CountChunksTo(int r) {
    auto n = std::make_shared<int>(0);
    group_->net().AddRule([n, addr = Addr(r)](const Packet& p) -> std::optional<Verdict> {
      if (p.direction != Direction::kToShard || p.address != addr) return std::nullopt;
      auto d = DecodeReplication(*p.message);
      if (d.ok() && std::holds_alternative<ReplSnapshotMsg>(d->value)) ++*n;
      return std::nullopt;  // the faults decide
    });
    return n;
  }

  std::unique_ptr<Group> group_;
  std::unique_ptr<Worker> worker_;  // destroyed first: it refers to the group
};

TEST_F(ReplicaTest, BackupsApplyTheLogInOrderAndEveryReplicaEndsBitIdentical) {
  Group g(3, {}, {}, /*seed=*/7);
  g.net().SetFaults(Direction::kToShard, "", {.drop = 0.05, .duplicate = 0.05, .jitter_ms = 2});
  g.net().SetFaults(Direction::kToClient, "", {.drop = 0.05, .duplicate = 0.05});
  g.set_real_sleep(true);
  g.StartAll();
  Elect(g);
  Worker a(g, 1), b(g, 2);
  a.CreateTable(Spec(OptimizerKind::kAdam, 0.01f));
  a.Register();
  b.Register();
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int i = 0; i < 40; ++i) {
    std::vector<float> ga(32), gb(32);
    for (auto& v : ga) v = normal(rng);
    for (auto& v : gb) v = normal(rng);
    ASSERT_TRUE(a.Push(ga, 8));
    ASSERT_TRUE(b.Push(gb, 8));
    ASSERT_TRUE(a.Clock(i + 1));
    ASSERT_TRUE(b.Clock(i + 1));
  }
  ASSERT_TRUE(Settle(g, 3));
  const int p = *g.Primary();
  EXPECT_EQ(g.replica(p).shard().counters().pushes_applied, 80u);
  for (int r = 0; r < 3; ++r) {
    if (r == p) continue;
    EXPECT_EQ(g.replica(r).role(), ReplicaRole::kBackup);
    EXPECT_EQ(g.replica(r).shard().counters().pushes_applied, 80u) << "replica " << r;
    ExpectIdentical(g.replica(p), g.replica(r));
  }
  EXPECT_EQ(g.replica(p).shard().min_clock(), 40);

  // The primary's stats say how far its backups are behind. The network is made reliable
  // first and drained: a late duplicate of a push (delivered after its jitter) is logged
  // again (the shard then ignores it), so under faults the log may grow between the stats
  // and the check.
  g.net().SetFaults(Direction::kToShard, "", {});
  g.net().SetFaults(Direction::kToClient, "", {});
  for (int i = 0; i < 100; ++i) g.Step();  // 100 x 200 us of real time: past every jitter
  ASSERT_TRUE(Settle(g, 3));
  const uint64_t rid = a.NextRid();
  auto stats = a.Call(rid, MakeStats(rid));
  ASSERT_TRUE(stats && std::holds_alternative<ShardStats>(*stats));
  const ShardStats& st = std::get<ShardStats>(*stats);
  EXPECT_EQ(st.replicas, 3u);
  EXPECT_EQ(st.replica, static_cast<uint32_t>(p));
  EXPECT_EQ(st.term, g.replica(p).term());
  EXPECT_EQ(st.log_index, g.replica(p).last_index());
  EXPECT_EQ(st.replication_lag, 0u);
  EXPECT_EQ(st.replicas_in_sync, 3u);
}

// The number of threads a shard shares its updates among is its own (--update-threads): a
// replica with three and one with one end bit-identical, whichever leads, on a table large
// enough to be split (327680 floats) under momentum, pushes on their own and clock steps.
TEST_F(ReplicaTest, ReplicasSharingUpdatesAmongDifferentThreadsEndBitIdentical) {
  Group g(2, {}, {}, /*seed=*/5);
  g.set_update_threads(1, 3);
  g.StartAll();
  Elect(g);
  Worker a(g, 1), b(g, 2);
  TableSpec spec = Spec(OptimizerKind::kMomentum, 0.01f, /*rows=*/1024, /*cols=*/320);
  spec.optimizer.momentum = 0.9f;
  spec.optimizer.weight_decay = 0.001f;
  a.CreateTable(spec);
  a.Register();
  b.Register();
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> ga(spec.rows * spec.cols), gb(ga.size());
  for (int i = 0; i < 6; ++i) {
    for (auto& v : ga) v = normal(rng);
    for (auto& v : gb) v = normal(rng);
    // Odd iterations' pushes are weighted clock steps, summed and applied as one step.
    const PushWeight wa = i % 2 ? PushWeight{40, 64, true} : PushWeight{};
    const PushWeight wb = i % 2 ? PushWeight{24, 64, true} : PushWeight{};
    ASSERT_TRUE(a.Push(ga, spec.rows, wa));
    ASSERT_TRUE(b.Push(gb, spec.rows, wb));
    ASSERT_TRUE(a.Clock(i + 1));
    ASSERT_TRUE(b.Clock(i + 1));
  }
  ASSERT_TRUE(Settle(g, 2));
  const int p = *g.Primary();
  const int backup = 1 - p;
  for (int r : {p, backup}) {
    EXPECT_EQ(g.replica(r).shard().counters().pushes_applied, 12u) << "replica " << r;
    EXPECT_EQ(g.replica(r).shard().counters().clock_steps, 3u) << "replica " << r;
  }
  // Replica 1 split every update (6 pushes, 6 sums, 3 steps); replica 0 none.
  EXPECT_EQ(g.replica(1).shard().counters().updates_split, 15u);
  EXPECT_EQ(g.replica(0).shard().counters().updates_split, 0u);
  ExpectIdentical(g.replica(p), g.replica(backup));
}

// Found by the test above failing now and then under load: an expiry sweep, logged every
// 100 ms whenever the shard had a table, dense or not, landed between the stats and the
// check. Only a sparse table whose rows expire needs sweeps; an idle primary without one
// logs nothing.
TEST_F(ReplicaTest, AnIdlePrimaryWithoutExpiringRowsLogsNothing) {
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f));
  ASSERT_TRUE(Settle(g, 2));
  const int p = *g.Primary();
  const uint64_t last = g.replica(p).last_index();
  for (int i = 0; i < 2000; ++i) g.Step();  // 2 s of the shard's clock
  EXPECT_EQ(g.replica(p).last_index(), last);

  // A sparse table whose rows expire is swept, and each sweep is logged.
  TableSpec s;
  s.name = "emb";
  s.cols = 4;
  s.kind = TableKind::kSparse;
  s.sparse.expire_after_clocks = 5;
  worker().CreateTable(s);
  const uint64_t created = g.replica(p).last_index();
  for (int i = 0; i < 2000; ++i) g.Step();
  EXPECT_GE(g.replica(p).last_index(), created + 15) << "about one sweep per 100 ms";
  ASSERT_TRUE(Settle(g, 2));
  ExpectIdentical(g.replica(0), g.replica(1));
}

TEST_F(ReplicaTest, APushIsAcknowledgedOnlyOnceEveryInSyncBackupHoldsIt) {
  Group& g = SetUpGroup(3, Spec(OptimizerKind::kSgd, 1.f));
  ASSERT_EQ(*g.Primary(), 0);
  Worker& w = worker();
  ASSERT_TRUE(Settle(g, 3));
  EXPECT_EQ(g.coordinator().View(0).in_sync, (std::vector<uint32_t>{0, 1, 2}));

  // Replica 2 hears nothing from the primary now.
  g.net().AddRule([](const Packet& p) -> std::optional<Verdict> {
    if (p.direction == Direction::kToShard && p.address == "r2") return Verdict{Verdict::kDrop};
    return std::nullopt;
  });
  const uint64_t rid = w.NextRid();
  (void)w.transport().Send(0, MakePush(rid, 0, Rows::Range(0, 8), 1, 1, 1, DType::kF32,
                                       EncodeValues(IntGrad(1, 32), DType::kF32)));
  for (int i = 0; i < 500; ++i) g.Step();  // half the backup timeout
  EXPECT_FALSE(w.transport().Receive(0ms)->has_value()) << "acknowledged before r2 held it";
  EXPECT_GT(g.replica(0).held_replies(), 0u);
  EXPECT_EQ(g.replica(1).last_index(), g.replica(0).last_index()) << "r1 holds it";
  // Past the timeout the primary removes r2 from the in-sync set, then acknowledges.
  std::optional<std::pair<int, Message>> reply;
  for (int i = 0; i < 2000 && !reply; ++i) {
    g.Step();
    auto in = w.transport().Receive(0ms);
    if (in.ok() && in->has_value()) reply = std::move(**in);
  }
  ASSERT_TRUE(reply);
  EXPECT_EQ(g.coordinator().View(0).in_sync, (std::vector<uint32_t>{0, 1}));

  // r2 cannot lead: when the primary dies, only r1 may take over.
  g.Kill(0);
  g.coordinator().ExpireLease(0, 0);
  auto won = g.handle(2).Campaign();
  ASSERT_TRUE(won.ok());
  EXPECT_FALSE(*won) << "a replica out of the in-sync set was elected";
  g.net().ClearRules();
  for (int i = 0; i < 1000 && !g.Primary(); ++i) g.Step();
  ASSERT_EQ(g.Primary(), std::optional<int>(1));
  EXPECT_EQ(g.replica(1).term(), 2u);
  ASSERT_TRUE(Settle(g, 3));
  EXPECT_EQ(TableValues(g.replica(1))[0], -IntGrad(1, 32)[0]);
  ExpectIdentical(g.replica(1), g.replica(2));
}

TEST_F(ReplicaTest, ADeposedPrimaryGathersNoAcknowledgementAndReleasesNoReply) {
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f));
  ASSERT_EQ(*g.Primary(), 0);
  Worker& w = worker();
  ASSERT_TRUE(Settle(g, 2));

  // The coordinator ends r0's lease behind its back (r0 paused, say): it still believes
  // itself primary. r1 is elected; its appends to r0 are held back for now.
  g.coordinator().ExpireLease(0, 0);
  g.net().AddRule([](const Packet& p) -> std::optional<Verdict> {
    if (p.direction == Direction::kToShard && p.address == "r0") return Verdict{Verdict::kDrop};
    return std::nullopt;
  });
  for (int i = 0; i < 300 && g.Primary() != std::optional<int>(1); ++i) {
    g.Turn(1);
    ++g.now();
  }
  ASSERT_EQ(g.Primary(), std::optional<int>(1));
  ASSERT_TRUE(g.handle(0).LeaseValid()) << "r0 does not know yet";
  g.net().ClearRules();
  ASSERT_EQ(g.replica(0).role(), ReplicaRole::kPrimary);

  // A push to the deposed primary: logged and shipped in term 1, refused by r1.
  const uint64_t rid = w.NextRid();
  const std::vector<float> grad = IntGrad(5, 32);
  Message push =
      MakePush(rid, 0, Rows::Range(0, 8), 1, 1, 1, DType::kF32, EncodeValues(grad, DType::kF32));
  (void)w.transport().Send(0, push);
  g.Turn(0);  // logs the push, ships it in term 1
  for (int i = 0; i < 50; ++i) {
    g.Turn(1);  // refuses term 1: it knows term 2
    g.Turn(0);
    ++g.now();
  }
  EXPECT_EQ(g.replica(0).role(), ReplicaRole::kBackup) << "r0 learnt of term 2";
  EXPECT_EQ(g.replica(0).held_replies(), 0u);
  bool acked_by_r0 = false;
  for (;;) {
    auto in = w.transport().Receive(0ms);
    if (!in.ok() || !in->has_value()) break;
    auto reply = DecodeReply((*in)->second);
    if (reply.ok() && reply->request_id == rid && std::holds_alternative<PushReply>(reply->value))
      acked_by_r0 = true;
  }
  EXPECT_FALSE(acked_by_r0) << "a deposed primary acknowledged a push";
  EXPECT_EQ(TableValues(g.replica(1))[0], 0.f) << "the refused entry reached the new primary";

  // The worker sends it again to the new primary: applied exactly once; r0 catches up
  // (from a snapshot: it applied an entry the new primary never had).
  auto reply = w.Call(rid, push);
  ASSERT_TRUE(reply && std::holds_alternative<PushReply>(*reply));
  EXPECT_TRUE(std::get<PushReply>(*reply).applied);
  ASSERT_TRUE(Settle(g, 2));
  EXPECT_FALSE(g.replica(0).needs_snapshot());
  EXPECT_EQ(TableValues(g.replica(1))[0], -grad[0]);
  ExpectIdentical(g.replica(1), g.replica(0));
}

// With keys (ReplicaOptions::replica_user), only the replicas' own key may send replication
// messages: an append forged with a worker's key reaches neither the backup's log nor its
// tables; the same append from the replicas' key is taken, so the key is what refused it.
// Under backup workers a shard judges a worker's pushes by the bound of its latest pull and
// decides once per iteration whether they are dropped; under work in proportion to speed
// it answers clocks with the speeds the workers reported. A replica that catches up from a
// snapshot must hold all of that as the primary does, or the first pushes after it takes
// over (or after the catch-up, mid-iteration) could be judged differently.
TEST_F(ReplicaTest, ACaughtUpReplicaJudgesEachWorkerAsThePrimaryDoes) {
  ReplicaOptions ro;
  ro.max_log_entries = 8;
  server::ShardOptions so;
  so.backup_workers = 1;
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f), ro, so, /*started=*/1);
  Worker& a = worker();
  Worker b(g, 2);
  b.Register();
  auto pull = [&](Worker& w, uint64_t id, int64_t clock, int64_t staleness) {
    const uint64_t rid = w.NextRid();
    auto r = w.Call(rid, MakePull(rid, 0, Rows::Range(0, 8), id, clock, staleness));
    ASSERT_TRUE(r && std::holds_alternative<PullReply>(*r));
  };
  auto clock = [&](Worker& w, uint64_t id, int64_t c, float speed) {
    const uint64_t rid = w.NextRid();
    auto r = w.Call(rid, MakeClock(rid, id, c, speed));
    ASSERT_TRUE(r && std::holds_alternative<ClockReply>(*r));
  };
  for (int i = 1; i <= 12; ++i) {
    pull(a, 1, i - 1, 2);
    pull(b, 2, i - 1, 3);
    ASSERT_TRUE(a.Push(IntGrad(i, 32), 8));
    ASSERT_TRUE(b.Push(IntGrad(100 + i, 32), 8));
    clock(a, 1, i, 640.f + static_cast<float>(i));
    clock(b, 2, i, 210.5f);
  }
  pull(a, 1, 12, 2);
  ASSERT_TRUE(a.Push(IntGrad(13, 32), 8));  // iteration 13 decided, its clock not yet sent

  g.Start(1);  // the log no longer holds the start: it catches up from a snapshot
  ASSERT_TRUE(Settle(g, 2));
  ASSERT_GE(g.replica(1).snapshots_installed(), 1u);
  const server::ShardSnapshot x = g.replica(0).shard().Snapshot();
  const server::ShardSnapshot y = g.replica(1).shard().Snapshot();
  ASSERT_EQ(x.workers.size(), 2u);
  ASSERT_EQ(y.workers.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE("worker " + std::to_string(x.workers[i].worker_id));
    EXPECT_GE(x.workers[i].staleness, 2);
    EXPECT_TRUE(x.workers[i].speed_reported);
    EXPECT_EQ(y.workers[i].staleness, x.workers[i].staleness);
    EXPECT_EQ(y.workers[i].samples_per_second, x.workers[i].samples_per_second);
    EXPECT_EQ(y.workers[i].speed_reported, x.workers[i].speed_reported);
    EXPECT_EQ(y.workers[i].push_decided_clock, x.workers[i].push_decided_clock);
    EXPECT_EQ(y.workers[i].push_dropped, x.workers[i].push_dropped);
  }
  ExpectIdentical(g.replica(0), g.replica(1));
}

// Clock steps are replicated state: a backup applies the log's weighted pushes and clocks
// as the primary does, and one caught up from a snapshot taken while an iteration's sum was
// pending holds that sum and takes the same step when the iteration ends (Adam: a step
// more or less would show in every value). After a failover the new primary carries on.
TEST_F(ReplicaTest, PendingClockStepsReachACaughtUpBackupAndEveryReplicaStepsAlike) {
  ReplicaOptions ro;
  ro.max_log_entries = 8;
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kAdam, 0.01f), ro, {}, /*started=*/1);
  Worker& a = worker();
  Worker b(g, 2);
  b.Register();
  for (int i = 1; i <= 12; ++i) {
    ASSERT_TRUE(a.Push(IntGrad(i, 32), 8, {48, 64, true}));
    ASSERT_TRUE(b.Push(IntGrad(100 + i, 32), 8, {16, 64, true}));
    ASSERT_TRUE(a.Clock(i));
    ASSERT_TRUE(b.Clock(i));
  }
  ASSERT_TRUE(a.Push(IntGrad(13, 32), 8, {48, 64, true}));  // iteration 12's sum is pending

  g.Start(1);  // the log no longer holds the start: it catches up from a snapshot
  ASSERT_TRUE(Settle(g, 2));
  ASSERT_GE(g.replica(1).snapshots_installed(), 1u);
  EXPECT_EQ(g.replica(1).shard().Snapshot().tables.at(0).pending_clocks,
            (std::vector<int64_t>{12}));
  ExpectIdentical(g.replica(0), g.replica(1));

  ASSERT_TRUE(b.Push(IntGrad(113, 32), 8, {16, 64, true}));
  ASSERT_TRUE(a.Clock(13));
  ASSERT_TRUE(b.Clock(13));
  ASSERT_TRUE(Settle(g, 2));
  EXPECT_TRUE(g.replica(1).shard().Snapshot().tables.at(0).pending_clocks.empty());
  EXPECT_EQ(g.replica(0).shard().Snapshot().tables.at(0).optimizer_steps, 13u);
  ExpectIdentical(g.replica(0), g.replica(1));

  ASSERT_EQ(FailOver(g, 0, 1), std::optional<int>(1));
  ASSERT_TRUE(a.Push(IntGrad(14, 32), 8, {48, 64, true}));
  ASSERT_TRUE(b.Push(IntGrad(114, 32), 8, {16, 64, true}));
  ASSERT_TRUE(a.Clock(14));
  ASSERT_TRUE(b.Clock(14));
  EXPECT_EQ(g.replica(1).shard().Snapshot().tables.at(0).optimizer_steps, 14u);
}

// The primary writes its fp32 pull replies where the transport asks (shared memory with a
// worker on this host, ServeReplica's ReservePayload); a backup applying the same logged
// pull (logged under backup workers) never takes the transport's memory: it answers nobody.
TEST_F(ReplicaTest, OnlyThePrimaryWritesPullRepliesIntoTheTransportsMemory) {
  server::ShardOptions so;
  so.backup_workers = 1;
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f), {}, so);
  Worker& w = worker();
  ASSERT_TRUE(Settle(g, 2));
  std::vector<int> asked(2, 0);
  for (int r = 0; r < 2; ++r) {
    g.replica(r).SetPayloadAllocator([&asked, r](const PeerId&, size_t bytes) {
      ++asked[static_cast<size_t>(r)];
      std::shared_ptr<uint8_t[]> memory(new uint8_t[bytes]);
      uint8_t* data = memory.get();
      return std::optional<WritableFrame>(WritableFrame{data, Frame::Wrap(data, bytes, memory)});
    });
  }
  const std::vector<float> grad = IntGrad(3, 32);
  ASSERT_TRUE(w.Push(grad, 8));
  const uint64_t rid = w.NextRid();
  auto reply = w.Call(rid, MakePull(rid, 0, Rows::Range(0, 8), 1, 0, 5));
  ASSERT_TRUE(reply && std::holds_alternative<PullReply>(*reply));
  ASSERT_TRUE(Settle(g, 2));
  const int p = *g.Primary();
  EXPECT_EQ(asked[static_cast<size_t>(p)], 1) << "the primary's reply";
  EXPECT_EQ(asked[static_cast<size_t>(1 - p)], 0) << "the backup applied the logged pull";
  EXPECT_EQ(g.replica(1 - p).shard().counters().pulls_served, 1u);
}

TEST_F(ReplicaTest, AnAppendFromAWorkersKeyIsRefused) {
  ReplicaOptions ro;
  ro.replica_user = "replica";
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f), ro);
  ASSERT_TRUE(Settle(g, 2));
  const int p = *g.Primary(), b = 1 - p;
  Replica& backup = g.replica(b);
  const uint64_t last = backup.last_index(), term = backup.term();

  ReplEntryWire e;
  e.term = term;
  e.index = last + 1;
  e.now_ms = g.now();
  e.kind = ReplEntryWire::kInput;
  e.peer = "forged";
  e.message = MakePush(1, 0, Rows::Range(0, 8), 1, 1, 99, DType::kF32,
                       EncodeValues(IntGrad(7, 32), DType::kF32));
  ReplAppendMsg m;
  m.term = term;
  m.primary = static_cast<uint32_t>(p);
  m.prev_index = last;
  m.prev_term = term;
  m.commit = last + 1;
  m.entries.push_back(e);
  const std::vector<std::string> addrs{Addr(0), Addr(1)};

  auto worker_key = g.net().Connect(addrs, "w0");
  ASSERT_TRUE(worker_key->Send(b, EncodeReplication(m)).ok());
  g.Turn(b);
  EXPECT_EQ(backup.replication_refused(), 1u);
  EXPECT_EQ(backup.last_index(), last) << "a worker's key appended to the log";
  EXPECT_EQ(TableValues(backup)[0], 0.f);

  auto replica_key = g.net().Connect(addrs, "replica");
  ASSERT_TRUE(replica_key->Send(b, EncodeReplication(m)).ok());
  g.Turn(b);
  EXPECT_EQ(backup.replication_refused(), 1u);
  EXPECT_EQ(backup.last_index(), last + 1) << "the replicas' key is accepted";
}

TEST_F(ReplicaTest, FailoversUnderLossLoseNoAcknowledgedPushAndApplyNoneTwice) {
  ReplicaOptions ro;
  ro.max_log_entries = 64;  // restarted replicas catch up from a snapshot
  Group g(3, ro, {}, /*seed=*/11);
  StartUnderLoss(g);
  Worker w(g, 1);
  w.CreateTable(Spec(OptimizerKind::kSgd, 1.f));
  w.Register();
  std::vector<float> sum(32, 0.f);
  int failovers = 0;
  for (int i = 1; i <= 240; ++i) {
    const std::vector<float> grad = IntGrad(i, 32);
    ASSERT_TRUE(w.Push(grad, 8)) << "push " << i;
    for (size_t k = 0; k < sum.size(); ++k) sum[k] += grad[k];
    if (i % 80 == 0) {
      // SIGKILL the primary; its lease ends; it comes back later as a fresh process.
      const int p = *g.Primary();
      g.Kill(p);
      g.coordinator().ExpireLease(0, static_cast<uint32_t>(p));
      for (int s = 0; s < 3000 && (!g.Primary() || *g.Primary() == p); ++s) g.Step();
      ASSERT_TRUE(g.Primary() && *g.Primary() != p) << "no failover after push " << i;
      ++failovers;
      g.Start(p);
    }
  }
  ASSERT_TRUE(Settle(g, 3));
  EXPECT_EQ(failovers, 3);
  const int p = *g.Primary();
  const std::vector<float> got = TableValues(g.replica(p));
  for (size_t k = 0; k < sum.size(); ++k) ASSERT_EQ(got[k], -sum[k]) << "value " << k;
  for (int r = 0; r < 3; ++r)
    if (r != p) ExpectIdentical(g.replica(p), g.replica(r));
}

TEST_F(ReplicaTest, ANewReplicaCatchesUpFromASnapshotAndTheLogTailWhilePushesGoOn) {
  ReplicaOptions ro;
  ro.max_log_entries = 16;
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kMomentum, 0.1f), ro, {}, /*started=*/1);
  Worker& w = worker();
  for (int i = 1; i <= 60; ++i) ASSERT_TRUE(w.Push(IntGrad(i, 32), 8));
  EXPECT_EQ(g.coordinator().View(0).in_sync, (std::vector<uint32_t>{0}));
  EXPECT_GT(g.replica(0).last_index(), 60u);

  g.Start(1);                  // the log no longer holds the start: a snapshot, then the tail
  int snapshots_observed = 0;  // the metrics' observer, set before the install
  g.replica(1).set_snapshot_observer([&](double) { ++snapshots_observed; });
  for (int i = 61; i <= 120; ++i) ASSERT_TRUE(w.Push(IntGrad(i, 32), 8));
  EXPECT_EQ(g.coordinator().View(0).in_sync, (std::vector<uint32_t>{0, 1}));
  ASSERT_TRUE(Settle(g, 2));
  ExpectIdentical(g.replica(0), g.replica(1));
  EXPECT_LT(g.replica(1).shard().counters().pushes_applied,
            g.replica(0).shard().counters().pushes_applied - 50u)
      << "the first pushes came in the snapshot, not from the log";
  // The installed state is a new Shard: the observer went with it.
  const int observed = snapshots_observed;
  ASSERT_TRUE(g.replica(1).mutable_shard().Checkpoint().ok());
  EXPECT_EQ(snapshots_observed, observed + 1);

  // Restarted (state lost), it catches up again and can take over with everything.
  g.Kill(1);
  g.Start(1);
  for (int i = 121; i <= 180; ++i) ASSERT_TRUE(w.Push(IntGrad(i, 32), 8));
  ASSERT_TRUE(Settle(g, 2));
  EXPECT_EQ(g.coordinator().View(0).in_sync, (std::vector<uint32_t>{0, 1}));
  ExpectIdentical(g.replica(0), g.replica(1));
  ASSERT_EQ(FailOver(g, 0, 1), std::optional<int>(1));
  ASSERT_TRUE(w.Push(IntGrad(181, 32), 8));
}

// Found by the docker test's replicated case: a backup caught up from a snapshot lost the
// chunk leases (the snapshot held the progress only), so it granted other chunks than the
// primary as it applied the log; after a failover a chunk stayed leased to a worker that
// never trained it and the job waited for it forever.
TEST_F(ReplicaTest,
       ABackupCaughtUpFromASnapshotHoldsTheSameChunkLeasesAndTheJobEndsAfterAFailover) {
  ReplicaOptions ro;
  ro.max_log_entries = 16;
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.0f), ro, {}, /*started=*/1);
  Worker& w = worker();
  Worker other(g, 2);
  other.Register();
  const DataPlan plan{40, 4, 2, 3};
  std::optional<ChunkGrant> mine = w.NextChunk(plan, nullptr);
  std::optional<ChunkGrant> theirs = other.NextChunk(plan, nullptr);
  ASSERT_TRUE(mine && theirs);
  for (int i = 1; i <= 40; ++i) ASSERT_TRUE(w.Push(IntGrad(i, 32), 8));  // past the log
  g.Start(1);
  for (int s = 0; s < 2000 && g.coordinator().View(0).in_sync.size() < 2; ++s) g.Step();
  EXPECT_EQ(g.coordinator().View(0).in_sync, (std::vector<uint32_t>{0, 1}));
  ASSERT_TRUE(Settle(g, 2));
  ExpectIdentical(g.replica(0), g.replica(1));
  // Both train on through a failover to the replica that came from the snapshot.
  std::map<std::pair<uint32_t, uint32_t>, int> trained;
  auto step = [&](Worker& x, std::optional<ChunkGrant>& held) {
    std::optional<ChunkDone> done;
    if (held && held->kind == ChunkGrant::Kind::kChunk) {
      ++trained[{held->epoch, held->chunk}];
      done = ChunkDone{held->epoch, held->chunk};
    }
    held = x.NextChunk(plan, done ? &*done : nullptr);
    ASSERT_TRUE(held);
  };
  step(w, mine);
  step(other, theirs);
  ASSERT_TRUE(Settle(g, 2));
  ExpectIdentical(g.replica(0), g.replica(1));
  ASSERT_EQ(FailOver(g, 0, 1), std::optional<int>(1));
  for (int i = 0; i < 40 && !(mine->kind == ChunkGrant::Kind::kFinished &&
                              theirs->kind == ChunkGrant::Kind::kFinished);
       ++i) {
    step(w, mine);
    step(other, theirs);
  }
  EXPECT_EQ(mine->kind, ChunkGrant::Kind::kFinished);
  EXPECT_EQ(theirs->kind, ChunkGrant::Kind::kFinished);
  EXPECT_EQ(trained.size(), 20u);  // 10 chunks in each of 2 epochs
  for (const auto& [chunk, n] : trained) EXPECT_EQ(n, 1) << chunk.first << "/" << chunk.second;
}

TEST_F(ReplicaTest, ARestartedReplicaThatLostItsLogDoesNotLeadBeforeItIsCaughtUp) {
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f));
  Worker& w = worker();
  ASSERT_TRUE(w.Push(IntGrad(1, 32), 8));
  ASSERT_TRUE(Settle(g, 2));
  ASSERT_EQ(g.coordinator().View(0).in_sync, (std::vector<uint32_t>{0, 1}));
  // Backup restarts empty while still listed in sync; then the primary dies.
  g.Kill(1);
  g.Start(1);
  g.Kill(0);
  g.coordinator().ExpireLease(0, 0);
  for (int s = 0; s < 500; ++s) g.Step();
  EXPECT_FALSE(g.Primary()) << "an emptied replica took over and would lose the push";
}

// Every replica stopped cleanly at once (compose down and up, a node rebooted): each keeps
// its log with its final snapshot, so the group elects a primary by itself and loses nothing
// acknowledged, a backup's entries past its applied state included.
TEST_F(ReplicaTest, AGroupStoppedCleanlyAllAtOnceStartsAgainWithItsLogsAndLosesNothing) {
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f));
  Worker& w = worker();
  SummedPushes pushes(w);
  auto push = [&](uint64_t i) { return pushes.Push(i); };
  for (uint64_t i = 1; i <= 10; ++i) ASSERT_TRUE(push(i));
  const int p = *g.Primary();
  const int b = 1 - p;
  // The last push acknowledged is applied by the primary; the backup holds it but has not
  // heard it committed yet (the commit index comes with the primary's next append).
  ASSERT_GT(g.replica(p).last_index(), g.replica(b).applied_index());
  EXPECT_EQ(g.replica(b).last_index(), g.replica(p).last_index());
  auto store_p = g.Stop(p);
  auto store_b = g.Stop(b);
  g.Start(b, std::move(store_b));
  g.Start(p, std::move(store_p));
  EXPECT_TRUE(g.restored(p));
  EXPECT_TRUE(g.restored(b));
  Elect(g);
  ASSERT_TRUE(push(11)) << "no push acknowledged after the group started again";
  ASSERT_TRUE(Settle(g, 2));
  const int q = *g.Primary();
  EXPECT_EQ(g.replica(q).term(), 2u);
  ExpectBothHold(g, pushes.sum());
  EXPECT_EQ(g.coordinator().View(0).in_sync, (std::vector<uint32_t>{0, 1}));
}

// The primary stops first and the backup goes on alone (leaving it out of the in-sync set)
// before it stops too. Started again, only the replica that went on may lead, whatever order
// they start in: the other's log lacks what it acknowledged alone.
TEST_F(ReplicaTest, AfterCleanStopsOnlyTheReplicaThatWentOnLastMayLead) {
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f));
  Worker& w = worker();
  SummedPushes pushes(w);
  auto push = [&](uint64_t i) { return pushes.Push(i); };
  ASSERT_TRUE(push(1));
  const int first = *g.Primary();
  const int last = 1 - first;
  auto store_first = g.Stop(first);  // resigns: the backup takes over without it
  ASSERT_TRUE(push(2));
  ASSERT_EQ(g.Primary(), std::optional<int>(last));
  ASSERT_EQ(g.coordinator().View(0).in_sync, (std::vector<uint32_t>{static_cast<uint32_t>(last)}));
  auto store_last = g.Stop(last);
  g.Start(first, std::move(store_first));
  EXPECT_TRUE(g.restored(first)) << "it kept its log, though it may not lead with it";
  for (int s = 0; s < 500; ++s) g.Step();
  EXPECT_FALSE(g.Primary()) << "the replica the group went on without took over";
  g.Start(last, std::move(store_last));
  Elect(g);
  EXPECT_EQ(g.Primary(), std::optional<int>(last));
  ASSERT_TRUE(push(3));
  ASSERT_TRUE(Settle(g, 2));
  for (int r = 0; r < 2; ++r)
    ASSERT_NO_FATAL_FAILURE(ExpectMinus(g.replica(r), pushes.sum())) << "replica " << r;
}

// A stop record is used once: started again from it, the replica writes a snapshot without
// it at once, so if it is then killed (and acknowledged more meanwhile), its next start does
// not bring the old log back; it starts empty and is caught up.
TEST_F(ReplicaTest, AStopRecordIsUsedOnceAndAKillAfterwardsStartsEmpty) {
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f));
  Worker& w = worker();
  ASSERT_TRUE(w.Push(IntGrad(1, 32), 8));
  ASSERT_TRUE(Settle(g, 2));
  const int b = 1 - *g.Primary();
  auto store = g.Stop(b);
  ASSERT_FALSE(store->Load().value()->replica_stop.empty()) << "a clean stop keeps its log";
  g.Start(b, std::move(store));
  ASSERT_TRUE(g.restored(b));
  ASSERT_TRUE(w.Push(IntGrad(2, 32), 8));
  ASSERT_TRUE(Settle(g, 2));
  store = g.KillKeepingStore(b);
  EXPECT_TRUE(store->Load().value()->replica_stop.empty());
  g.coordinator().ExpireLease(0, static_cast<uint32_t>(b));
  g.Start(b, std::move(store));
  EXPECT_FALSE(g.restored(b));
  EXPECT_EQ(g.replica(b).applied_index(), 0u);
  ASSERT_TRUE(w.Push(IntGrad(3, 32), 8));
  ASSERT_TRUE(Settle(g, 2));
  ExpectIdentical(g.replica(0), g.replica(1));
}

// A clean stop's log means something only to the coordinator that saw it: against a new
// one (compose `down` and `up` recreates etcd: a new job), the replicas start empty, as they
// always did, and the new job's terms are not refused as older than the old job's.
TEST_F(ReplicaTest, AStopRecordIsNotUsedWithACoordinatorThatForgotTheGroup) {
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f));
  ASSERT_TRUE(worker().Push(IntGrad(1, 32), 8));
  ASSERT_TRUE(Settle(g, 2));
  const int p = *g.Primary();
  g.Kill(p);  // a failover first, so the records are of term 2
  g.coordinator().ExpireLease(0, static_cast<uint32_t>(p));
  Elect(g);
  auto kept = g.Stop(1 - p);
  ASSERT_FALSE(kept->Load().value()->replica_stop.empty());
  g.NewCoordinator();
  g.Start(0);  // the other replica's data is gone: it starts empty and leads term 1
  Elect(g);
  g.Start(1, std::move(kept));
  EXPECT_FALSE(g.restored(1));
  EXPECT_EQ(g.replica(1).applied_index(), 0u);
  Worker w(g, 2);
  w.CreateTable(Spec(OptimizerKind::kSgd, 1.f));
  w.Register();
  ASSERT_TRUE(w.Push(IntGrad(5, 32), 8));
  ASSERT_TRUE(Settle(g, 2));
  for (int r = 0; r < 2; ++r)
    ASSERT_NO_FATAL_FAILURE(ExpectMinus(g.replica(r), IntGrad(5, 32))) << "replica " << r;
}

// A durable log directory of the test's own, removed with it.
// ---- backups that answer (ReplicaOptions::backup_answers) --------------------------------

// Where the reply to one request came from: worker w sends `m` (request id `rid`) to
// replica `to` and the group turns until the reply arrives, then 300 steps more, counting
// any other reply to it.
struct Answered {
  int from = -1;  // the connection (replica) it came on; -1: none came
  std::optional<Reply> reply;
  int more = 0;  // replies to it after the first
};
Answered SendAndWatch(Group& g, Worker& w, int to, uint64_t rid, const Message& m) {
  Answered a;
  EXPECT_TRUE(w.transport().Send(to, m).ok());
  for (int step = 0; step < 2300 && (a.from < 0 || step < 300); ++step) {
    g.Step();
    for (;;) {
      auto in = w.transport().Receive(0ms);
      if (!in.ok() || !in->has_value()) break;
      auto reply = DecodeReply((*in)->second);
      if (!reply.ok() || reply->request_id != rid) continue;  // heartbeats' answers
      if (a.from >= 0) {
        ++a.more;
        continue;
      }
      a.from = (*in)->first;
      a.reply = reply->value;
      step = 0;  // 300 more from here
    }
  }
  return a;
}

TEST_F(ReplicaTest, ASoleInSyncBackupAnswersPushesAndClocksAndThePrimaryDropsItsOwnReplies) {
  ReplicaOptions ro;
  ro.backup_answers = true;
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f), ro);
  ASSERT_EQ(*g.Primary(), 0);
  Worker& w = worker();
  ASSERT_TRUE(Settle(g, 2));
  ASSERT_EQ(g.coordinator().View(0).in_sync, (std::vector<uint32_t>{0, 1}));
  std::vector<float> sum(32, 0.f);
  uint64_t seq = 100;
  auto push = [&](uint64_t worker, const std::vector<float>& grad) {
    const uint64_t rid = w.NextRid();
    return std::pair(rid, MakePush(rid, 0, Rows::Range(0, 8), worker, 1, ++seq, DType::kF32,
                                   EncodeValues(grad, DType::kF32)));
  };
  auto add = [&](const std::vector<float>& grad) {
    for (size_t k = 0; k < sum.size(); ++k) sum[k] += grad[k];
  };

  // The backup has not heard from the worker: the primary answers.
  auto [rid1, m1] = push(1, IntGrad(1, 32));
  Answered a = SendAndWatch(g, w, 0, rid1, m1);
  EXPECT_EQ(a.from, 0);
  EXPECT_EQ(a.more, 0);
  add(IntGrad(1, 32));

  // Its heartbeat on a connection to the backup: from now on the backup answers its pushes
  // and clocks on that connection, and only it.
  w.Heartbeat(1);
  for (int i = 0; i < 10; ++i) g.Step();
  auto [rid2, m2] = push(1, IntGrad(2, 32));
  a = SendAndWatch(g, w, 0, rid2, m2);
  EXPECT_EQ(a.from, 1) << "the backup did not answer";
  EXPECT_EQ(a.more, 0) << "answered twice";
  ASSERT_TRUE(a.reply && std::holds_alternative<PushReply>(*a.reply));
  EXPECT_TRUE(std::get<PushReply>(*a.reply).applied);
  add(IntGrad(2, 32));
  EXPECT_EQ(g.replica(1).backup_answered(), 1u);
  EXPECT_EQ(g.replica(0).replies_left_to_backup(), 1u);

  // A resent push is a duplicate there too, and says so.
  a = SendAndWatch(g, w, 0, rid2, m2);
  EXPECT_EQ(a.from, 1);
  ASSERT_TRUE(a.reply && std::holds_alternative<PushReply>(*a.reply));
  EXPECT_FALSE(std::get<PushReply>(*a.reply).applied) << "applied twice";

  // A clock: the backup's reply carries the same minimum clock as the primary's would.
  uint64_t rid = w.NextRid();
  a = SendAndWatch(g, w, 0, rid, MakeClock(rid, 1, 1));
  EXPECT_EQ(a.from, 1);
  ASSERT_TRUE(a.reply && std::holds_alternative<ClockReply>(*a.reply));
  EXPECT_EQ(std::get<ClockReply>(*a.reply).min_clock, 1);

  // A gradient holding NaN: refused, by the backup, with the primary's error.
  std::vector<float> bad = IntGrad(3, 32);
  bad[17] = std::numeric_limits<float>::quiet_NaN();
  auto [rid3, m3] = push(1, bad);
  a = SendAndWatch(g, w, 0, rid3, m3);
  EXPECT_EQ(a.from, 1);
  ASSERT_TRUE(a.reply && std::holds_alternative<ErrorReply>(*a.reply));
  EXPECT_EQ(std::get<ErrorReply>(*a.reply).status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.more, 0);

  // Pulls are the primary's to answer.
  rid = w.NextRid();
  a = SendAndWatch(g, w, 0, rid, MakePull(rid, 0, Rows::Range(0, 8), 1, 0, 1 << 20));
  EXPECT_EQ(a.from, 0);
  ASSERT_TRUE(a.reply && std::holds_alternative<PullReply>(*a.reply));

  // A worker the backup has not heard from (another one) is answered by the primary.
  Worker w2(g, 2);
  w2.Register();
  rid = w2.NextRid();
  a = SendAndWatch(g, w2, 0, rid,
                   MakePush(rid, 0, Rows::Range(0, 8), 2, 1, 1, DType::kF32,
                            EncodeValues(IntGrad(4, 32), DType::kF32)));
  EXPECT_EQ(a.from, 0);
  EXPECT_EQ(a.more, 0);
  add(IntGrad(4, 32));

  // Nor does a backup answer for a worker whose heartbeats came from another incarnation.
  auto [rid5, m5] = push(1, IntGrad(5, 32));
  Message other = MakePush(rid5, 0, Rows::Range(0, 8), 1, 2, 1, DType::kF32,
                           EncodeValues(IntGrad(5, 32), DType::kF32));
  a = SendAndWatch(g, w, 0, rid5, other);
  EXPECT_NE(a.from, 1);

  ASSERT_TRUE(Settle(g, 2));
  EXPECT_EQ(g.replica(1).backup_answered(), 4u);  // two pushes, a clock, the NaN push
  EXPECT_EQ(g.replica(0).replies_left_to_backup(), 4u);
  ExpectIdentical(g.replica(0), g.replica(1));
}

// leash-worker sends an iteration's pushes and clock as one batch: the backup answers the
// batch; a pull of the same worker that the batch's clock releases is still the primary's.
TEST_F(ReplicaTest, TheBackupAnswersABatchsPushesAndClockAndThePrimaryThePullItsClockReleased) {
  ReplicaOptions ro;
  ro.backup_answers = true;
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f), ro);
  Worker& w = worker();
  ASSERT_TRUE(Settle(g, 2));
  w.Heartbeat(1);
  // A pull for clock 1 at staleness 0 waits for the minimum clock to reach 1.
  const uint64_t pull = w.NextRid();
  ASSERT_TRUE(w.transport().Send(0, MakePull(pull, 0, Rows::Range(0, 8), 1, 1, 0)).ok());
  for (int i = 0; i < 50; ++i) g.Step();
  for (auto in = w.transport().Receive(0ms); in.ok() && in->has_value();
       in = w.transport().Receive(0ms)) {
    EXPECT_NE(PeekRequestId((*in)->second), pull) << "the pull did not wait";
  }
  const uint64_t push = w.NextRid();
  const uint64_t clock = w.NextRid();
  std::vector<Message> batch;
  batch.push_back(MakePush(push, 0, Rows::Range(0, 8), 1, 1, 1, DType::kF32,
                           EncodeValues(IntGrad(1, 32), DType::kF32)));
  batch.push_back(MakeClock(clock, 1, 1));
  ASSERT_TRUE(w.transport().Send(0, PackBatch(std::move(batch))).ok());
  std::map<uint64_t, std::vector<int>> from;  // request id -> the connections its replies came on
  for (int i = 0; i < 500; ++i) {
    g.Step();
    for (;;) {
      auto in = w.transport().Receive(0ms);
      if (!in.ok() || !in->has_value()) break;
      std::vector<Message> parts;
      if (IsBatch((*in)->second)) {
        parts = UnpackBatch((*in)->second).value();
      } else {
        parts.push_back((*in)->second);
      }
      for (const Message& m : parts) {
        auto reply = DecodeReply(m);
        ASSERT_TRUE(reply.ok());
        from[reply->request_id].push_back((*in)->first);
      }
    }
  }
  EXPECT_EQ(from[push], std::vector<int>{1});
  EXPECT_EQ(from[clock], std::vector<int>{1});
  EXPECT_EQ(from[pull], std::vector<int>{0});
  EXPECT_EQ(g.replica(1).backup_answered(), 2u);
  EXPECT_EQ(g.replica(0).replies_left_to_backup(), 2u);
  ExpectIdentical(g.replica(0), g.replica(1));
}

TEST_F(ReplicaTest, OnlyTheOneInSyncBackupOfAPrimaryAnswersAndOnlyWhenAsked) {
  // Three replicas, all in sync: no backup can know the other holds an entry, so the primary
  // answers; once replica 2 is gone and out of the set, replica 1 answers.
  ReplicaOptions ro;
  ro.backup_answers = true;
  Group& g = SetUpGroup(3, Spec(OptimizerKind::kSgd, 1.f), ro);
  ASSERT_EQ(*g.Primary(), 0);
  Worker& w = worker();
  ASSERT_TRUE(Settle(g, 3));
  w.Heartbeat(1);
  w.Heartbeat(2);
  SummedPushes pushes(w);
  uint64_t rid = w.NextRid();
  Answered a = SendAndWatch(g, w, 0, rid, MakeClock(rid, 1, 1));
  EXPECT_EQ(a.from, 0);
  g.Kill(2);
  g.coordinator().ExpireLease(0, 2);
  for (int i = 0; i < 3000 && g.coordinator().View(0).in_sync.size() != 2; ++i) {
    (void)pushes.Push(static_cast<uint64_t>(i));  // the primary notices r2 behind
  }
  ASSERT_EQ(g.coordinator().View(0).in_sync, (std::vector<uint32_t>{0, 1}));
  rid = w.NextRid();
  a = SendAndWatch(g, w, 0, rid, MakeClock(rid, 1, 2));
  EXPECT_EQ(a.from, 1);
  EXPECT_EQ(a.more, 0);

  // Replicas without the option never answer: a group of two without it.
  Group plain(2);
  plain.StartAll();
  Elect(plain);
  Worker p(plain, 1);
  p.CreateTable(Spec(OptimizerKind::kSgd, 1.f));
  p.Register();
  ASSERT_TRUE(Settle(plain, 2));
  p.Heartbeat(1);
  rid = p.NextRid();
  a = SendAndWatch(plain, p, *plain.Primary(), rid, MakeClock(rid, 1, 1));
  EXPECT_EQ(a.from, *plain.Primary());
  EXPECT_EQ(a.more, 0);
}

TEST_F(ReplicaTest, FailoversUnderLossWithAnsweringBackupsLoseNoAcknowledgedPushAndApplyNoneTwice) {
  ReplicaOptions ro;
  ro.max_log_entries = 64;  // restarted replicas catch up from a snapshot
  ro.backup_answers = true;
  Group g(2, ro, {}, /*seed=*/13);
  StartUnderLoss(g);
  Worker w(g, 1);
  w.CreateTable(Spec(OptimizerKind::kSgd, 1.f));
  w.Register();
  w.set_heartbeats(2);
  SummedPushes pushes(w);
  uint64_t answered = 0;
  for (int i = 1; i <= 240; ++i) {
    ASSERT_TRUE(pushes.Push(static_cast<uint64_t>(i))) << "push " << i;
    if (i % 60 == 0) {
      // SIGKILL the primary; the backup takes over; the killed one comes back, is caught up
      // and answers as the new primary's backup.
      const int p = *g.Primary();
      answered += g.replica(p).backup_answered();  // what it answered as a backup before
      g.Kill(p);
      g.coordinator().ExpireLease(0, static_cast<uint32_t>(p));
      for (int s = 0; s < 3000 && (!g.Primary() || *g.Primary() == p); ++s) g.Step();
      ASSERT_TRUE(g.Primary() && *g.Primary() != p) << "no failover after push " << i;
      g.Start(p);
      // Two replicas: the next kill can fail over only once this one is in sync again.
      for (int s = 0; s < 5000 && g.coordinator().View(0).in_sync.size() != 2; ++s) g.Step();
      ASSERT_EQ(g.coordinator().View(0).in_sync.size(), 2u) << "not caught up after push " << i;
    }
  }
  ASSERT_TRUE(Settle(g, 2));
  const int p = *g.Primary();
  answered += g.replica(0).backup_answered() + g.replica(1).backup_answered();
  EXPECT_GT(answered, 100u) << "the backups hardly answered";
  ExpectMinus(g.replica(p), pushes.sum());
  ExpectIdentical(g.replica(0), g.replica(1));
}

class DurableDir {
 public:
  DurableDir()
      : path_(std::filesystem::path(::testing::TempDir()) /
              ("replica_durable_" + std::to_string(::getpid()) + "_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name())) {
    std::filesystem::remove_all(path_);
  }
  ~DurableDir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// A group's options with durable logs in `dir`; a backup more than 4 entries behind is
// caught up by a snapshot.
ReplicaOptions DurableBehindByFour(const DurableDir& dir) {
  ReplicaOptions ro;
  ro.durable_log_dir = dir.path();
  ro.max_log_entries = 4;
  return ro;
}

// Pushes 1-5, kills the backup and pushes 6-30 without it (the primary goes on alone), so
// that a backup started again is caught up by a snapshot. Returns the primary.
int PushWhileTheBackupIsDown(Group& g, SummedPushes& pushes) {
  for (uint64_t i = 1; i <= 5; ++i) EXPECT_TRUE(pushes.Push(i));
  const int p = *g.Primary();
  g.Kill(1 - p);
  for (uint64_t i = 6; i <= 30; ++i) EXPECT_TRUE(pushes.Push(i));
  return p;
}

// Every replica SIGKILLed at once (a power cut of the host they share, an OOM kill of
// both), with durable logs: each starts again from its last snapshot and the log written
// since, either may lead, and nothing acknowledged is lost or applied twice. The files are
// cut by snapshots as they grow (a small bound here), so what a replica starts from is a
// snapshot, a file begun with it, and the backup's entries not yet known committed. Twice:
// the second time from what the first restart wrote.
TEST_F(ReplicaTest, AGroupKilledAllAtOnceStartsAgainFromItsDurableLogsAndLosesNothing) {
  DurableDir dir;
  ReplicaOptions ro;
  ro.durable_log_dir = dir.path();
  ro.durable_log_max_bytes = 4096;
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f), ro);
  Worker& w = worker();
  SummedPushes pushes(w);
  uint64_t i = 0;
  for (int round = 0; round < 2; ++round) {
    for (int k = 0; k < 40; ++k) ASSERT_TRUE(pushes.Push(++i));
    const int p = *g.Primary();
    const int b = 1 - p;
    ASSERT_GT(g.replica(p).last_index(), g.replica(b).applied_index())
        << "the backup holds the last push without knowing it committed";
    EXPECT_GT(g.replica(p).durable_records(), 40u);
    EXPECT_GT(g.replica(b).shard().counters().snapshots, 0u) << "the files were cut";
    auto store_p = g.KillKeepingStore(p);
    auto store_b = g.KillKeepingStore(b);
    g.coordinator().ExpireLease(0, static_cast<uint32_t>(p));
    g.coordinator().ExpireLease(0, static_cast<uint32_t>(b));
    for (const int r : {p, b}) {
      int files = 0;
      for (const auto& e : std::filesystem::directory_iterator(g.DurableDir(r)))
        files += e.path().filename().string().starts_with("log-");
      EXPECT_EQ(files, 1) << "one file per replica (and the spare): the snapshots deleted the rest";
    }
    // The former backup first, alone: it may lead by itself (it held every acknowledged push).
    g.Start(b, std::move(store_b));
    EXPECT_TRUE(g.restored(b));
    Elect(g);
    EXPECT_EQ(g.Primary(), std::optional<int>(b));
    ASSERT_TRUE(pushes.Push(++i)) << "no push acknowledged after the group started again";
    g.Start(p, std::move(store_p));
    EXPECT_TRUE(g.restored(p));
    ASSERT_TRUE(Settle(g, 2));
    for (int s = 0; s < 3000 && g.coordinator().View(0).in_sync.size() < 2; ++s) g.Step();
    ExpectBothHold(g, pushes.sum());
    EXPECT_EQ(g.coordinator().View(0).in_sync, (std::vector<uint32_t>{0, 1}));
  }
}

// Backups that answer, with durable logs: the primary writes each entry to its log before
// shipping it, so whichever replica leads after both are killed at once holds everything
// the backup acknowledged to the worker.
TEST_F(ReplicaTest, WithAnsweringBackupsAGroupKilledAllAtOnceLosesNothingWhicheverLeadsFirst) {
  DurableDir dir;
  ReplicaOptions ro;
  ro.durable_log_dir = dir.path();
  ro.backup_answers = true;
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f), ro);
  Worker& w = worker();
  w.set_heartbeats(2);
  SummedPushes pushes(w);
  uint64_t i = 0;
  for (int round = 0; round < 2; ++round) {
    const int p = *g.Primary();
    const int b = 1 - p;
    const uint64_t answered = g.replica(b).backup_answered();
    for (int k = 0; k < 30; ++k) ASSERT_TRUE(pushes.Push(++i));
    EXPECT_GT(g.replica(b).backup_answered(), answered + 20) << "round " << round;
    auto store_p = g.KillKeepingStore(p);
    auto store_b = g.KillKeepingStore(b);
    g.coordinator().ExpireLease(0, static_cast<uint32_t>(p));
    g.coordinator().ExpireLease(0, static_cast<uint32_t>(b));
    // The former primary first in round 0, the former backup in round 1: either may lead.
    const int first = round == 0 ? p : b;
    g.Start(first, std::move(first == p ? store_p : store_b));
    EXPECT_TRUE(g.restored(first));
    Elect(g);
    EXPECT_EQ(g.Primary(), std::optional<int>(first));
    ASSERT_TRUE(pushes.Push(++i)) << "no push acknowledged after the group started again";
    g.Start(1 - first, std::move(first == p ? store_b : store_p));
    ASSERT_TRUE(Settle(g, 2));
    for (int s = 0; s < 3000 && g.coordinator().View(0).in_sync.size() < 2; ++s) g.Step();
    ExpectBothHold(g, pushes.sum());
  }
}

// With fsync the primary answers (it acknowledges once its own disk holds the entry).
TEST_F(ReplicaTest, WithAFsyncedDurableLogThePrimaryAnswersItself) {
  DurableDir dir;
  ReplicaOptions ro;
  ro.durable_log_dir = dir.path();
  ro.durable_log_fsync = true;
  ro.backup_answers = true;
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f), ro);
  Worker& w = worker();
  ASSERT_TRUE(Settle(g, 2));
  w.Heartbeat(1);
  const uint64_t rid = w.NextRid();
  Answered a = SendAndWatch(g, w, *g.Primary(), rid, MakeClock(rid, 1, 1));
  EXPECT_EQ(a.from, *g.Primary());
  EXPECT_EQ(a.more, 0);
  EXPECT_EQ(g.replica(1 - *g.Primary()).backup_answered(), 0u);
}

// A replica that was being caught up when the group was killed (it could not lead then)
// starts empty again from its durable log and does not lead; the other, which could and is
// the in-sync set, leads alone from its own.
TEST_F(ReplicaTest, AReplicaKilledWhileItCouldNotLeadDoesNotLeadFromItsDurableLog) {
  DurableDir dir;
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f), DurableBehindByFour(dir));
  SummedPushes pushes(worker());
  const int p = PushWhileTheBackupIsDown(g, pushes);
  ASSERT_FALSE(HasFailure());
  const int b = 1 - p;
  g.net().AddRule([addr = Addr(b)](const Packet& pk) -> std::optional<Verdict> {
    if (pk.direction != Direction::kToShard || pk.address != addr) return std::nullopt;
    auto d = DecodeReplication(*pk.message);
    if (d.ok() && std::holds_alternative<ReplSnapshotMsg>(d->value)) return Verdict{Verdict::kDrop};
    return std::nullopt;
  });
  g.Start(b);
  for (int s = 0; s < 500; ++s) g.Step();
  ASSERT_FALSE(g.replica(b).has_state() && g.replica(b).applied_index() > 0)
      << "the snapshot transfer was to be held back";
  auto store_p = g.KillKeepingStore(p);
  auto store_b = g.KillKeepingStore(b);
  g.coordinator().ExpireLease(0, static_cast<uint32_t>(p));
  g.coordinator().ExpireLease(0, static_cast<uint32_t>(b));
  g.Start(b, std::move(store_b));
  EXPECT_FALSE(g.restored(b)) << "it could not lead when it was killed";
  for (int s = 0; s < 500; ++s) g.Step();
  EXPECT_FALSE(g.Primary()) << "it is not in the in-sync set and lacks the log";
  g.Start(p, std::move(store_p));
  EXPECT_TRUE(g.restored(p));
  Elect(g);
  EXPECT_EQ(g.Primary(), std::optional<int>(p));
  ASSERT_TRUE(pushes.Push(31));
  ASSERT_NO_FATAL_FAILURE(ExpectMinus(g.replica(p), pushes.sum()));
}

// A backup caught up from a snapshot begins its durable log at that snapshot: killed with
// its primary afterwards, it starts again from the installed snapshot and the entries it
// acknowledged since, and may lead alone.
TEST_F(ReplicaTest, ABackupCaughtUpByASnapshotKeepsItsDurableLogFromThere) {
  DurableDir dir;
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f), DurableBehindByFour(dir));
  SummedPushes pushes(worker());
  const int p = PushWhileTheBackupIsDown(g, pushes);
  ASSERT_FALSE(HasFailure());
  const int b = 1 - p;
  g.Start(b);  // empty: caught up from a snapshot
  for (int s = 0; s < 5000 && g.coordinator().View(0).in_sync.size() < 2; ++s) g.Step();
  ASSERT_EQ(g.coordinator().View(0).in_sync.size(), 2u);
  EXPECT_EQ(g.replica(b).snapshots_installed(), 1u);
  for (uint64_t i = 31; i <= 35; ++i) ASSERT_TRUE(pushes.Push(i));
  auto store_p = g.KillKeepingStore(p);
  auto store_b = g.KillKeepingStore(b);
  g.coordinator().ExpireLease(0, static_cast<uint32_t>(p));
  g.coordinator().ExpireLease(0, static_cast<uint32_t>(b));
  g.Start(b, std::move(store_b));
  EXPECT_TRUE(g.restored(b));
  Elect(g);
  EXPECT_EQ(g.Primary(), std::optional<int>(b));
  ASSERT_TRUE(pushes.Push(36));
  ASSERT_NO_FATAL_FAILURE(ExpectMinus(g.replica(b), pushes.sum()));
  g.Start(p, std::move(store_p));
  EXPECT_TRUE(g.restored(p));
  ASSERT_TRUE(Settle(g, 2));
  ExpectBothHold(g, pushes.sum());
}

// Each replica's Prometheus metrics (leash-server --metrics-bind): who leads and in which
// term, how far its log is committed and applied, the primary's view of each backup, terms
// led, and the durable log; then after a failover, the new primary's view of the dead one;
// then its lease, once etcd is unreachable.
TEST_F(ReplicaTest, MetricsShowEachReplicasRoleLogBackupsAndDurableLog) {
  DurableDir dir;
  ReplicaOptions ro;
  ro.durable_log_dir = dir.path();
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f), ro);
  SummedPushes pushes(worker());
  for (uint64_t i = 1; i <= 10; ++i) ASSERT_TRUE(pushes.Push(i));
  ASSERT_TRUE(Settle(g, 2));
  const int p = *g.Primary();
  const int b = 1 - p;
  prometheus::Registry reg[2];
  server::ReplicaMetrics m_p(reg[p], g.replica(p));
  server::ReplicaMetrics m_b(reg[b], g.replica(b));
  auto value = [&](int r, const std::string& name, std::map<std::string, std::string> l = {}) {
    l["shard"] = "0";
    l["replica"] = std::to_string(r);
    auto v = CollectedValue(reg[r], name, l);
    EXPECT_TRUE(v.has_value()) << name << " of replica " << r << " missing";
    return v.value_or(-1e9);
  };
  const std::string other_of_p = std::to_string(b), other_of_b = std::to_string(p);
  EXPECT_EQ(value(p, "leash_replica_primary"), 1);
  EXPECT_EQ(value(b, "leash_replica_primary"), 0);
  const double term = value(p, "leash_replica_term");
  EXPECT_GE(term, 1);
  EXPECT_EQ(value(b, "leash_replica_term"), term);
  const double last = static_cast<double>(g.replica(p).last_index());
  EXPECT_GE(last, 12) << "a no-op, the table, the registration and 10 pushes";
  for (const int r : {p, b}) {
    EXPECT_EQ(value(r, "leash_replica_log_index"), last) << r;
    EXPECT_EQ(value(r, "leash_replica_applied_index"), last) << r;
    EXPECT_EQ(value(r, "leash_replica_has_state"), 1) << r;
    EXPECT_GT(value(r, "leash_replica_durable_log_records_total"), 0) << r;
    EXPECT_GT(value(r, "leash_replica_durable_log_bytes_total"), 10 * 32 * 4) << r;
    EXPECT_EQ(value(r, "leash_replica_durable_log_failed"), 0) << r;
    EXPECT_EQ(value(r, "leash_replica_durable_log_mode", {{"mode", "write"}}), 1) << r;
    EXPECT_EQ(value(r, "leash_replica_durable_log_mode", {{"mode", "off"}}), 0) << r;
    EXPECT_EQ(value(r, "leash_replica_durable_log_syncs_total"), 0) << "write mode: no fdatasync";
    EXPECT_EQ(value(r, "leash_replica_coordinator_lease_valid"), 1) << r;
  }
  EXPECT_EQ(value(p, "leash_replica_commit_index"), last);
  EXPECT_EQ(value(p, "leash_replica_in_sync_replicas"), 2);
  EXPECT_EQ(value(b, "leash_replica_in_sync_replicas"), 0);
  EXPECT_EQ(value(p, "leash_replica_lag_entries"), 0);
  EXPECT_EQ(value(p, "leash_replica_held_replies"), 0);
  EXPECT_EQ(value(p, "leash_replica_terms_led_total"), 1);
  EXPECT_EQ(value(b, "leash_replica_terms_led_total"), 0);
  EXPECT_EQ(value(p, "leash_replica_backup_in_sync", {{"backup", other_of_p}}), 1);
  EXPECT_EQ(value(p, "leash_replica_backup_entries_behind", {{"backup", other_of_p}}), 0);
  EXPECT_EQ(value(p, "leash_replica_backup_seconds_behind", {{"backup", other_of_p}}), 0);
  EXPECT_GE(value(p, "leash_replica_backup_seconds_since_ack", {{"backup", other_of_p}}), 0);
  EXPECT_EQ(value(b, "leash_replica_backup_seconds_since_ack", {{"backup", other_of_b}}), -1)
      << "a backup's view of its primary is not published";

  const double records_b = value(b, "leash_replica_durable_log_records_total");
  // The primary dies; the backup leads a new term and, once it drops the dead replica from
  // its in-sync set, acknowledges alone: its metrics show the other replica falling behind.
  g.Kill(p);
  g.coordinator().ExpireLease(0, static_cast<uint32_t>(p));
  Elect(g);
  ASSERT_EQ(g.Primary(), std::optional<int>(b));
  for (uint64_t i = 11; i <= 13; ++i) ASSERT_TRUE(pushes.Push(i));
  m_b.Publish(g.replica(b));
  EXPECT_EQ(value(b, "leash_replica_primary"), 1);
  EXPECT_GT(value(b, "leash_replica_term"), term);
  EXPECT_EQ(value(b, "leash_replica_terms_led_total"), 1);
  EXPECT_EQ(value(b, "leash_replica_in_sync_replicas"), 1);
  EXPECT_EQ(value(b, "leash_replica_backup_in_sync", {{"backup", other_of_b}}), 0);
  EXPECT_GE(value(b, "leash_replica_backup_entries_behind", {{"backup", other_of_b}}), 4)
      << "the new term's no-op and 3 pushes";
  EXPECT_GT(value(b, "leash_replica_backup_seconds_behind", {{"backup", other_of_b}}), 0);
  EXPECT_GT(value(b, "leash_replica_durable_log_records_total"), records_b)
      << "it logged what it led";

  // etcd unreachable for longer than the lease: this replica no longer knows its lease valid.
  g.coordinator().SetUnavailable(true);
  for (int s = 0; s < 1500; ++s) g.Step();
  m_b.Publish(g.replica(b));
  EXPECT_EQ(value(b, "leash_replica_coordinator_lease_valid"), 0);
  g.coordinator().SetUnavailable(false);
}

TEST_F(ReplicaTest, TrainingGoesOnWhileTheCoordinatorIsDownUnlessThePrimaryIsAlone) {
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f));
  Worker& w = worker();
  ASSERT_TRUE(Settle(g, 2));
  g.coordinator().SetUnavailable(true);
  g.now() += 5000;  // far past the lease TTL: the primary's lease is no longer certain
  ASSERT_FALSE(g.handle(0).LeaseValid());
  std::vector<float> sum(32, 0.f);
  for (int i = 1; i <= 10; ++i) {
    ASSERT_TRUE(w.Push(IntGrad(i, 32), 8)) << "push " << i << " with the backup fencing";
    for (size_t k = 0; k < sum.size(); ++k) sum[k] += IntGrad(i, 32)[k];
  }
  // The backup dies: without the coordinator it cannot leave the in-sync set, and alone
  // the primary acknowledges nothing on an uncertain lease.
  g.Kill(1);
  const uint64_t rid = w.NextRid();
  Message push = MakePush(rid, 0, Rows::Range(0, 8), 1, 1, 11, DType::kF32,
                          EncodeValues(IntGrad(11, 32), DType::kF32));
  EXPECT_FALSE(w.Call(rid, push, 3000)) << "acknowledged with no backup and no lease";
  g.coordinator().SetUnavailable(false);
  auto reply = w.Call(rid, push);
  ASSERT_TRUE(reply && std::holds_alternative<PushReply>(*reply));
  for (size_t k = 0; k < sum.size(); ++k) sum[k] += IntGrad(11, 32)[k];
  EXPECT_EQ(g.coordinator().View(0).in_sync, (std::vector<uint32_t>{0}));
  const std::vector<float> got = TableValues(g.replica(0));
  for (size_t k = 0; k < sum.size(); ++k) ASSERT_EQ(got[k], -sum[k]) << "value " << k;
}

TEST_F(ReplicaTest, APrimaryAloneWhoseLeaseEndedLeadsAgainInANewTerm) {
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f));
  Worker& w = worker();
  const int p = *g.Primary();
  SummedPushes pushes(w);
  auto push = [&](uint64_t i) { return pushes.Push(i); };
  ASSERT_TRUE(push(1));
  // The backup dies: the primary drops it from the in-sync set and goes on alone.
  g.Kill(1 - p);
  g.coordinator().ExpireLease(0, static_cast<uint32_t>(1 - p));
  ASSERT_TRUE(push(2));
  ASSERT_EQ(g.coordinator().View(0).in_sync, (std::vector<uint32_t>{static_cast<uint32_t>(p)}));
  // Its own lease ends behind its back (a pause past the TTL), the primary key with it. The
  // only replica that may lead is itself: it learns that its term is over and wins the next
  // (before: it went on believing itself primary, acknowledging nothing, with no primary
  // in the directory, for good).
  g.coordinator().ExpireLease(0, static_cast<uint32_t>(p));
  ASSERT_TRUE(push(3)) << "no push acknowledged after the lone primary's lease ended";
  EXPECT_EQ(g.Primary(), std::optional<int>(p));
  EXPECT_EQ(g.replica(p).role(), ReplicaRole::kPrimary);
  EXPECT_EQ(g.replica(p).term(), 2u);
  ExpectMinus(g.replica(p), pushes.sum());
}

TEST_F(ReplicaTest, ANewPrimaryThatCouldNotWriteItsInSyncSetTriesAgain) {
  Group g(2);
  // The winner's first writes of the in-sync set go unanswered (etcd slow under load).
  g.coordinator().FailSetInSync(3);
  g.StartAll();
  Elect(g);
  const int p = *g.Primary();
  // The directory names it primary and nobody else may campaign: it must become one
  // (before: it stayed a backup, refusing every request, for good).
  Worker w(g, 1);
  w.CreateTable(Spec(OptimizerKind::kSgd, 1.f));
  w.Register();
  ASSERT_TRUE(w.Push(IntGrad(1, 32), 8));
  EXPECT_EQ(g.Primary(), std::optional<int>(p));
  EXPECT_EQ(g.replica(p).role(), ReplicaRole::kPrimary);
  EXPECT_EQ(g.replica(p).term(), 1u);
  ASSERT_TRUE(Settle(g, 2));
  ExpectIdentical(g.replica(0), g.replica(1));
}

TEST_F(ReplicaTest, TheLogIsBoundedInBytesAndABackupBehindItCatchesUpFromASnapshot) {
  ReplicaOptions ro;
  ro.max_log_bytes = 4096;
  // A push carries 4 KB of floats.
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f, 64, 16), ro);
  Worker& w = worker();
  const int p = *g.Primary();
  std::vector<float> sum(64 * 16, 0.f);
  auto push = [&](uint64_t i) {
    if (!w.Push(IntGrad(i, sum.size()), 64)) return false;
    for (size_t k = 0; k < sum.size(); ++k) sum[k] += IntGrad(i, sum.size())[k];
    return true;
  };
  for (uint64_t i = 1; i <= 50; ++i) ASSERT_TRUE(push(i)) << "push " << i;
  ASSERT_TRUE(Settle(g, 2));
  for (int i = 0; i < 200; ++i) g.Step();  // the backup hears the last commit index
  // Without the byte bound both logs held all 50 pushes (an entry bound alone let a soak's
  // replicas reach 3.6 GB in a minute).
  for (int r = 0; r < 2; ++r) {
    EXPECT_LE(g.replica(r).log_bytes(), ro.max_log_bytes) << "replica " << r;
    EXPECT_LT(g.replica(r).log_entries(), 10u) << "replica " << r;
  }
  // A restarted backup needs entries the log no longer holds: it gets a snapshot, then
  // the log, and ends identical.
  g.Kill(1 - p);
  g.Start(1 - p);
  for (uint64_t i = 51; i <= 60; ++i) ASSERT_TRUE(push(i)) << "push " << i;
  ASSERT_TRUE(Settle(g, 2));
  ExpectIdentical(g.replica(p), g.replica(1 - p));
  const std::vector<float> got = TableValues(g.replica(1 - p));
  for (size_t k = 0; k < sum.size(); ++k) ASSERT_EQ(got[k], -sum[k]) << "value " << k;
}

// A backup that reads its primary's entries in place in the primary's ring (a same-host
// primary lends them) lets each go once applied: its log holds none of them, so the ring's
// room comes back at once. It still leads with the same state, and as primary catches a
// restarted replica up from a snapshot where its log no longer reaches.
TEST_F(ReplicaTest, ABackupLetsEntriesReadInPlaceGoOnceAppliedAndStillLeadsIdentical) {
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kMomentum, 0.5f, 64, 16));
  g.set_lend(true);
  Worker& w = worker();
  const int p = *g.Primary();
  const int b = 1 - p;
  for (uint64_t i = 1; i <= 30; ++i) ASSERT_TRUE(w.Push(IntGrad(i, 64 * 16), 64)) << i;
  ASSERT_TRUE(Settle(g, 2));
  for (int i = 0; i < 200; ++i) g.Step();  // the backup hears the last commit index
  EXPECT_GE(g.replica(b).entries_lent(), 30u);
  EXPECT_EQ(g.replica(b).log_entries(), 0u) << "applied entries read in place are let go";
  EXPECT_EQ(g.replica(p).entries_lent(), 0u);
  EXPECT_GE(g.replica(p).log_entries(), 30u) << "the primary keeps its own log";
  ExpectIdentical(g.replica(p), g.replica(b));

  // The backup leads; the old primary, restarted empty, is caught up by a snapshot.
  ASSERT_EQ(FailOver(g, p, b), std::optional<int>(b));
  g.Start(p);
  for (uint64_t i = 31; i <= 40; ++i) ASSERT_TRUE(w.Push(IntGrad(i, 64 * 16), 64)) << i;
  ASSERT_TRUE(Settle(g, 2));
  EXPECT_GE(g.replica(p).snapshots_installed(), 1u);
  EXPECT_EQ(g.replica(b).shard().counters().pushes_applied, 40u);
  ExpectIdentical(g.replica(b), g.replica(p));
}

// A primary that borrows its workers' pushes in place (Frame::unstable) copies each before
// the worker can change it: whatever the worker writes there once the primary's Handle
// returns reaches neither its state nor its log nor its backup. Here, with no shared-memory
// ring to a backup, the primary copies the push out (CopyIntoRing has nowhere to copy it).
TEST_F(ReplicaTest, APushInItsWorkersRingIsCopiedBeforeTheWorkerReusesTheRoom) {
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kSgd, 1.f, 64, 16));
  g.set_unstable(true);
  Worker& w = worker();
  const int p = *g.Primary();
  const int b = 1 - p;
  std::vector<float> sum(64 * 16, 0.f);
  for (uint64_t i = 1; i <= 20; ++i) {
    std::vector<float> grad = IntGrad(i, 64 * 16);
    for (size_t k = 0; k < grad.size(); ++k) sum[k] += grad[k];
    ASSERT_TRUE(w.Push(grad, 64)) << i;
  }
  ASSERT_TRUE(Settle(g, 2));
  for (int i = 0; i < 200; ++i) g.Step();
  EXPECT_EQ(g.replica(p).frames_copied_once(), 0u) << "no ring to a backup in memory";
  ExpectIdentical(g.replica(p), g.replica(b));
  ExpectMinus(g.replica(p), sum);
  // The primary's log holds the copies: a backup started empty and caught up from that log
  // applies the same sums.
  g.Kill(b);
  g.Start(b);
  ASSERT_TRUE(Settle(g, 2));
  for (int i = 0; i < 200; ++i) g.Step();
  ExpectIdentical(g.replica(p), g.replica(b));
  ExpectMinus(g.replica(b), sum);
}

TEST_F(ReplicaTest, EvictionsAreThePrimarysDecisionAndReachEveryReplica) {
  server::ShardOptions so;
  so.lease_ms = 5000;
  Group g(2, {}, so);
  g.StartAll();
  Elect(g);
  Worker a(g, 1), b(g, 2);
  a.CreateTable(Spec(OptimizerKind::kSgd, 1.f));
  a.Register();
  b.Register();
  ASSERT_TRUE(a.Clock(1));
  ASSERT_TRUE(Settle(g, 2));
  EXPECT_EQ(g.replica(1).shard().live_workers(), 2u);
  // Worker 2 falls silent past its lease; worker 1 keeps clocking and stays.
  for (int c = 2; c <= 8; ++c) {
    g.now() += 1000;
    ASSERT_TRUE(a.Clock(c));
  }
  ASSERT_TRUE(Settle(g, 2));
  EXPECT_EQ(g.replica(0).shard().live_workers(), 1u);
  EXPECT_EQ(g.replica(1).shard().live_workers(), 1u);
  EXPECT_EQ(g.replica(1).shard().counters().evictions, 1u);
  ExpectIdentical(g.replica(0), g.replica(1));
}

// ---- catch-up by chunked snapshot ------------------------------------------------------

TableSpec SparseSpec(uint32_t cols, uint32_t admit_after) {
  TableSpec s;
  s.name = "emb";
  s.kind = TableKind::kSparse;
  s.cols = cols;
  s.optimizer.kind = OptimizerKind::kAdam;
  s.optimizer.lr = 0.01f;
  s.sparse.admit_after = admit_after;
  return s;
}

uint64_t PushesApplied(Replica& r) { return r.shard().counters().pushes_applied; }

TEST_F(ReplicaTest, ABackupCatchesUpByAChunkedSnapshotUnderLossAndEndsBitIdentical) {
  ReplicaOptions ro;
  ro.max_log_entries = 48;         // the new backup is past the log: a snapshot
  ro.snapshot_chunk_bytes = 4096;  // values and 2 Adam arrays of 16 KiB: 12 chunks and more
  Group& g = SetUpGroup(2, Spec(OptimizerKind::kAdam, 0.01f, 64, 64), ro, {}, /*started=*/1);
  Worker& w = worker();
  for (int i = 1; i <= 60; ++i) ASSERT_TRUE(w.Push(IntGrad(i, 64 * 64), 64));
  g.net().SetFaults(Direction::kToShard, "", {.drop = 0.05, .duplicate = 0.05, .jitter_ms = 1});
  g.net().SetFaults(Direction::kToClient, "", {.drop = 0.05, .duplicate = 0.05});
  g.set_real_sleep(true);
  std::shared_ptr<int> chunks = CountChunksTo(1);
  g.Start(1);
  for (int i = 61; i <= 80; ++i) ASSERT_TRUE(w.Push(IntGrad(i, 64 * 64), 64));  // meanwhile
  ASSERT_TRUE(Settle(g, 2));
  for (int i = 0; i < 2000 && g.coordinator().View(0).in_sync.size() < 2; ++i) g.Step();
  EXPECT_GE(g.replica(1).snapshots_installed(), 1u);
  EXPECT_GE(*chunks, 13) << "a header and at least 12 chunks of 4 KiB";
  EXPECT_LT(PushesApplied(g.replica(1)), PushesApplied(g.replica(0)) - 40)
      << "the first pushes came in the snapshot, not from the log";
  EXPECT_EQ(g.coordinator().View(0).in_sync, (std::vector<uint32_t>{0, 1}));
  ExpectIdentical(g.replica(0), g.replica(1));
}

TEST_F(ReplicaTest, ABackupCatchesUpWithASparseTableWhoseColdTierHoldsRowsAndEndsIdentical) {
  ReplicaOptions ro;
  ro.max_log_entries = 16;
  ro.snapshot_chunk_bytes = 8192;  // about 36 rows of 16 Adam columns a chunk
  server::ShardOptions so;
  so.memory_budget_bytes = 64 << 10;  // the memory tier holds about 170 of the 600 rows
  Group& g = SetUpGroup(2, SparseSpec(16, /*admit_after=*/2), ro, so, /*started=*/1);
  Worker& w = worker();
  // Keys 0..599 pulled twice (admitted) and pushed; 600..649 pulled once (counted in the
  // admission sketch only).
  auto key = [](uint64_t i) { return i * 7919 + 3; };
  auto round = [&](uint64_t from, uint64_t to, bool push, int seed) {
    for (uint64_t b = from; b < to; b += 50) {
      std::vector<uint64_t> keys;
      for (uint64_t i = b; i < std::min(b + 50, to); ++i) keys.push_back(key(i));
      ASSERT_TRUE(w.PullKeys(0, keys));
      if (push) {
        ASSERT_TRUE(w.PushKeys(0, keys, IntGrad(seed + b, keys.size() * 16)));
      }
    }
  };
  round(0, 600, false, 0);
  round(0, 600, true, 1);
  round(0, 600, true, 2);
  round(600, 650, false, 0);
  const ps::SparseTable* t0 = g.replica(0).shard().sparse_table(0);
  ASSERT_NE(t0, nullptr);
  ASSERT_LT(t0->counters().resident_rows, 300u) << "the cold tier must hold rows";

  g.Start(1);
  round(0, 300, true, 3);  // while it catches up
  ASSERT_TRUE(Settle(g, 2));
  EXPECT_GE(g.replica(1).snapshots_installed(), 1u);
  // After it: keys of the sketch get admitted alike, rows move between tiers alike.
  round(600, 650, true, 4);
  round(300, 600, true, 5);
  ASSERT_TRUE(Settle(g, 2));
  ExpectIdentical(g.replica(0), g.replica(1));
  const ps::SparseTable* t1 = g.replica(1).shard().sparse_table(0);
  ASSERT_NE(t1, nullptr);
  const size_t rb = t0->layout().bytes();
  std::vector<uint8_t> a(rb), b(rb);
  int rows = 0;
  for (uint64_t i = 0; i < 650; ++i) {
    auto fa = t0->ReadRecord(key(i), a.data());
    auto fb = t1->ReadRecord(key(i), b.data());
    ASSERT_TRUE(fa.ok() && fb.ok());
    ASSERT_EQ(*fa, *fb) << "key " << key(i);
    rows += *fa ? 1 : 0;
    if (*fa) {
      ASSERT_EQ(a, b) << "record of key " << key(i);
    }
  }
  EXPECT_EQ(rows, 650);
  // The memory tier too: the same rows in the same slots, the same sketch and cursors.
  EXPECT_EQ(t0->ExportTier(), t1->ExportTier());
}

TEST_F(ReplicaTest, ASnapshotTransferCutByAFailoverIsDroppedAndTheNewPrimaryCatchesUpTheBackup) {
  ReplicaOptions ro;
  ro.max_log_entries = 16;
  ro.snapshot_chunk_bytes = 1024;  // 48 chunks: the transfer takes many turns
  Group& g = SetUpGroup(3, Spec(OptimizerKind::kAdam, 0.01f, 64, 64), ro, {}, /*started=*/2);
  Worker& w = worker();
  for (int i = 1; i <= 40; ++i) ASSERT_TRUE(w.Push(IntGrad(i, 64 * 64), 64));
  ASSERT_TRUE(Settle(g, 3));
  ASSERT_EQ(g.Primary(), std::optional<int>(0));

  g.Start(2);
  for (int i = 0; i < 2000 && g.replica(2).has_state(); ++i) g.Step();
  ASSERT_FALSE(g.replica(2).has_state()) << "no snapshot transfer began";
  for (int i = 0; i < 3; ++i) g.Step();
  ASSERT_EQ(g.replica(2).snapshots_installed(), 0u) << "the transfer ended before the failover";

  g.Kill(0);
  g.coordinator().ExpireLease(0, 0);
  for (int s = 0; s < 3000 && g.replica(2).term() < 2; ++s) g.Step();
  ASSERT_EQ(g.Primary(), std::optional<int>(1));
  // As soon as it hears of the new term, the old transfer is gone.
  EXPECT_EQ(g.replica(2).snapshots_abandoned(), 1u);
  EXPECT_FALSE(g.replica(2).has_state());
  for (int i = 41; i <= 50; ++i) ASSERT_TRUE(w.Push(IntGrad(i, 64 * 64), 64));
  ASSERT_TRUE(Settle(g, 3));
  EXPECT_EQ(g.replica(2).snapshots_installed(), 1u);
  // Applied everything; the primary adds it to the in-sync set on its next turns.
  const std::vector<uint32_t> both = {1, 2};
  for (int i = 0; i < 5000 && g.coordinator().View(0).in_sync != both; ++i) g.Step();
  EXPECT_EQ(g.coordinator().View(0).in_sync, both);
  ExpectIdentical(g.replica(1), g.replica(2));
}

}  // namespace
}  // namespace leash::testing

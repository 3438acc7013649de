// Unit tests of one shard's request handling, driven directly with wire messages, an
// in-memory snapshot store and a fake clock.
#include "leash/server/shard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "leash/common/wire.h"
#include "wire_format.h"

namespace leash::server {
namespace {

class ShardTest : public ::testing::Test {
 protected:
  ShardTest() { Reset(); }

  void Reset(ShardOptions o = {}) {
    options_ = o;
    shard_ = std::make_unique<Shard>(
        options_, &store_, [this] { return now_; }, &sparse_store_);
  }

  // Sends `m` from `peer` and returns every reply produced.
  std::vector<Outgoing> Send(const PeerId& peer, const Message& m) {
    std::vector<Outgoing> out;
    shard_->Handle(peer, m, &out);
    return out;
  }

  // A reply decoded by the codec (a failed expectation and an empty Reply if it is not).
  static Decoded<Reply> Decode(const Message& m) {
    auto d = DecodeReply(m);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? std::move(*d) : Decoded<Reply>{};
  }
  // The status an error reply carries; Ok for any other reply.
  static Status StatusOf(const Reply& r) {
    const auto* e = std::get_if<ErrorReply>(&r);
    return e ? e->status : Status::Ok();
  }

  // Sends `m` and expects exactly one reply, to `peer`; returns it decoded (null if none).
  const Decoded<Reply>* One(const PeerId& peer, const Message& m) {
    last_ = Send(peer, m);
    EXPECT_EQ(last_.size(), 1u);
    if (last_.size() != 1) return nullptr;
    EXPECT_EQ(last_[0].peer, peer);
    last_reply_ = Decode(last_[0].message);
    return &last_reply_;
  }

  Status ErrorOf(const PeerId& peer, const Message& m) {
    const Decoded<Reply>* e = One(peer, m);
    return e == nullptr ? Status::Ok() : StatusOf(e->value);
  }

  void Register(uint64_t worker, uint64_t inc = 1) {
    const Decoded<Reply>* e = One("w" + std::to_string(worker), MakeRegister(1, worker, inc, "w"));
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(std::holds_alternative<Welcome>(e->value)) << StatusOf(e->value);
  }

  uint32_t Create(const TableSpec& t) {
    const Decoded<Reply>* e = One("admin", MakeCreateTable(2, t));
    if (e == nullptr) return 0;
    const auto* tc = std::get_if<TableCreated>(&e->value);
    EXPECT_NE(tc, nullptr) << StatusOf(e->value);
    return tc ? tc->table_id : 0;
  }

  static TableSpec Spec(const std::string& name, uint64_t rows, uint32_t cols, float lr = 1.f) {
    TableSpec t;
    t.name = name;
    t.rows = rows;
    t.cols = cols;
    t.optimizer.lr = lr;
    return t;
  }

  static Rows Range(uint64_t b, uint64_t e) {
    Rows r;
    r.begin = b;
    r.end = e;
    return r;
  }

  std::vector<float> ReadReply(const Outgoing& o) {
    Decoded<Reply> d = Decode(o.message);
    const auto* r = std::get_if<PullReply>(&d.value);
    EXPECT_NE(r, nullptr) << "reply is no pull reply: " << StatusOf(d.value);
    if (r == nullptr) return {};
    std::vector<float> v(r->num_rows * r->cols);
    EXPECT_TRUE(DecodeValues(o.message[1], r->dtype, v.size(), v.data()).ok());
    return v;
  }

  std::vector<float> Pull(uint32_t table, Rows rows, uint64_t worker = 0, int64_t clock = 0,
                          int64_t s = 0) {
    auto out = Send("reader", MakePull(3, table, rows, worker, clock, s));
    EXPECT_EQ(out.size(), 1u);
    if (out.size() != 1) return {};
    return ReadReply(out[0]);
  }

  Status Push(uint32_t table, Rows rows, std::vector<float> g, uint64_t worker, uint64_t seq,
              uint64_t inc = 1) {
    const Decoded<Reply>* e =
        One("w" + std::to_string(worker),
            MakePush(4, table, rows, worker, inc, seq, DType::kF32, EncodeValues(g, DType::kF32)));
    if (e == nullptr) return Internal("no reply");
    if (std::holds_alternative<ErrorReply>(e->value)) return StatusOf(e->value);
    EXPECT_TRUE(std::holds_alternative<PushReply>(e->value));
    return Status::Ok();
  }

  static TableSpec SparseSpec(const std::string& name, uint32_t cols, float lr = 1.f) {
    TableSpec t;
    t.name = name;
    t.kind = TableKind::kSparse;
    t.cols = cols;
    t.optimizer.lr = lr;
    return t;
  }

  static Rows Keys(std::vector<uint64_t> k) { return Rows::Keys(std::move(k)); }

  ShardOptions options_;
  MemorySnapshotStore store_;
  MemorySparseStore sparse_store_;  // outlives Reset(), like a data directory
  int64_t now_ = 1000;
  std::unique_ptr<Shard> shard_;
  std::vector<Outgoing> last_;
  Decoded<Reply> last_reply_;
};

TEST_F(ShardTest, RegisterWelcomesWithShardIdentityAndStartClock) {
  const Decoded<Reply>* e = One("p", MakeRegister(77, 5, 1, "alpha"));
  ASSERT_NE(e, nullptr);
  const auto* w = std::get_if<Welcome>(&e->value);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(e->request_id, 77u);
  EXPECT_EQ(w->start_clock, 0);
  EXPECT_EQ(w->num_shards, 1u);
  EXPECT_EQ(w->recovered_clock, -1);
  EXPECT_EQ(shard_->live_workers(), 1u);
}

TEST_F(ShardTest, CreateTableIsIdempotentForTheSameSpec) {
  uint32_t a = Create(Spec("w", 4, 3));
  uint32_t b = Create(Spec("w", 4, 3));
  EXPECT_EQ(a, b);
  EXPECT_FALSE(
      std::get<TableCreated>(One("admin", MakeCreateTable(2, Spec("w", 4, 3)))->value).created);
}

TEST_F(ShardTest, CreateTableWithAnotherSpecIsAlreadyExists) {
  Create(Spec("w", 4, 3));
  EXPECT_EQ(ErrorOf("admin", MakeCreateTable(2, Spec("w", 4, 5))).code(),
            StatusCode::kAlreadyExists);
  auto other_lr = Spec("w", 4, 3, 0.5f);
  EXPECT_EQ(ErrorOf("admin", MakeCreateTable(2, other_lr)).code(), StatusCode::kAlreadyExists);
}

TEST_F(ShardTest, AlreadyExistsNamesTheExistingAndTheRequestedSpec) {
  Create(Spec("w", 4, 3));
  Status st = ErrorOf("admin", MakeCreateTable(2, Spec("w", 4, 5)));
  ASSERT_EQ(st.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(st.message().find("'w'"), std::string::npos) << st;
  EXPECT_NE(st.message().find("as 4 x 3 float32, sgd(lr=1"), std::string::npos) << st;
  EXPECT_NE(st.message().find("asks for 4 x 5 float32, sgd(lr=1"), std::string::npos) << st;
}

TEST_F(ShardTest, CreateTableWithAnotherOptimizerOrInitializerIsAlreadyExists) {
  auto adam = Spec("w", 4, 3);
  adam.optimizer.kind = OptimizerKind::kAdam;
  adam.init.kind = InitKind::kUniform;
  adam.init.scale = 0.1f;
  adam.init.seed = 7;
  Create(adam);
  auto other_kind = adam;
  other_kind.optimizer.kind = OptimizerKind::kAdagrad;
  auto other_beta = adam;
  other_beta.optimizer.beta2 = 0.99f;
  auto other_seed = adam;
  other_seed.init.seed = 8;
  auto other_init = adam;
  other_init.init.kind = InitKind::kNormal;
  auto other_rows = adam;
  other_rows.rows = 5;
  for (const auto& spec : {other_kind, other_beta, other_seed, other_init, other_rows}) {
    Status st = ErrorOf("admin", MakeCreateTable(2, spec));
    EXPECT_EQ(st.code(), StatusCode::kAlreadyExists) << st;
  }
  Status st = ErrorOf("admin", MakeCreateTable(2, other_seed));
  EXPECT_NE(st.message().find("init uniform(scale=0.1, seed=7)"), std::string::npos) << st;
  EXPECT_NE(st.message().find("init uniform(scale=0.1, seed=8)"), std::string::npos) << st;
  EXPECT_NE(st.message().find("adam(lr=1, beta1=0.9, beta2=0.999"), std::string::npos) << st;
}

TEST_F(ShardTest, FieldsTheOptimizerAndInitializerIgnoreDoNotMakeASpecDifferent) {
  auto sgd = Spec("w", 4, 3);
  sgd.optimizer.momentum = 0.5f;  // SGD has no momentum
  sgd.init.kind = InitKind::kZeros;
  sgd.init.seed = 3;  // zeros have no seed
  uint32_t id = Create(sgd);
  auto same = Spec("w", 4, 3);
  same.optimizer.momentum = 0.9f;
  same.init.seed = 4;
  const Decoded<Reply>* e = One("admin", MakeCreateTable(2, same));
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(std::holds_alternative<TableCreated>(e->value)) << StatusOf(e->value);
  EXPECT_EQ(std::get<TableCreated>(e->value).table_id, id);
  EXPECT_FALSE(std::get<TableCreated>(e->value).created);
}

TEST_F(ShardTest, RecoveredTableKeepsItsSpecForCreateTable) {
  auto spec = Spec("w", 4, 3);
  spec.optimizer.kind = OptimizerKind::kMomentum;
  uint32_t other = Create(Spec("first", 2, 2));
  uint32_t id = Create(spec);
  ASSERT_TRUE(shard_->Checkpoint().ok());
  Reset();  // a restarted shard on the same store
  ASSERT_TRUE(shard_->Recover().ok());
  const Decoded<Reply>* e = One("admin", MakeCreateTable(2, spec));
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(std::holds_alternative<TableCreated>(e->value)) << StatusOf(e->value);
  EXPECT_EQ(std::get<TableCreated>(e->value).table_id, id);
  EXPECT_FALSE(std::get<TableCreated>(e->value).created)
      << "the recovered table is returned, not a new one";
  EXPECT_NE(id, other);
  auto changed = spec;
  changed.optimizer.momentum = 0.5f;
  Status st = ErrorOf("admin", MakeCreateTable(2, changed));
  ASSERT_EQ(st.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(st.message().find("as 4 x 3 float32, momentum(lr=1, momentum=0.9"), std::string::npos)
      << st;
  EXPECT_NE(st.message().find("asks for 4 x 3 float32, momentum(lr=1, momentum=0.5"),
            std::string::npos)
      << st;
}

TEST_F(ShardTest, CreateTableRejectsEmptyShapes) {
  EXPECT_EQ(ErrorOf("admin", MakeCreateTable(2, Spec("w", 0, 3))).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorOf("admin", MakeCreateTable(2, Spec("", 2, 3))).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(ShardTest, InitializationIsDeterministicAndScaled) {
  auto t = Spec("w", 100, 10);
  t.init.kind = InitKind::kUniform;
  t.init.scale = 0.5f;
  t.init.seed = 9;
  uint32_t id = Create(t);
  auto v = Pull(id, Range(0, 100));
  ASSERT_EQ(v.size(), 1000u);
  double sum = 0;
  for (float x : v) {
    EXPECT_LE(std::fabs(x), 0.5f);
    sum += x;
  }
  EXPECT_LT(std::fabs(sum / 1000), 0.05);
  EXPECT_NE(v[0], v[1]);
  // A second shard layout gives the same value for the same global row.
  MemorySnapshotStore other;
  ShardOptions o;
  o.shard = 1;
  o.num_shards = 2;
  Shard s1(o, &other, [] { return int64_t{0}; });
  std::vector<Outgoing> out;
  s1.Handle("a", MakeCreateTable(1, t), &out);
  out.clear();
  s1.Handle("a", MakePull(2, 0, Range(50, 51), 0, 0, 0), &out);
  ASSERT_EQ(out.size(), 1u);
  auto row = ReadReply(out[0]);
  ASSERT_EQ(row.size(), 10u);
  for (int c = 0; c < 10; ++c)
    EXPECT_EQ(row[static_cast<size_t>(c)], v[500 + static_cast<size_t>(c)]);
}

TEST_F(ShardTest, SgdPushesWithLearningRateOneSumIntoTheTable) {
  uint32_t id = Create(Spec("w", 2, 2));
  Register(1);
  Register(2);
  ASSERT_TRUE(Push(id, Range(0, 2), {1, 2, 3, 4}, 1, 1).ok());
  ASSERT_TRUE(Push(id, Range(0, 2), {10, 20, 30, 40}, 2, 1).ok());
  ASSERT_TRUE(Push(id, Range(1, 2), {100, 200}, 1, 2).ok());
  EXPECT_EQ(Pull(id, Range(0, 2)), (std::vector<float>{-11, -22, -133, -244}));
}

// --update-threads: a shard whose large updates are shared by threads ends with the tables of
// one that applies them on its loop alone, bit for bit: pushes on their own (weighted or not,
// 16-bit on the wire) and weighted pushes summed into a clock step.
TEST_F(ShardTest, UpdatesSharedByThreadsLeaveTheTablesBitForBitAsOneThreadDoes) {
  constexpr uint64_t kRows = 640;
  constexpr uint32_t kCols = 512;  // 327680 floats: split in two ranges by default
  std::vector<std::vector<float>> tables;
  for (int threads : {1, 3}) {
    SCOPED_TRACE(testing::Message() << threads << " update thread(s)");
    ShardOptions o;
    o.update_threads = threads;
    Reset(o);
    TableSpec spec = Spec("w", kRows, kCols, 0.01f);
    spec.optimizer.kind = OptimizerKind::kMomentum;
    spec.optimizer.momentum = 0.9f;
    spec.optimizer.weight_decay = 0.001f;
    spec.init.kind = InitKind::kNormal;
    spec.init.scale = 0.1f;
    const uint32_t id = Create(spec);
    Register(1);
    Register(2);
    std::vector<float> g(kRows * kCols);
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(static_cast<float>(i) * 0.001f);
    ASSERT_TRUE(Push(id, Range(0, kRows), g, 1, 1).ok());
    // A bf16 push of most of the table, weighted by its samples.
    const std::vector<float> part(g.begin(), g.begin() + (kRows - 40) * kCols);
    const Decoded<Reply>* e = One("w2", MakePush(4, id, Range(40, kRows), 2, 1, 1, DType::kBF16,
                                                 EncodeValues(part, DType::kBF16), {48, 64}));
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(std::holds_alternative<PushReply>(e->value)) << StatusOf(e->value);
    // Iteration 0's weighted pushes summed into one step when both workers' clocks pass it.
    for (uint64_t w : {uint64_t{1}, uint64_t{2}}) {
      const Decoded<Reply>* p =
          One("w" + std::to_string(w),
              MakePush(5, id, Range(0, kRows), w, 1, 1 + w, DType::kF32,
                       EncodeValues(g, DType::kF32), {w == 1 ? 40u : 24u, 64, true}));
      ASSERT_NE(p, nullptr);
      ASSERT_TRUE(std::holds_alternative<PushReply>(p->value)) << StatusOf(p->value);
    }
    EXPECT_EQ(shard_->counters().pushes_summed, 2u);
    Send("w1", MakeClock(6, 1, 1));
    Send("w2", MakeClock(6, 2, 1));
    EXPECT_EQ(shard_->counters().clock_steps, 1u);
    // Every update above was split with threads (two pushes, two sums, one step), none without.
    EXPECT_EQ(shard_->counters().updates_split, threads > 1 ? 5u : 0u);
    tables.push_back(Pull(id, Range(0, kRows)));
    ASSERT_EQ(tables.back().size(), kRows * kCols);
  }
  EXPECT_EQ(std::memcmp(tables[0].data(), tables[1].data(), tables[0].size() * sizeof(float)), 0);
}

// Pull replies into memory the transport reserved (a same-host worker's ring): those one
// clock releases are written together, shared by the update threads, and each holds the
// rows it asked for; a push's NaN check is shared too and still refuses a NaN in its last
// range.
TEST_F(ShardTest, RepliesReleasedTogetherAreWrittenIntoTheirRingsByTheUpdateThreads) {
  constexpr uint64_t kRows = 640;
  constexpr uint32_t kCols = 512;  // 327680 floats a table
  for (int threads : {1, 3}) {
    SCOPED_TRACE(testing::Message() << threads << " update thread(s)");
    ShardOptions o;
    o.update_threads = threads;
    Reset(o);
    std::vector<const uint8_t*> reserved;
    shard_->SetPayloadAllocator([&reserved](const PeerId&, size_t bytes) {
      std::shared_ptr<uint8_t[]> buf(new uint8_t[bytes]);
      std::memset(buf.get(), 0xff, bytes);  // NaN until written
      WritableFrame w;
      w.data = buf.get();
      w.frame = Frame::Wrap(w.data, bytes, std::move(buf));
      reserved.push_back(w.data);
      return std::optional<WritableFrame>(std::move(w));
    });
    TableSpec spec = Spec("w", kRows, kCols);
    spec.init.kind = InitKind::kNormal;
    spec.init.scale = 0.1f;
    const uint32_t id = Create(spec);
    for (uint64_t w : {1, 2, 3}) Register(w);
    const std::vector<float> table = Pull(id, Range(0, kRows));
    ASSERT_EQ(table.size(), kRows * kCols);
    const uint64_t split_before = shard_->counters().passes_split;
    // Workers 1 and 2 pull iteration 1 at staleness 0: parked until worker 3's clock.
    EXPECT_TRUE(Send("w1", MakePull(10, id, Range(0, kRows), 1, 1, 0)).empty());
    EXPECT_TRUE(Send("w2", MakePull(11, id, Range(40, kRows), 2, 1, 0)).empty());
    EXPECT_TRUE(Send("w3", MakePull(12, id, Range(7, 9), 3, 1, 0)).empty());
    ASSERT_EQ(shard_->parked_pulls(), 3u);
    Send("w1", MakeClock(13, 1, 1));
    Send("w2", MakeClock(14, 2, 1));
    reserved.clear();
    std::vector<Outgoing> out = Send("w3", MakeClock(15, 3, 1));
    ASSERT_EQ(out.size(), 4u);  // three pull replies and the clock's
    ASSERT_EQ(reserved.size(), 3u);
    const std::pair<uint64_t, uint64_t> asked[] = {{0, kRows}, {40, kRows}, {7, 9}};
    for (size_t i = 0; i < 3; ++i) {
      SCOPED_TRACE(i);
      EXPECT_EQ(out[i].message[1].data(), reserved[i]) << "the reply is the reserved memory";
      const std::vector<float> want(table.begin() + asked[i].first * kCols,
                                    table.begin() + asked[i].second * kCols);
      const std::vector<float> got = ReadReply(out[i]);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    }
    // 655 Ki floats written as one pass: split over the threads when there are some.
    EXPECT_EQ(shard_->counters().passes_split - split_before, threads > 1 ? 1u : 0u);
    std::vector<float> g(kRows * kCols, 0.5f);
    g.back() = std::numeric_limits<float>::quiet_NaN();
    Status st = Push(id, Range(0, kRows), g, 1, 1);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("NaN"), std::string::npos) << st;
    EXPECT_EQ(shard_->counters().passes_split - split_before, threads > 1 ? 2u : 0u);
    EXPECT_EQ(shard_->counters().updates_split, 0u) << "nothing was applied";
  }
}

// A pull reply is sent from the table's memory (Table::ReadFrame); one still queued in a
// transport when a push arrives keeps the values it was made with, as a copy would have.
TEST_F(ShardTest, APullReplyStillQueuedWhenAPushArrivesKeepsTheValuesItWasMadeWith) {
  uint32_t id = Create(Spec("w", 3, 2));
  Register(1);
  ASSERT_TRUE(Push(id, Range(0, 3), {1, 2, 3, 4, 5, 6}, 1, 1).ok());
  auto queued = Send("reader", MakePull(3, id, Range(0, 3), 0, 0, 0));
  auto queued_rows = Send("reader", MakePull(3, id, Range(1, 3), 0, 0, 0));
  auto queued_bf16 = Send("reader", MakePull(3, id, Range(0, 3), 0, 0, 0, DType::kBF16));
  ASSERT_EQ(queued.size(), 1u);
  ASSERT_EQ(queued_rows.size(), 1u);
  ASSERT_EQ(queued_bf16.size(), 1u);
  ASSERT_TRUE(Push(id, Range(0, 3), {10, 20, 30, 40, 50, 60}, 1, 2).ok());
  EXPECT_EQ(ReadReply(queued[0]), (std::vector<float>{-1, -2, -3, -4, -5, -6}));
  EXPECT_EQ(ReadReply(queued_rows[0]), (std::vector<float>{-3, -4, -5, -6}));
  EXPECT_EQ(ReadReply(queued_bf16[0]), (std::vector<float>{-1, -2, -3, -4, -5, -6}));
  EXPECT_EQ(Pull(id, Range(0, 3)), (std::vector<float>{-11, -22, -33, -44, -55, -66}));
  // One copy for the push that came while the fp32 replies were queued (the bf16 one was
  // converted, not shared); none once they are gone.
  EXPECT_EQ(shard_->counters().values_copied_on_write, 1u);
  queued.clear();
  queued_rows.clear();
  ASSERT_TRUE(Push(id, Range(0, 3), {1, 1, 1, 1, 1, 1}, 1, 3).ok());
  EXPECT_EQ(shard_->counters().values_copied_on_write, 1u);
}

TEST_F(ShardTest, ExplicitKeysPullAndPushRows) {
  uint32_t id = Create(Spec("e", 5, 2));
  Register(1);
  Rows keys;
  keys.explicit_keys = true;
  keys.keys = {4, 1};
  ASSERT_TRUE(Push(id, keys, {1, 2, 3, 4}, 1, 1).ok());
  EXPECT_EQ(Pull(id, keys), (std::vector<float>{-1, -2, -3, -4}));
  EXPECT_EQ(Pull(id, Range(0, 5)), (std::vector<float>{0, 0, -3, -4, 0, 0, 0, 0, -1, -2}));
}

TEST_F(ShardTest, DuplicatePushIsAppliedOnce) {
  uint32_t id = Create(Spec("w", 1, 2));
  Register(1);
  ASSERT_TRUE(Push(id, Range(0, 1), {1, 1}, 1, 1).ok());
  ASSERT_TRUE(Push(id, Range(0, 1), {1, 1}, 1, 1).ok());
  EXPECT_FALSE(std::get<PushReply>(Decode(last_[0].message).value).applied);
  EXPECT_EQ(Pull(id, Range(0, 1)), (std::vector<float>{-1, -1}));
  EXPECT_EQ(shard_->counters().pushes_duplicate, 1u);
}

TEST_F(ShardTest, PushFromUnregisteredWorkerIsRefused) {
  uint32_t id = Create(Spec("w", 1, 1));
  EXPECT_EQ(Push(id, Range(0, 1), {1}, 9, 1).code(), StatusCode::kNotRegistered);
  Register(9, 2);
  EXPECT_EQ(Push(id, Range(0, 1), {1}, 9, 1, /*inc=*/1).code(), StatusCode::kNotRegistered);
  EXPECT_EQ(Pull(id, Range(0, 1)), (std::vector<float>{0}));
}

TEST_F(ShardTest, NonFiniteGradientsAreRejectedAndNotApplied) {
  uint32_t id = Create(Spec("w", 1, 3));
  Register(1);
  Status st = Push(id, Range(0, 1), {1, std::numeric_limits<float>::quiet_NaN(), 1}, 1, 1);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("NaN"), std::string::npos);
  EXPECT_EQ(Push(id, Range(0, 1), {std::numeric_limits<float>::infinity(), 0, 0}, 1, 2).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Pull(id, Range(0, 1)), (std::vector<float>{0, 0, 0}));
}

// A payload copied out of shared memory was checked for NaN and Inf by that copy: the shard
// applies it without reading it again (counted). The copy's check is the only way to skip
// the shard's: a payload it found a NaN in is refused as any other, and one it did not
// check (from the socket) is checked by the shard.
TEST_F(ShardTest, APushCheckedByItsCopyIsNotCheckedAgainAndNothingElseSkipsTheCheck) {
  uint32_t id = Create(Spec("w", 2, 2));
  Register(1);
  auto push = [&](std::vector<float> g, uint64_t seq, bool checked) -> Status {
    Frame plain = EncodeValues(g, DType::kF32);
    Frame payload = checked ? Frame::CopyCheckingFinite(plain.data(), plain.size()) : plain;
    const Decoded<Reply>* e =
        One("w1", MakePush(4, id, Range(0, 2), 1, 1, seq, DType::kF32, payload));
    if (e == nullptr) return Internal("no reply");
    return StatusOf(e->value);
  };
  ASSERT_TRUE(push({1, 2, 3, 4}, 1, true).ok());
  EXPECT_EQ(shard_->counters().pushes_checked_in_copy, 1u);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Status st = push({1, nan, 3, 4}, 2, true);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  st = push({1, 2, std::numeric_limits<float>::infinity(), 4}, 3, false);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  ASSERT_TRUE(push({1, 1, 1, 1}, 4, false).ok());
  EXPECT_EQ(shard_->counters().pushes_checked_in_copy, 1u);
  EXPECT_EQ(shard_->counters().nonfinite_pushes, 2u);
  EXPECT_EQ(Pull(id, Range(0, 2)), (std::vector<float>{-2, -3, -4, -5}));
}

TEST_F(ShardTest, SkipRowsPolicyAppliesOnlyTheFiniteRows) {
  ShardOptions o;
  o.nonfinite = NonFinitePolicy::kSkipRows;
  Reset(o);
  uint32_t id = Create(Spec("w", 3, 2));
  Register(1);
  float nan = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(Push(id, Range(0, 3), {1, 2, nan, 4, 5, 6}, 1, 1).ok());
  EXPECT_EQ(std::get<PushReply>(Decode(last_[0].message).value).skipped_rows, 1u);
  EXPECT_EQ(Pull(id, Range(0, 3)), (std::vector<float>{-1, -2, 0, 0, -5, -6}));
  EXPECT_EQ(shard_->counters().nonfinite_rows_skipped, 1u);
  EXPECT_EQ(shard_->counters().nonfinite_pushes, 1u);
}

TEST_F(ShardTest, ParkedPullsPerConnectionAreLimited) {
  ShardOptions o;
  o.max_parked_per_peer = 2;
  Reset(o);
  uint32_t id = Create(Spec("w", 1, 1));
  Register(1);
  Register(2);
  EXPECT_TRUE(Send("w1", MakePull(1, id, Range(0, 1), 1, 5, 0)).empty());
  EXPECT_TRUE(Send("w1", MakePull(2, id, Range(0, 1), 1, 5, 0)).empty());
  EXPECT_EQ(ErrorOf("w1", MakePull(3, id, Range(0, 1), 1, 5, 0)).code(),
            StatusCode::kResourceExhausted);
  EXPECT_TRUE(Send("w2", MakePull(4, id, Range(0, 1), 2, 5, 0)).empty())
      << "another connection has its own budget";
  EXPECT_EQ(shard_->counters().limit_rejections, 1u);
  // Once the bound lets them through, the connection may park again.
  for (int c = 1; c <= 5; ++c) {
    Send("w1", MakeClock(10 + c, 1, c));
    Send("w2", MakeClock(20 + c, 2, c));
  }
  EXPECT_EQ(shard_->parked_pulls(), 0u);
  EXPECT_TRUE(Send("w1", MakePull(5, id, Range(0, 1), 1, 9, 0)).empty());
}

TEST_F(ShardTest, TooManyKeysIsResourceExhausted) {
  ShardOptions o;
  o.limits.max_keys = 3;
  Reset(o);
  uint32_t id = Create(Spec("w", 10, 1));
  Rows keys;
  keys.explicit_keys = true;
  keys.keys = {1, 2, 3, 4};
  EXPECT_EQ(ErrorOf("r", MakePull(1, id, keys, 0, 0, 0)).code(), StatusCode::kResourceExhausted);
  keys.keys.pop_back();
  EXPECT_EQ(Pull(id, keys).size(), 3u);
}

TEST_F(ShardTest, WrongPayloadSizeIsRejected) {
  uint32_t id = Create(Spec("w", 2, 2));
  Register(1);
  Status st = Push(id, Range(0, 2), {1, 2, 3}, 1, 1);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("12 bytes"), std::string::npos) << st;
}

TEST_F(ShardTest, UnknownTableIsNotFound) {
  Register(1);
  EXPECT_EQ(Push(7, Range(0, 1), {1}, 1, 1).code(), StatusCode::kNotFound);
  EXPECT_EQ(ErrorOf("r", MakePull(1, 7, Range(0, 1), 0, 0, 0)).code(), StatusCode::kNotFound);
}

TEST_F(ShardTest, RowsOutsideTheTableOrShardAreRejected) {
  uint32_t id = Create(Spec("w", 4, 1));
  EXPECT_EQ(ErrorOf("r", MakePull(1, id, Range(2, 9), 0, 0, 0)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorOf("r", MakePull(1, id, Range(3, 2), 0, 0, 0)).code(),
            StatusCode::kInvalidArgument);
  ShardOptions o;
  o.shard = 1;
  o.num_shards = 2;
  Reset(o);
  id = Create(Spec("w", 4, 1));  // this shard holds rows [2, 4)
  Status st = ErrorOf("r", MakePull(1, id, Range(0, 4), 0, 0, 0));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("[2, 4)"), std::string::npos) << st;
  EXPECT_EQ(Pull(id, Range(2, 4)).size(), 2u);
}

TEST_F(ShardTest, MalformedMessagesGetErrorRepliesAndTheShardKeepsServing) {
  uint32_t id = Create(Spec("w", 1, 1));
  EXPECT_EQ(ErrorOf("x", Message{}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorOf("x", Message{Frame::Copy("garbage!garbage!garbage!")}).code(),
            StatusCode::kInvalidArgument);
  Message good = MakePull(1, id, Range(0, 1), 0, 0, 0);
  for (size_t cut : {4ul, 8ul, good[0].size() / 2, good[0].size() - 1}) {
    Message truncated{Frame::Copy(good[0].data(), cut)};
    EXPECT_EQ(ErrorOf("x", truncated).code(), StatusCode::kInvalidArgument) << "cut at " << cut;
  }
  Message extra = good;
  extra.push_back(Frame::Copy("zz"));
  EXPECT_EQ(ErrorOf("x", extra).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(shard_->counters().errors, 7u);  // empty, garbage, 4 truncations, extra frame
  EXPECT_EQ(Pull(id, Range(0, 1)), (std::vector<float>{0}));
}

// A peer sending garbage: every message is counted, its error replies stop at the per-peer
// limit until the next window, its warning lines at theirs, and another peer is answered.
TEST_F(ShardTest, GarbageFloodIsCountedButItsRepliesAndLogLinesAreBounded) {
  ShardOptions o;
  o.error_replies = {.per_key = 10, .total = 1000, .window_ms = 1000};
  o.rejection_log = {.per_key = 3, .total = 50, .window_ms = 60000};
  Reset(o);
  const Message garbage{Frame::Copy("garbage!garbage!garbage!")};
  size_t replies = 0;
  for (int i = 0; i < 100; ++i) replies += Send("flood", garbage).size();
  EXPECT_EQ(replies, 10u);
  EXPECT_EQ(shard_->counters().errors, 100u);
  EXPECT_EQ(shard_->counters().error_replies_suppressed, 90u);
  EXPECT_EQ(shard_->counters().rejection_lines_suppressed, 97u);
  // Another peer has its own budget; the flooding one gets replies again a second later.
  EXPECT_EQ(ErrorOf("other", garbage).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Send("flood", garbage).empty());
  now_ += 1000;
  EXPECT_EQ(ErrorOf("flood", garbage).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(shard_->counters().errors, 103u);
}

TEST_F(ShardTest, OtherProtocolVersionIsVersionMismatch) {
  // A raw message on purpose: the codec only writes its own protocol version.
  flatbuffers::FlatBufferBuilder fbb;
  auto body = wire::CreateStats(fbb);
  fbb.Finish(wire::CreateEnvelope(fbb, kProtocolVersion + 1, 5, wire::Body::Stats, body.Union()),
             "LSH1");
  Status st = ErrorOf("x", Message{Frame::Copy(fbb.GetBufferPointer(), fbb.GetSize())});
  EXPECT_EQ(st.code(), StatusCode::kVersionMismatch);
  EXPECT_EQ(last_[0].message.size(), 1u);
  EXPECT_EQ(Decode(last_[0].message).request_id, 5u);
}

TEST_F(ShardTest, OversizedMessageIsResourceExhausted) {
  ShardOptions o;
  o.max_message_bytes = 1000;
  Reset(o);
  uint32_t id = Create(Spec("w", 1000, 1));
  Register(1);
  std::vector<float> g(1000, 1.f);
  EXPECT_EQ(Push(id, Range(0, 1000), g, 1, 1).code(), StatusCode::kResourceExhausted);
}

TEST_F(ShardTest, ABatchIsHandledMessageByMessageAndAnsweredInOneBatch) {
  uint32_t w = Create(Spec("w", 2, 2)), b = Create(Spec("b", 1, 2));
  Register(1);
  Register(2);
  auto grad = [](std::vector<float> g) { return EncodeValues(g, DType::kF32); };
  // An iteration's pushes and clock in one message; the same push twice is applied once.
  Message batch = PackBatch({MakePush(10, w, Range(0, 2), 1, 1, 1, DType::kF32, grad({1, 2, 3, 4})),
                             MakePush(11, b, Range(0, 1), 1, 1, 2, DType::kF32, grad({5, 6})),
                             MakePush(12, b, Range(0, 1), 1, 1, 2, DType::kF32, grad({5, 6})),
                             MakeClock(13, 1, 1)});
  auto out = Send("w1", batch);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].peer, "w1");
  auto replies = UnpackBatch(out[0].message);
  ASSERT_TRUE(replies.ok()) << replies.status();
  ASSERT_EQ(replies->size(), 4u);
  const std::vector<uint64_t> rids = {10, 11, 12, 13};
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(Decode((*replies)[i]).request_id, rids[i]);
  EXPECT_TRUE(std::get<PushReply>(Decode((*replies)[1]).value).applied);
  EXPECT_FALSE(std::get<PushReply>(Decode((*replies)[2]).value).applied);
  EXPECT_TRUE(std::holds_alternative<ClockReply>(Decode((*replies)[3]).value));
  EXPECT_EQ(Pull(w, Range(0, 2)), (std::vector<float>{-1, -2, -3, -4}));
  EXPECT_EQ(Pull(b, Range(0, 1)), (std::vector<float>{-5, -6}));

  // A batch of pulls under s = 0: parked together, released by worker 2's clock; the
  // clock's reply goes to worker 2 alone, the pulls' replies to worker 1.
  EXPECT_TRUE(Send("w1", PackBatch({MakePull(20, w, Range(0, 2), 1, 1, 0),
                                    MakePull(21, b, Range(0, 1), 1, 1, 0)}))
                  .empty());
  EXPECT_EQ(shard_->parked_pulls(), 2u);
  out = Send("w2", PackBatch({MakeClock(30, 2, 1)}));
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].peer, "w1");
  EXPECT_EQ(out[1].peer, "w1");
  EXPECT_EQ(Decode(out[0].message).request_id, 20u);
  EXPECT_EQ(ReadReply(out[1]), (std::vector<float>{-5, -6}));
  EXPECT_EQ(out[2].peer, "w2");
  EXPECT_EQ(Decode(out[2].message).request_id, 30u) << "a batch of one is answered plainly";
}

TEST_F(ShardTest, BadMessagesInABatchGetTheirOwnErrorsAndMalformedBatchesOneError) {
  uint32_t w = Create(Spec("w", 1, 2));
  Register(1);
  Message garbage = {Frame::Copy("garbage!", 8)};
  auto out = Send(
      "w1", PackBatch({MakePull(40, w + 7, Range(0, 1), 1, 0, 0), garbage,
                       MakePull(41, w, Range(0, 1), 1, 0, 0), PackBatch({MakeClock(42, 1, 1)})}));
  ASSERT_EQ(out.size(), 1u);
  auto replies = UnpackBatch(out[0].message);
  ASSERT_TRUE(replies.ok()) << replies.status();
  ASSERT_EQ(replies->size(), 4u);
  EXPECT_EQ(StatusOf(Decode((*replies)[0]).value).code(), StatusCode::kNotFound);
  EXPECT_EQ(StatusOf(Decode((*replies)[1]).value).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadReply({"w1", (*replies)[2]}), (std::vector<float>{0, 0}));
  EXPECT_NE(StatusOf(Decode((*replies)[3]).value).message().find("inside a batch"),
            std::string::npos);
  Message truncated = PackBatch({MakeClock(43, 1, 1)});
  truncated.pop_back();
  Status st = ErrorOf("w1", truncated);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_EQ(shard_->counters().errors, 4u);
}

TEST_F(ShardTest, BulkSynchronousPullWaitsForEveryWorkersClock) {
  uint32_t id = Create(Spec("w", 1, 1));
  Register(1);
  Register(2);
  // Worker 1 finished iteration 0 and wants to read for iteration 1 with s = 0.
  ASSERT_EQ(Send("w1", MakeClock(5, 1, 1)).size(), 1u);
  EXPECT_TRUE(Send("w1", MakePull(6, id, Range(0, 1), 1, 1, 0)).empty());
  EXPECT_EQ(shard_->parked_pulls(), 1u);
  // Worker 2's clock releases it, together with worker 2's own clock reply.
  auto out = Send("w2", MakeClock(7, 2, 1));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].peer, "w1");
  EXPECT_EQ(Decode(out[0].message).request_id, 6u);
  EXPECT_EQ(std::get<PullReply>(Decode(out[0].message).value).min_clock, 1);
  EXPECT_EQ(shard_->parked_pulls(), 0u);
}

TEST_F(ShardTest, StalePullIsAnsweredExactlyWhenMinimumReachesClockMinusStaleness) {
  uint32_t id = Create(Spec("w", 1, 1));
  Register(1);
  Register(2);
  for (int c = 1; c <= 5; ++c) Send("w1", MakeClock(10 + c, 1, c));
  // Worker 1 at iteration 5 with s = 2 needs min clock >= 3.
  EXPECT_TRUE(Send("w1", MakePull(20, id, Range(0, 1), 1, 5, 2)).empty());
  EXPECT_EQ(Send("w2", MakeClock(21, 2, 1)).size(), 1u);
  EXPECT_EQ(Send("w2", MakeClock(22, 2, 2)).size(), 1u);
  auto out = Send("w2", MakeClock(23, 2, 3));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Decode(out[0].message).request_id, 20u);
  // Within the bound a pull is served at once.
  EXPECT_EQ(Send("w1", MakePull(24, id, Range(0, 1), 1, 5, 2)).size(), 1u);
}

TEST_F(ShardTest, WithABackupWorkerTheFastWorkersNeverWaitForTheSlowest) {
  ShardOptions o;
  o.backup_workers = 1;
  Reset(o);
  uint32_t id = Create(Spec("w", 1, 1));
  for (uint64_t w = 1; w <= 3; ++w) Register(w);
  // Workers 1 and 2 run ahead under s = 0; worker 3 stays at clock 0.
  for (int c = 1; c <= 4; ++c) {
    Send("w1", MakeClock(10 + c, 1, c));
    Send("w2", MakeClock(20 + c, 2, c));
    EXPECT_EQ(Send("w1", MakePull(30 + c, id, Range(0, 1), 1, c, 0)).size(), 1u) << c;
  }
  EXPECT_EQ(shard_->min_clock(), 4);
  EXPECT_EQ(shard_->parked_pulls(), 0u);
  // Worker 1 waits for worker 2 as ever: the second slowest counts.
  Send("w1", MakeClock(15, 1, 5));
  EXPECT_TRUE(Send("w1", MakePull(35, id, Range(0, 1), 1, 5, 0)).empty());
  auto out = Send("w2", MakeClock(25, 2, 5));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Decode(out[0].message).request_id, 35u);
  const Decoded<Reply>* e = One("ctl", MakeStats(9));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(std::get<ShardStats>(e->value).backup_workers, 1u);
}

TEST_F(ShardTest, BackupWorkersPushBeyondTheStalenessBoundIsDroppedAndCounted) {
  ShardOptions o;
  o.backup_workers = 1;
  Reset(o);
  uint32_t id = Create(Spec("w", 1, 1));
  for (uint64_t w = 1; w <= 3; ++w) Register(w);
  for (int c = 1; c <= 3; ++c) {
    Send("w1", MakeClock(10 + c, 1, c));
    Send("w2", MakeClock(20 + c, 2, c));
  }
  ASSERT_EQ(shard_->min_clock(), 3);
  // Worker 3 pulls for iteration 1 under s = 2 (at once: it lags) and pushes at clock 1:
  // 3 - 1 = 2 clocks behind the minimum, within its bound: applied.
  Send("w3", MakeClock(31, 3, 1));
  EXPECT_EQ(Send("w3", MakePull(32, id, Range(0, 1), 3, 1, 2)).size(), 1u);
  ASSERT_TRUE(Push(id, Range(0, 1), {1.f}, 3, 1).ok());
  EXPECT_FLOAT_EQ(Pull(id, Range(0, 1))[0], -1.f);
  // Worker 3 ends iteration 1; the fast workers move on to 5. Worker 3's first push for
  // iteration 2 lags 3 behind: it is acknowledged, not applied, and counted.
  Send("w3", MakeClock(34, 3, 2));
  for (int c = 4; c <= 5; ++c) {
    Send("w1", MakeClock(10 + c, 1, c));
    Send("w2", MakeClock(20 + c, 2, c));
  }
  ASSERT_EQ(shard_->min_clock(), 5);
  const Decoded<Reply>* e = One("w3", MakePush(4, id, Range(0, 1), 3, 1, 2, DType::kF32,
                                               EncodeValues(std::vector<float>{1.f}, DType::kF32)));
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(std::holds_alternative<PushReply>(e->value)) << StatusOf(e->value);
  EXPECT_FALSE(std::get<PushReply>(e->value).applied);
  EXPECT_FLOAT_EQ(Pull(id, Range(0, 1))[0], -1.f);
  EXPECT_EQ(shard_->counters().pushes_dropped_stale, 1u);
  // A resend of the dropped push stays dropped (a duplicate), never applied later.
  ASSERT_TRUE(Push(id, Range(0, 1), {1.f}, 3, 2).ok());
  EXPECT_EQ(shard_->counters().pushes_duplicate, 1u);
  // Caught up to the minimum, its next push is applied again.
  Send("w3", MakeClock(33, 3, 5));
  ASSERT_TRUE(Push(id, Range(0, 1), {1.f}, 3, 3).ok());
  EXPECT_FLOAT_EQ(Pull(id, Range(0, 1))[0], -2.f);
  e = One("ctl", MakeStats(9));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(std::get<ShardStats>(e->value).stale_pushes_dropped, 1u);
  // The fast workers' pushes are never dropped.
  EXPECT_EQ(Send("w1", MakePull(40, id, Range(0, 1), 1, 5, 0)).size(), 1u);
  ASSERT_TRUE(Push(id, Range(0, 1), {1.f}, 1, 1).ok());
  EXPECT_FLOAT_EQ(Pull(id, Range(0, 1))[0], -3.f);
}

TEST_F(ShardTest, BackupWorkersApplyOrDropAllPushesOfAnIterationAlike) {
  ShardOptions o;
  o.backup_workers = 1;
  Reset(o);
  uint32_t id = Create(Spec("w", 1, 1));
  for (uint64_t w = 1; w <= 3; ++w) Register(w);
  for (int c = 1; c <= 3; ++c) {
    Send("w1", MakeClock(10 + c, 1, c));
    Send("w2", MakeClock(20 + c, 2, c));
  }
  // Worker 3 trains iteration 1 under s = 2, 2 clocks behind the minimum: within its bound.
  Send("w3", MakeClock(31, 3, 1));
  EXPECT_EQ(Send("w3", MakePull(32, id, Range(0, 1), 3, 1, 2)).size(), 1u);
  // Its early push (sent during backward) is applied ...
  ASSERT_TRUE(Push(id, Range(0, 1), {1.f}, 3, 1).ok());
  EXPECT_FLOAT_EQ(Pull(id, Range(0, 1))[0], -1.f);
  // ... the fast workers move on (worker 3 now lags 3 > 2) ...
  Send("w1", MakeClock(14, 1, 4));
  Send("w2", MakeClock(24, 2, 4));
  ASSERT_EQ(shard_->min_clock(), 4);
  // ... and the rest of the same iteration is applied too, not dropped: never half of it.
  ASSERT_TRUE(Push(id, Range(0, 1), {2.f}, 3, 2).ok());
  EXPECT_FLOAT_EQ(Pull(id, Range(0, 1))[0], -3.f);
  EXPECT_EQ(shard_->counters().pushes_dropped_stale, 0u);
  // The next iteration is decided afresh at its first push: at clock 2 with the minimum at 5
  // (3 behind) it is dropped, and so is its second push, even though a pull in between
  // raised worker 3's bound to 3 (all of an iteration alike).
  Send("w3", MakeClock(33, 3, 2));
  Send("w1", MakeClock(15, 1, 5));
  Send("w2", MakeClock(25, 2, 5));
  ASSERT_EQ(shard_->min_clock(), 5);
  ASSERT_TRUE(Push(id, Range(0, 1), {4.f}, 3, 3).ok());
  EXPECT_EQ(shard_->counters().pushes_dropped_stale, 1u);
  EXPECT_EQ(Send("w3", MakePull(34, id, Range(0, 1), 3, 2, 3)).size(), 1u);
  ASSERT_TRUE(Push(id, Range(0, 1), {8.f}, 3, 4).ok());
  EXPECT_EQ(shard_->counters().pushes_dropped_stale, 2u);
  EXPECT_FLOAT_EQ(Pull(id, Range(0, 1))[0], -3.f);
}

TEST_F(ShardTest, PushesAreWeightedByTheirSamplesToOneLargeBatchsUpdate) {
  uint32_t id = Create(Spec("w", 1, 2));
  Register(1);
  Register(2);
  // One clock of a global batch of 64: 48 samples with mean gradient 1, 16 with mean 3.
  // One batch of 64 has mean (48 * 1 + 16 * 3) / 64 = 1.5; SGD at rate 1 moves by -1.5.
  auto push = [&](uint64_t worker, float g, uint32_t samples) {
    const Decoded<Reply>* e =
        One("w" + std::to_string(worker),
            MakePush(4, id, Range(0, 1), worker, 1, 1, DType::kF32,
                     EncodeValues(std::vector<float>{g, -g}, DType::kF32), {samples, 64}));
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(std::holds_alternative<PushReply>(e->value)) << StatusOf(e->value);
  };
  push(1, 1.f, 48);
  push(2, 3.f, 16);
  std::vector<float> v = Pull(id, Range(0, 1));
  EXPECT_FLOAT_EQ(v[0], -1.5f);
  EXPECT_FLOAT_EQ(v[1], 1.5f);
  // A weight of more samples than the global batch is refused and not applied.
  Status st =
      ErrorOf("w1", MakePush(5, id, Range(0, 1), 1, 1, 2, DType::kF32,
                             EncodeValues(std::vector<float>{1.f, 1.f}, DType::kF32), {65, 64}));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_FLOAT_EQ(Pull(id, Range(0, 1))[0], -1.5f);
}

// Clock steps: the weighted pushes of one iteration are one optimizer step on their sum,
// taken when the minimum clock passes the iteration and before any pull it releases is
// answered. Adam, whose step depends on the step count and not on the gradient's scale,
// shows it: three pushes applied one by one would take three steps.
TEST_F(ShardTest, WeightedPushesOfAnIterationAreOneOptimizerStepOnTheirSum) {
  for (bool clock_steps : {true, false}) {
    SCOPED_TRACE(clock_steps ? "clock steps" : "a step per push");
    Reset();
    TableSpec spec = Spec("w", 2, 3, 0.1f);
    spec.optimizer.kind = OptimizerKind::kAdam;
    uint32_t id = Create(spec);
    for (uint64_t w = 1; w <= 3; ++w) Register(w);
    // Worker 3 parks its pull for iteration 1 at staleness 0.
    ASSERT_EQ(Send("w3", MakePull(40, id, Range(0, 2), 3, 1, 0)).size(), 0u);
    const std::vector<std::vector<float>> grads = {
        {1, 2, 3, 4, 5, 6}, {-1, 0.5f, 2, 0, 1, -3}, {0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f}};
    const uint32_t samples[] = {80, 80, 32};  // a global batch of 192
    std::vector<float> sum(6, 0.f);
    for (uint64_t w = 1; w <= 3; ++w) {
      const std::vector<float>& g = grads[w - 1];
      const float scale = static_cast<float>(samples[w - 1]) / 192.f;
      for (size_t i = 0; i < 6; ++i) sum[i] += g[i] * scale;
      const Decoded<Reply>* e =
          One("w" + std::to_string(w),
              MakePush(41, id, Range(0, 2), w, 1, 1, DType::kF32, EncodeValues(g, DType::kF32),
                       {samples[w - 1], 192, clock_steps}));
      ASSERT_NE(e, nullptr);
      ASSERT_TRUE(std::holds_alternative<PushReply>(e->value)) << StatusOf(e->value);
    }
    EXPECT_EQ(shard_->counters().pushes_summed, clock_steps ? 3u : 0u);
    Send("w1", MakeClock(42, 1, 1));
    Send("w2", MakeClock(42, 2, 1));
    // The last worker's clock moves the minimum: the step, then worker 3's parked pull.
    std::vector<Outgoing> released = Send("w3", MakeClock(42, 3, 1));
    ASSERT_EQ(released.size(), 2u);
    EXPECT_EQ(shard_->counters().clock_steps, clock_steps ? 1u : 0u);
    const std::vector<float> got = ReadReply(released[0]);

    // The reference: a table that took one Adam step on the sum (or three, one per push).
    auto ref = ps::Table::Create(0, spec, RowRange{0, 2});
    ASSERT_TRUE(ref.ok());
    if (clock_steps) {
      ref->Apply(Range(0, 2), sum.data());
    } else {
      for (uint64_t w = 1; w <= 3; ++w) {
        ref->Apply(Range(0, 2), grads[w - 1].data(), static_cast<float>(samples[w - 1]) / 192.f);
      }
    }
    std::vector<float> want(6);
    ref->Read(Range(0, 2), want.data());
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "value " << i;
    EXPECT_EQ(ref->steps(), clock_steps ? 1u : 3u);
  }
}

// A backup worker's push for an iteration the minimum has passed is applied on its own at
// once (its iteration's step was taken); unweighted pushes are never summed.
TEST_F(ShardTest, LatePushesAndUnweightedPushesAreAppliedOnTheirOwn) {
  ShardOptions o;
  o.backup_workers = 1;
  Reset(o);
  uint32_t id = Create(Spec("w", 1, 1));
  Register(1);
  Register(2);
  // Worker 2 reads at staleness 5, so its pushes within 5 clocks of the minimum count.
  Send("w2", MakePull(50, id, Range(0, 1), 2, 0, 5));
  Send("w1", MakeClock(51, 1, 2));
  ASSERT_EQ(shard_->min_clock(), 2);  // worker 2, the slowest, is the backup
  auto push = [&](uint64_t worker, uint64_t seq, float g, uint32_t samples) {
    const Decoded<Reply>* e =
        One("w" + std::to_string(worker),
            MakePush(52, id, Range(0, 1), worker, 1, seq, DType::kF32,
                     EncodeValues(std::vector<float>{g}, DType::kF32), {samples, 64, true}));
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(std::holds_alternative<PushReply>(e->value)) << StatusOf(e->value);
  };
  push(2, 1, 4.f, 16);  // iteration 0, passed: applied now, 4 * 16 / 64 = 1
  EXPECT_FLOAT_EQ(Pull(id, Range(0, 1))[0], -1.f);
  push(1, 1, 2.f, 48);  // iteration 2: summed, 2 * 48 / 64 = 1.5
  EXPECT_FLOAT_EQ(Pull(id, Range(0, 1))[0], -1.f);
  EXPECT_TRUE(Push(id, Range(0, 1), {0.5f}, 1, 2).ok());  // unweighted: applied now
  EXPECT_FLOAT_EQ(Pull(id, Range(0, 1))[0], -1.5f);
  Send("w1", MakeClock(53, 1, 3));
  Send("w2", MakeClock(53, 2, 3));
  EXPECT_FLOAT_EQ(Pull(id, Range(0, 1))[0], -3.f);
  EXPECT_EQ(shard_->counters().pushes_summed, 1u);
  EXPECT_EQ(shard_->counters().clock_steps, 1u);
}

// The last live worker leaving before the minimum passed its iteration: nobody else can add
// to the sum or move the minimum, so the step is taken as it leaves.
TEST_F(ShardTest, AClockStepIsTakenWhenTheLastLiveWorkerLeavesBeforeItsClock) {
  uint32_t id = Create(Spec("w", 1, 1));
  Register(1);
  Register(2);
  auto push = [&](uint64_t worker, float g) {
    ASSERT_TRUE(One("w" + std::to_string(worker),
                    MakePush(70, id, Range(0, 1), worker, 1, 1, DType::kF32,
                             EncodeValues(std::vector<float>{g}, DType::kF32), {32, 64, true})) !=
                nullptr);
  };
  push(1, 2.f);
  push(2, 4.f);
  One("w1", MakeLeave(71, 1, 1));
  EXPECT_FLOAT_EQ(Pull(id, Range(0, 1))[0], 0.f);  // worker 2 may still clock: pending
  One("w2", MakeLeave(72, 2, 1));
  EXPECT_FLOAT_EQ(Pull(id, Range(0, 1))[0], -3.f);  // (2 * 32 + 4 * 32) / 64
  EXPECT_EQ(shard_->counters().clock_steps, 1u);
}

// A pending clock step is state like any other: a snapshot taken before the iteration ends
// keeps it, and the shard recovered from it takes the step when the iteration ends there.
TEST_F(ShardTest, APendingClockStepSurvivesASnapshotAndIsTakenAfterRecovery) {
  uint32_t id = Create(Spec("w", 1, 2));
  Register(1);
  Register(2);
  ASSERT_TRUE(One("w1", MakePush(60, id, Range(0, 1), 1, 1, 1, DType::kF32,
                                 EncodeValues(std::vector<float>{2.f, -2.f}, DType::kF32),
                                 {32, 64, true})) != nullptr);
  ASSERT_TRUE(shard_->Checkpoint().ok());
  Reset(options_);
  ASSERT_TRUE(shard_->Recover().ok());
  id = 0;
  Register(1);
  Register(2);
  EXPECT_FLOAT_EQ(Pull(id, Range(0, 1))[0], 0.f);
  ASSERT_TRUE(One("w2", MakePush(61, id, Range(0, 1), 2, 1, 1, DType::kF32,
                                 EncodeValues(std::vector<float>{4.f, 0.f}, DType::kF32),
                                 {32, 64, true})) != nullptr);
  Send("w1", MakeClock(62, 1, 1));
  Send("w2", MakeClock(62, 2, 1));
  std::vector<float> v = Pull(id, Range(0, 1));
  EXPECT_FLOAT_EQ(v[0], -3.f);  // (2 * 32 + 4 * 32) / 64
  EXPECT_FLOAT_EQ(v[1], 1.f);
  EXPECT_EQ(shard_->counters().clock_steps, 1u);
}

TEST_F(ShardTest, ClockRepliesSumTheSpeedsOfTheLiveWorkers) {
  Register(1);
  Register(2);
  Register(3);
  auto rate = [&](uint64_t worker, int64_t clock, float speed) {
    const Decoded<Reply>* e = One("w" + std::to_string(worker), MakeClock(9, worker, clock, speed));
    EXPECT_NE(e, nullptr);
    if (e == nullptr || !std::holds_alternative<ClockReply>(e->value)) return -1.0;
    return std::get<ClockReply>(e->value).cluster_samples_per_second;
  };
  EXPECT_DOUBLE_EQ(rate(1, 1, 300), 0);  // no sum until every live worker reported
  EXPECT_DOUBLE_EQ(rate(2, 1, 300), 0);
  EXPECT_DOUBLE_EQ(rate(3, 1, 100), 700);
  EXPECT_DOUBLE_EQ(rate(3, 2, 50), 650);  // a change of speed replaces the old one
  // A worker with no data to train (it waits for the job's last chunks) counts 0.
  EXPECT_DOUBLE_EQ(rate(2, 2, -1), 350);
  EXPECT_DOUBLE_EQ(rate(2, 3, 300), 650);
  // A worker that leaves is out of the sum at the next clock.
  One("w2", MakeLeave(10, 2, 1));
  EXPECT_DOUBLE_EQ(rate(1, 2, 300), 350);
  EXPECT_DOUBLE_EQ(rate(1, 3, 0), 0);  // a clock without a speed gets no sum
}

TEST_F(ShardTest, ExpiredLeaseEvictsAndReleasesParkedPulls) {
  ShardOptions o;
  o.lease_ms = 100;
  o.checkpoint_interval_ms = 0;
  Reset(o);
  uint32_t id = Create(Spec("w", 1, 1));
  Register(1);
  Register(2);
  Send("w1", MakeClock(1, 1, 1));
  EXPECT_TRUE(Send("w1", MakePull(2, id, Range(0, 1), 1, 1, 0)).empty());
  now_ += 60;
  Send("w1", MakeHeartbeat(3, 1, 1));
  std::vector<Outgoing> out;
  now_ += 60;  // worker 2 silent for 120 ms, worker 1 for 60 ms
  shard_->Tick(&out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].peer, "w1");
  EXPECT_EQ(shard_->live_workers(), 1u);
  EXPECT_EQ(shard_->counters().evictions, 1u);
  EXPECT_EQ(ErrorOf("w2", MakeHeartbeat(4, 2, 1)).code(), StatusCode::kNotRegistered);
}

TEST_F(ShardTest, LeaveDropsTheWorkerAtOnce) {
  uint32_t id = Create(Spec("w", 1, 1));
  Register(1);
  Register(2);
  Send("w1", MakeClock(1, 1, 1));
  EXPECT_TRUE(Send("w1", MakePull(2, id, Range(0, 1), 1, 1, 0)).empty());
  auto out = Send("w2", MakeLeave(3, 2, 1));
  ASSERT_EQ(out.size(), 2u);  // the released pull and the leave reply
  EXPECT_EQ(shard_->live_workers(), 1u);
}

TEST_F(ShardTest, SnapshotRestoresValuesOptimizerStateAndClocks) {
  auto spec = Spec("w", 2, 1, 0.1f);
  spec.optimizer.kind = OptimizerKind::kMomentum;
  spec.optimizer.momentum = 0.5f;
  uint32_t id = Create(spec);
  Register(1);
  ASSERT_TRUE(Push(id, Range(0, 2), {1, 2}, 1, 1).ok());
  Send("w1", MakeClock(1, 1, 4));
  ASSERT_EQ(*shard_->Checkpoint(), 4);
  // Continue on the original shard ...
  ASSERT_TRUE(Push(id, Range(0, 2), {1, 2}, 1, 2).ok());
  auto expected = Pull(id, Range(0, 2));
  // ... and on one recovered from the snapshot: the momentum must carry over.
  Reset();
  ASSERT_EQ(*shard_->Recover(), 4);
  EXPECT_EQ(shard_->min_clock(), 4);
  EXPECT_EQ(shard_->live_workers(), 1u);
  ASSERT_TRUE(Push(id, Range(0, 2), {1, 2}, 1, 2).ok());
  EXPECT_EQ(Pull(id, Range(0, 2)), expected);
  // The restored worker's sequence numbers survived: a replay of push 1 is a duplicate.
  ASSERT_TRUE(Push(id, Range(0, 2), {1, 2}, 1, 1).ok());
  EXPECT_EQ(Pull(id, Range(0, 2)), expected);
  EXPECT_EQ(std::get<Welcome>(One("a", MakeRegister(1, 2, 1, "x"))->value).recovered_clock, 4);
}

TEST_F(ShardTest, ScheduledSnapshotsFollowTheInterval) {
  ShardOptions o;
  o.checkpoint_interval_ms = 1000;
  Reset(o);
  std::vector<Outgoing> out;
  shard_->Tick(&out);
  EXPECT_EQ(store_.saves(), 0);
  Create(Spec("w", 1, 1));  // a new table is persisted at once
  EXPECT_EQ(store_.saves(), 1);
  store_ = MemorySnapshotStore();
  now_ += 1000;
  shard_->Tick(&out);
  EXPECT_EQ(store_.saves(), 1);
  now_ += 500;
  shard_->Tick(&out);
  EXPECT_EQ(store_.saves(), 1);
  now_ += 500;
  shard_->Tick(&out);
  EXPECT_EQ(store_.saves(), 2);
}

TEST_F(ShardTest, StatsReportWorkersTablesAndParkedPulls) {
  uint32_t id = Create(Spec("w", 3, 2));
  Register(1);
  Register(2);
  Send("w1", MakeClock(1, 1, 1));
  Send("w1", MakePull(2, id, Range(0, 3), 1, 1, 0));
  const Decoded<Reply>* e = One("ctl", MakeStats(9));
  ASSERT_NE(e, nullptr);
  const auto* r = std::get_if<ShardStats>(&e->value);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->parked_pulls, 1u);
  EXPECT_EQ(r->workers.size(), 2u);
  ASSERT_EQ(r->tables.size(), 1u);
  EXPECT_EQ(r->tables[0].local_rows, 3u);
  EXPECT_EQ(r->tables[0].name, "w");
  EXPECT_EQ(r->min_clock, 0);
}

// Found by fuzz_shard: a CreateTable of 2^40 x 2^24 (within ValidateSpec's plausibility
// bounds) made the shard allocate the whole table and abort.
TEST_F(ShardTest, TableLargerThanTheShardLimitIsResourceExhausted) {
  ShardOptions o;
  o.max_table_values = 1000;
  Reset(o);
  Status st = ErrorOf("admin", MakeCreateTable(1, Spec("huge", uint64_t{1} << 40, 1u << 24)));
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st;
  EXPECT_EQ(ErrorOf("admin", MakeCreateTable(2, Spec("big", 101, 10))).code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(Create(Spec("fits", 100, 10)), 0u);
  // With two shards each holds half the rows, so twice the table fits.
  o.num_shards = 2;
  Reset(o);
  EXPECT_EQ(Create(Spec("fits", 200, 10)), 0u);
}

// Found by fuzz_shard: Adagrad (and Adam) with epsilon 0 turned a value whose gradient was
// 0 into NaN (0 / (sqrt(0) + 0)).
TEST_F(ShardTest, AdamAndAdagradNeedAPositiveEpsilon) {
  for (auto kind : {OptimizerKind::kAdam, OptimizerKind::kAdagrad}) {
    TableSpec t = Spec(std::string("t") + OptimizerName(kind), 2, 3, 0.001f);
    t.optimizer.kind = kind;
    t.optimizer.epsilon = 0.f;
    Status st = ErrorOf("admin", MakeCreateTable(1, t));
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("epsilon"), std::string::npos) << st;
    t.optimizer.epsilon = 1e-8f;
    uint32_t id = Create(t);
    Register(1);
    // Zero gradients leave their values alone.
    ASSERT_TRUE(Push(id, Range(0, 2), {1, 1, 0, 0, 0, 0}, 1, 1 + id).ok());
    std::vector<float> values = Pull(id, Range(0, 2));
    ASSERT_EQ(values.size(), 6u);
    for (float v : values) EXPECT_TRUE(std::isfinite(v));
    EXPECT_EQ(values[2], 0.f);
  }
  // SGD and momentum never divide: their epsilon is not checked.
  TableSpec sgd = Spec("sgd", 2, 3);
  sgd.optimizer.epsilon = 0.f;
  Create(sgd);
}

// Found by fuzz_wire: a Normal initializer with a finite but huge scale (3e38) gave
// initial values of Inf.
TEST_F(ShardTest, InitScaleThatCouldOverflowIsRejected) {
  TableSpec t = Spec("init", 4, 4);
  t.init.kind = InitKind::kNormal;
  t.init.scale = 3e38f;
  Status st = ErrorOf("admin", MakeCreateTable(1, t));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  t.init.scale = 1e30f;
  uint32_t id = Create(t);
  for (float v : Pull(id, Range(0, 4))) EXPECT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace leash::server

namespace leash::server {
namespace {

// ---- sparse tables -------------------------------------------------------------------

TEST_F(ShardTest, SparseTablePullsInitialRowsAndAppliesPushesByKey) {
  uint32_t dense = Create(Spec("d", 2, 1));
  uint32_t id = Create(SparseSpec("emb", 2));
  EXPECT_EQ(id, dense + 1) << "sparse and dense tables share one numbering";
  Register(1);
  const uint64_t big = 0xFEDCBA9876543210ull;
  EXPECT_EQ(Pull(id, Keys({big, 3})), (std::vector<float>{0, 0, 0, 0}));
  ASSERT_TRUE(Push(id, Keys({big, 3}), {1, 2, 3, 4}, 1, 1).ok());
  ASSERT_TRUE(Push(id, Keys({3}), {10, 20}, 1, 2).ok());
  EXPECT_EQ(Pull(id, Keys({3, big, 3})), (std::vector<float>{-13, -24, -1, -2, -13, -24}));
  EXPECT_EQ(Pull(dense, Range(0, 2)), (std::vector<float>{0, 0}));
  EXPECT_EQ(Create(SparseSpec("emb", 2)), id) << "the same spec again is the same table";
  EXPECT_EQ(ErrorOf("admin", MakeCreateTable(1, SparseSpec("emb", 3))).code(),
            StatusCode::kAlreadyExists);
}

TEST_F(ShardTest, SparseKeysOfAnotherShardAreInvalidArgumentNamingTheKey) {
  ShardOptions o;
  o.shard = 1;
  o.num_shards = 3;
  Reset(o);
  uint32_t id = Create(SparseSpec("emb", 1));
  Register(1);
  uint64_t mine = 0, other = 0;
  for (uint64_t k = 1; mine == 0 || other == 0; ++k) {
    if (SparseOwner(k, 3) == 1 && mine == 0) mine = k;
    if (SparseOwner(k, 3) != 1 && other == 0) other = k;
  }
  EXPECT_EQ(Pull(id, Keys({mine})).size(), 1u);
  Status st = ErrorOf("r", MakePull(1, id, Keys({mine, other}), 0, 0, 0));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("key " + std::to_string(other)), std::string::npos) << st;
  st = Push(id, Keys({other}), {1}, 1, 1);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  // A range names no keys of a sparse table.
  st = ErrorOf("r", MakePull(2, id, Range(0, 2), 0, 0, 0));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sparse"), std::string::npos) << st;
}

TEST_F(ShardTest, SparseUnknownTableAndWrongDimensionsAreRefused) {
  Register(1);
  EXPECT_EQ(ErrorOf("r", MakePull(1, 3, Keys({1}), 0, 0, 0)).code(), StatusCode::kNotFound);
  uint32_t id = Create(SparseSpec("emb", 4));
  Status st = Push(id, Keys({1, 2}), {1, 2, 3}, 1, 1);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Pull(id, Keys({1, 2})), std::vector<float>(8, 0.f)) << "nothing was applied";
}

// A small request may ask for a huge reply: 200 keys of 4096-wide rows are 3.2 MB of
// values, over a 1 MB message limit. Refused before anything is allocated or created.
TEST_F(ShardTest, SparsePullWhoseReplyExceedsTheMessageLimitIsResourceExhausted) {
  ShardOptions o;
  o.max_message_bytes = 1 << 20;
  Reset(o);
  Register(1);
  uint32_t id = Create(SparseSpec("wide", 4096));
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 200; ++k) keys.push_back(k);
  Status st = ErrorOf("r", MakePull(1, id, Keys(keys), 1, 0, 0));
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("pull fewer keys"), std::string::npos) << st;
  EXPECT_EQ(Pull(id, Keys({1, 2})).size(), 2u * 4096) << "a pull within the limit is served";
}

TEST_F(ShardTest, SparseDuplicatePushIsAppliedOnce) {
  uint32_t id = Create(SparseSpec("emb", 2));
  Register(1);
  Pull(id, Keys({5}));  // a row is made by its first pull
  ASSERT_TRUE(Push(id, Keys({5}), {1, 1}, 1, 1).ok());
  ASSERT_TRUE(Push(id, Keys({5}), {1, 1}, 1, 1).ok());
  EXPECT_FALSE(std::get<PushReply>(Decode(last_[0].message).value).applied);
  EXPECT_EQ(Pull(id, Keys({5})), (std::vector<float>{-1, -1}));
  EXPECT_EQ(shard_->counters().pushes_duplicate, 1u);
}

TEST_F(ShardTest, ParkedSparsePullIsReleasedByTheClock) {
  uint32_t id = Create(SparseSpec("emb", 1));
  Register(1);
  Register(2);
  Pull(id, Keys({9}));
  ASSERT_TRUE(Push(id, Keys({9}), {2}, 2, 1).ok());
  ASSERT_EQ(Send("w1", MakeClock(5, 1, 1)).size(), 1u);
  EXPECT_TRUE(Send("w1", MakePull(6, id, Keys({9, 8}), 1, 1, 0)).empty());
  EXPECT_EQ(shard_->parked_pulls(), 1u);
  auto out = Send("w2", MakeClock(7, 2, 1));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].peer, "w1");
  EXPECT_EQ(Decode(out[0].message).request_id, 6u);
  EXPECT_EQ(ReadReply(out[0]), (std::vector<float>{-2, 0}));
}

TEST_F(ShardTest, SparseNonFiniteRowsFollowThePolicy) {
  uint32_t id = Create(SparseSpec("emb", 2));
  Register(1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Push(id, Keys({1, 2}), {1, 1, nan, 1}, 1, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Pull(id, Keys({1, 2})), (std::vector<float>{0, 0, 0, 0}));
  ShardOptions o;
  o.nonfinite = NonFinitePolicy::kSkipRows;
  Reset(o);
  id = Create(SparseSpec("emb2", 2));
  Register(1);
  Pull(id, Keys({1, 2}));
  ASSERT_TRUE(Push(id, Keys({1, 2}), {1, 1, nan, 1}, 1, 1).ok());
  EXPECT_EQ(std::get<PushReply>(Decode(last_[0].message).value).skipped_rows, 1u);
  EXPECT_EQ(Pull(id, Keys({1, 2})), (std::vector<float>{-1, -1, 0, 0}));
}

TEST_F(ShardTest, SparseStatsReportTierFiguresAndMemory) {
  ShardOptions o;
  o.memory_budget_bytes = 8u << 20;
  Reset(o);
  uint32_t id = Create(SparseSpec("emb", 4));
  Register(1);
  Pull(id, Keys({1, 2, 3}));
  Pull(id, Keys({1}));
  const Decoded<Reply>* e = One("ctl", MakeStats(9));
  ASSERT_NE(e, nullptr);
  const auto* r = std::get_if<ShardStats>(&e->value);
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->tables.size(), 1u);
  const auto& t = r->tables[0];
  EXPECT_EQ(t.kind, TableKind::kSparse);
  EXPECT_EQ(t.name, "emb");
  EXPECT_EQ(t.cols, 4u);
  EXPECT_EQ(t.resident_rows, 3u);
  EXPECT_EQ(t.tier_hits + t.tier_misses, 4u);
  EXPECT_EQ(t.admissions, 3u);
  EXPECT_GT(t.memory_bytes, 0u);
  EXPECT_EQ(r->memory_budget_bytes, 8u << 20);
  EXPECT_GE(r->memory_used_bytes, t.memory_bytes);
}

TEST_F(ShardTest, SparseSnapshotRecoversRowsAndDiscardsLaterEvictions) {
  ShardOptions o;
  o.checkpoint_interval_ms = 0;
  Reset(o);
  auto spec = SparseSpec("emb", 2, 0.5f);
  spec.optimizer.kind = OptimizerKind::kAdagrad;
  spec.optimizer.epsilon = 1e-6f;
  uint32_t id = Create(spec);
  Register(1);
  std::vector<uint64_t> keys;
  std::vector<float> g;
  for (uint64_t k = 0; k < 64; ++k) {
    keys.push_back(k * 7919);
    g.push_back(static_cast<float>(k));
    g.push_back(1.f);
  }
  Pull(id, Keys(keys));
  ASSERT_TRUE(Push(id, Keys(keys), g, 1, 1).ok());
  Send("w1", MakeClock(1, 1, 3));
  ASSERT_EQ(*shard_->Checkpoint(), 3);
  const auto at_snapshot = Pull(id, Keys(keys));
  // Continue on the original shard: its state moves on, and SetMemoryBudget-driven
  // evictions write later rows to the cold store.
  ASSERT_TRUE(Push(id, Keys(keys), g, 1, 2).ok());
  const auto expected = Pull(id, Keys(keys));
  ASSERT_NE(expected, at_snapshot);
  ASSERT_TRUE(shard_->Checkpoint().ok());  // snapshot 3 (not recovered below)
  ASSERT_TRUE(Push(id, Keys(keys), g, 1, 3).ok());
  Reset(o);
  ASSERT_EQ(*shard_->Recover(), 3);
  EXPECT_EQ(Pull(id, Keys(keys)), expected);
  // The optimizer state came back too: the same push gives the same result.
  ASSERT_TRUE(Push(id, Keys(keys), g, 1, 3).ok());
  Reset(o);
  ASSERT_TRUE(shard_->Recover().ok());
  ASSERT_TRUE(Push(id, Keys(keys), g, 1, 3).ok());
  const auto once = Pull(id, Keys(keys));
  ASSERT_TRUE(Push(id, Keys(keys), g, 1, 3).ok());  // a duplicate after recovery
  EXPECT_EQ(Pull(id, Keys(keys)), once);
  EXPECT_EQ(sparse_store_.checkpoints(), 1u) << "older checkpoints are deleted";
}

TEST_F(ShardTest, SparseRowsBeyondTheBudgetReadBackExactly) {
  ShardOptions o;
  o.memory_budget_bytes = 1u << 20;  // the tables' share: 640 KiB, far below 64k rows x 64 B
  o.checkpoint_interval_ms = 0;
  Reset(o);
  uint32_t id = Create(SparseSpec("emb", 16));
  Register(1);
  uint64_t seq = 0;
  for (uint64_t b = 0; b < 32; ++b) {
    std::vector<uint64_t> keys;
    std::vector<float> g;
    for (uint64_t k = b * 2048; k < (b + 1) * 2048; ++k) {
      keys.push_back(k);
      for (int c = 0; c < 16; ++c) g.push_back(static_cast<float>(k % 1000) + 0.5f * c);
    }
    ASSERT_EQ(Pull(id, Keys(keys)).size(), keys.size() * 16);
    ASSERT_TRUE(Push(id, Keys(keys), g, 1, ++seq).ok());
  }
  const auto* t = shard_->sparse_table(id);
  ASSERT_NE(t, nullptr);
  EXPECT_GT(t->counters().evictions, 0u);
  EXPECT_LE(t->memory_bytes(), SplitMemoryBudget(o.memory_budget_bytes).tables);
  for (uint64_t k : {uint64_t{0}, uint64_t{777}, uint64_t{40000}, uint64_t{65535}}) {
    auto v = Pull(id, Keys({k}));
    ASSERT_EQ(v.size(), 16u);
    for (int c = 0; c < 16; ++c)
      EXPECT_EQ(v[static_cast<size_t>(c)], -(static_cast<float>(k % 1000) + 0.5f * c)) << k;
  }
}

TEST(MemoryBudgetSplitTest, SplitsTheBudgetIntoCacheWriteBufferAndTables) {
  const auto s = SplitMemoryBudget(uint64_t{1} << 30);
  EXPECT_EQ(s.block_cache, uint64_t{128} << 20);
  EXPECT_EQ(s.write_buffer, uint64_t{64} << 20);
  EXPECT_EQ(s.block_cache + s.write_buffer + s.tables, uint64_t{1} << 30);
  const auto small = SplitMemoryBudget(uint64_t{8} << 20);
  EXPECT_EQ(small.write_buffer, uint64_t{512} << 10);
  EXPECT_EQ(SplitMemoryBudget(0).tables, UINT64_MAX);
}

}  // namespace
}  // namespace leash::server

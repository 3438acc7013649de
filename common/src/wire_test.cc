// Tests of the codec: every request and reply survives a round trip through its domain
// type, message verification rejects everything malformed with a clear error, and
// payloads encode in every dtype. Builds raw FlatBuffers on purpose (wire_format.h).
#include "leash/common/wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <variant>

#include "wire_format.h"

namespace leash {
namespace {

Rows Range(uint64_t b, uint64_t e) {
  Rows r;
  r.begin = b;
  r.end = e;
  return r;
}

TEST(WireTest, VerifiesAWellFormedMessage) {
  Message m = MakePull(42, 3, Range(0, 5), 7, 9, 1);
  auto env = VerifyEnvelope(m);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ((*env)->request_id(), 42u);
  ASSERT_EQ((*env)->body_type(), wire::Body::Pull);
  EXPECT_EQ((*env)->body_as_Pull()->clock(), 9);
  EXPECT_EQ(PeekRequestId(m), 42u);
}

TEST(WireTest, RejectsEmptyShortAndGarbage) {
  EXPECT_EQ(VerifyEnvelope(Message{}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(VerifyEnvelope(Message{Frame::Copy("abc")}).status().code(),
            StatusCode::kInvalidArgument);
  auto st = VerifyEnvelope(Message{Frame::Copy("this is not a flatbuffer at all")}).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("LSH1"), std::string::npos) << st;
}

TEST(WireTest, EveryTruncationIsRejectedOrReadsTheSameRequest) {
  TableSpec created;
  created.name = "embedding";
  created.rows = 10;
  created.cols = 4;
  Message m = MakeCreateTable(1, created);
  const Frame& h = m[0];
  int rejected = 0;
  for (size_t cut = 0; cut < h.size(); ++cut) {
    Message truncated{Frame::Copy(h.data(), cut)};  // must outlive the envelope read from it
    auto r = DecodeRequest(truncated);
    if (!r.ok()) {
      ++rejected;
      continue;
    }
    // Only trailing alignment padding may be cut: the content must be intact.
    const TableSpec& spec = std::get<CreateTableRequest>(r->value).spec;
    EXPECT_EQ(spec.name, "embedding") << "cut at " << cut;
    EXPECT_EQ(spec.rows, 10u);
    EXPECT_EQ(spec.cols, 4u);
  }
  EXPECT_GE(rejected, static_cast<int>(h.size()) - 8);
}

TEST(WireTest, RandomCorruptionNeverCrashesTheVerifier) {
  Message m = MakePush(1, 0, Range(0, 2), 1, 1, 1, DType::kF32,
                       EncodeValues(std::vector<float>{1, 2}, DType::kF32));
  std::mt19937 rng(1);
  std::vector<uint8_t> bytes(m[0].data(), m[0].data() + m[0].size());
  int rejected = 0;
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> b = bytes;
    for (int k = 0; k < 3; ++k) b[rng() % b.size()] = static_cast<uint8_t>(rng());
    Message corrupted{Frame::Own(std::move(b))};
    // Accepted ones were read in full by the codec.
    if (!DecodeRequest(corrupted).ok()) ++rejected;
  }
  EXPECT_GT(rejected, 0);
}

TEST(WireTest, RejectsAnotherProtocolVersion) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = wire::CreateStats(fbb);
  fbb.Finish(wire::CreateEnvelope(fbb, 99, 1, wire::Body::Stats, body.Union()),
             wire::EnvelopeIdentifier());
  auto r = VerifyEnvelope(Message{Frame::Copy(fbb.GetBufferPointer(), fbb.GetSize())});
  EXPECT_EQ(r.status().code(), StatusCode::kVersionMismatch);
  EXPECT_NE(r.status().message().find("99"), std::string::npos);
}

TEST(WireTest, RejectsAMessageWithoutBody) {
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(wire::CreateEnvelope(fbb, kProtocolVersion, 1), wire::EnvelopeIdentifier());
  EXPECT_EQ(
      VerifyEnvelope(Message{Frame::Copy(fbb.GetBufferPointer(), fbb.GetSize())}).status().code(),
      StatusCode::kInvalidArgument);
}

TEST(WireTest, HeaderOverTheLimitIsResourceExhausted) {
  TableSpec t;
  t.name = std::string(5000, 'x');
  t.rows = 1;
  t.cols = 1;
  WireLimits limits;
  limits.max_header_bytes = 1024;
  EXPECT_EQ(DecodeRequest(MakeCreateTable(1, t), limits).status().code(),
            StatusCode::kResourceExhausted);
}

TEST(WireTest, ErrorRepliesCarryCodeMessageAndBootId) {
  Message m = MakeError(5, NotFound("unknown table 3"), 77);
  auto r = DecodeReply(m);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request_id, 5u);
  const auto& e = std::get<ErrorReply>(r->value);
  EXPECT_EQ(e.status.code(), StatusCode::kNotFound);
  EXPECT_EQ(e.status.message(), "unknown table 3");
  EXPECT_EQ(e.boot_id, 77u);
}

TEST(WireTest, PayloadRoundTripsInEveryDtype) {
  std::vector<float> v = {0.f, 1.f, -2.5f, 3.1415926f, 1e-3f};
  for (auto dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    Frame f = EncodeValues(v, dt);
    EXPECT_EQ(f.size(), v.size() * DTypeSize(dt));
    std::vector<float> back(v.size());
    ASSERT_TRUE(DecodeValues(f, dt, v.size(), back.data()).ok());
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_NEAR(back[i], v[i], dt == DType::kF32 ? 0 : std::fabs(v[i]) / 100 + 1e-6)
          << DTypeName(dt);
    }
  }
}

TEST(WireTest, PayloadOfTheWrongSizeIsRejectedNamingBothSizes) {
  Frame f = EncodeValues(std::vector<float>{1, 2, 3}, DType::kF32);
  std::vector<float> out(4);
  Status st = DecodeValues(f, DType::kF32, 4, out.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("12 bytes"), std::string::npos) << st;
  EXPECT_NE(st.message().find("16 bytes"), std::string::npos) << st;
}

// Found by review while writing fuzz_wire (which checks it): a count whose byte size
// wraps around 2^64 to the frame's size was accepted, and fp16 decoding then wrote
// 2^63 values.
TEST(WireTest, PayloadCountWhoseByteSizeOverflowsIsRejected) {
  float out[4] = {};
  EXPECT_EQ(DecodeValues(Frame(), DType::kF32, uint64_t{1} << 62, out).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeValues(Frame(), DType::kF16, uint64_t{1} << 63, out).code(),
            StatusCode::kInvalidArgument);
  std::vector<float> two = {1.f, 2.f};
  Frame f = EncodeValues(two, DType::kBF16);  // 4 bytes
  EXPECT_EQ(DecodeValues(f, DType::kBF16, (uint64_t{1} << 63) + 2, out).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(DecodeValues(f, DType::kBF16, 2, out).ok());
  EXPECT_EQ(out[1], 2.f);
}

// Found by fuzz_wire (UBSan): a Pull whose key vector is 4-byte but not 8-byte aligned
// passes FlatBuffers verification, and reading its keys was a misaligned 8-byte load.
TEST(WireTest, MisalignedKeyVectorIsRejected) {
  const std::vector<uint8_t> bytes = {
      0x14, 0x00, 0x00, 0x00, 0x4c, 0x53, 0x48, 0x31, 0x0c, 0x00, 0x14, 0x00, 0x06, 0x00,
      0x0c, 0x00, 0x05, 0x00, 0x08, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x00, 0x05, 0x01, 0x00,
      0x1c, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00,
      0x22, 0x00, 0x00, 0x00, 0x08, 0x00, 0x10, 0x00, 0x00, 0x00, 0x0c, 0x00, 0x07, 0x00,
      0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x04, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x13, 0x13, 0x13, 0x00, 0x00, 0x00};
  Message m{Frame::Copy(bytes.data(), bytes.size())};
  auto env = VerifyEnvelope(m);
  ASSERT_TRUE(env.ok()) << env.status();
  const wire::Pull* pull = (*env)->body_as_Pull();
  ASSERT_NE(pull, nullptr);
  ASSERT_NE(pull->rows()->keys(), nullptr);
  auto r = DecodeRequest(m);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("misaligned"), std::string::npos) << r.status();
}

TEST(WireTest, KeyListsOverTheLimitAreResourceExhausted) {
  Message m = MakePull(1, 0, Rows::Keys({1, 5}), 7, 0, 0);
  EXPECT_TRUE(DecodeRequest(m).ok());
  WireLimits limits;
  limits.max_keys = 1;
  auto r = DecodeRequest(m, limits);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("2 keys"), std::string::npos) << r.status();
}

TEST(WireTest, RequestsOutsideTheEnumsOrWithStrayFramesAreRejected) {
  // A pull asking for dtype 7 and a table spec naming optimizer 9 and initializer 8.
  flatbuffers::FlatBufferBuilder a;
  auto rows = wire::CreateRowSet(a, 0, 1);
  a.Finish(wire::CreateEnvelope(
               a, kProtocolVersion, 1, wire::Body::Pull,
               wire::CreatePull(a, 0, rows, 1, 0, 0, static_cast<wire::DType>(7)).Union()),
           wire::EnvelopeIdentifier());
  auto r = DecodeRequest(Message{Frame::Copy(a.GetBufferPointer(), a.GetSize())});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("dtype"), std::string::npos) << r.status();
  for (int which = 0; which < 2; ++which) {
    flatbuffers::FlatBufferBuilder b;
    auto name = b.CreateString("t");
    auto opt = wire::CreateOptimizerSpec(b, static_cast<wire::OptimizerKind>(which == 0 ? 9 : 0));
    auto init = wire::CreateInitSpec(b, static_cast<wire::InitKind>(which == 1 ? 8 : 0));
    auto spec = wire::CreateTableSpec(b, name, 1, 1, opt, init);
    b.Finish(wire::CreateEnvelope(b, kProtocolVersion, 2, wire::Body::CreateTable,
                                  wire::CreateCreateTable(b, spec).Union()),
             wire::EnvelopeIdentifier());
    auto c = DecodeRequest(Message{Frame::Copy(b.GetBufferPointer(), b.GetSize())});
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(which == 0 ? "unknown optimizer" : "unknown initializer"),
              std::string::npos)
        << c.status();
  }
  Message clock = MakeClock(3, 7, 1);
  clock.push_back(Frame::Copy("x", 1));
  auto d = DecodeRequest(clock);
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("carries no payload frames, got 1"), std::string::npos)
      << d.status();
  auto e = DecodeRequest(EncodeReply(4, ClockReply{3}));
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("does not accept ClockReply"), std::string::npos)
      << e.status();
  EXPECT_FALSE(DecodeReply(MakeClock(5, 7, 1)).ok()) << "a request is no reply";
}

// Encodes `request` and decodes it again.
Request RoundTrip(const Request& request, uint64_t rid = 11) {
  Message m = EncodeRequest(rid, request);
  auto d = DecodeRequest(m);
  EXPECT_TRUE(d.ok()) << d.status();
  if (!d.ok()) return {};
  EXPECT_EQ(d->request_id, rid);
  EXPECT_TRUE(d->payloads.empty());
  return d->value;
}

TEST(WireTest, EveryRequestRoundTrips) {
  auto reg = std::get<RegisterRequest>(RoundTrip(RegisterRequest{5, 6, "alpha"}));
  EXPECT_EQ(reg.worker_id, 5u);
  EXPECT_EQ(reg.incarnation, 6u);
  EXPECT_EQ(reg.name, "alpha");

  TableSpec spec;
  spec.name = "emb";
  spec.rows = 10;
  spec.cols = 4;
  spec.optimizer = {OptimizerKind::kAdam, 0.5f, 0.8f, 0.7f, 0.6f, 1e-6f, 0.25f};
  spec.init = {InitKind::kNormal, 0.125f, 99};
  EXPECT_EQ(std::get<CreateTableRequest>(RoundTrip(CreateTableRequest{spec})).spec, spec);

  auto pull = std::get<PullRequest>(
      RoundTrip(PullRequest{3, Rows::Keys({4, 1, 9}), 7, 12, 2, DType::kBF16}));
  EXPECT_EQ(pull.table_id, 3u);
  EXPECT_TRUE(pull.rows.explicit_keys);
  EXPECT_EQ(pull.rows.keys, (std::vector<uint64_t>{4, 1, 9}));
  EXPECT_EQ(pull.worker_id, 7u);
  EXPECT_EQ(pull.clock, 12);
  EXPECT_EQ(pull.staleness, 2);
  EXPECT_EQ(pull.dtype, DType::kBF16);

  Message pm =
      EncodeRequest(12, PushRequest{2, Rows::Range(3, 5), 7, 8, 9, DType::kF16, 4, 48, 192, true},
                    {EncodeValues(std::vector<float>{1, 2}, DType::kF16)});
  auto pd = DecodeRequest(pm);
  ASSERT_TRUE(pd.ok()) << pd.status();
  const auto& push = std::get<PushRequest>(pd->value);
  EXPECT_EQ(push.table_id, 2u);
  EXPECT_FALSE(push.rows.explicit_keys);
  EXPECT_EQ(push.rows.begin, 3u);
  EXPECT_EQ(push.rows.end, 5u);
  EXPECT_EQ(push.worker_id, 7u);
  EXPECT_EQ(push.incarnation, 8u);
  EXPECT_EQ(push.seq, 9u);
  EXPECT_EQ(push.dtype, DType::kF16);
  EXPECT_EQ(push.clock_after, 4);
  EXPECT_EQ(push.samples, 48u);
  EXPECT_EQ(push.global_batch, 192u);
  EXPECT_TRUE(push.clock_step);
  ASSERT_EQ(pd->payloads.size(), 1u);
  EXPECT_EQ(pd->payloads[0].data(), pm[1].data())
      << "the payload is the message's frame, not a copy";

  auto clock = std::get<ClockRequest>(RoundTrip(ClockRequest{7, 13}));
  EXPECT_EQ(clock.worker_id, 7u);
  EXPECT_EQ(clock.clock, 13);
  auto hb = std::get<HeartbeatRequest>(RoundTrip(HeartbeatRequest{7, 8}));
  EXPECT_EQ(hb.worker_id, 7u);
  EXPECT_EQ(hb.incarnation, 8u);
  auto leave = std::get<LeaveRequest>(RoundTrip(LeaveRequest{7, 8}));
  EXPECT_EQ(leave.worker_id, 7u);
  EXPECT_EQ(leave.incarnation, 8u);
  EXPECT_TRUE(std::holds_alternative<CheckpointRequest>(RoundTrip(CheckpointRequest{})));
  EXPECT_TRUE(std::holds_alternative<StatsRequest>(RoundTrip(StatsRequest{})));

  ChunkRequest cr;
  cr.worker_id = 7;
  cr.incarnation = 8;
  cr.plan = {60000, 1000, 3, 42};
  auto c1 = std::get<ChunkRequest>(RoundTrip(cr));
  EXPECT_EQ(c1.plan, cr.plan);
  EXPECT_FALSE(c1.done.has_value());
  cr.done = ChunkDone{1, 17};
  auto c2 = std::get<ChunkRequest>(RoundTrip(cr));
  EXPECT_EQ(c2.worker_id, 7u);
  EXPECT_EQ(c2.incarnation, 8u);
  ASSERT_TRUE(c2.done.has_value());
  EXPECT_EQ(*c2.done, (ChunkDone{1, 17}));
  EXPECT_EQ(c2.samples_per_second, 0.f);
  cr.samples_per_second = 4100.5f;
  cr.others_samples_per_second = 23000.f;
  auto c3 = std::get<ChunkRequest>(RoundTrip(cr));
  EXPECT_EQ(c3.samples_per_second, 4100.5f);
  EXPECT_EQ(c3.others_samples_per_second, 23000.f);
}

// Encodes `reply` and decodes it again.
Reply RoundTrip(const Reply& reply) {
  Message m = EncodeReply(21, reply);
  auto d = DecodeReply(m);
  EXPECT_TRUE(d.ok()) << d.status();
  if (!d.ok()) return {};
  EXPECT_EQ(d->request_id, 21u);
  return d->value;
}

TEST(WireTest, EveryReplyRoundTrips) {
  auto w = std::get<Welcome>(RoundTrip(Welcome{1, 3, 17, 5000, 12, 0xabcdef, 1 << 20}));
  EXPECT_EQ(w.shard, 1u);
  EXPECT_EQ(w.num_shards, 3u);
  EXPECT_EQ(w.start_clock, 17);
  EXPECT_EQ(w.lease_ms, 5000u);
  EXPECT_EQ(w.recovered_clock, 12);
  EXPECT_EQ(w.boot_id, 0xabcdefu);
  EXPECT_EQ(w.max_message_bytes, 1u << 20);
  auto tc = std::get<TableCreated>(RoundTrip(TableCreated{4, true}));
  EXPECT_EQ(tc.table_id, 4u);
  EXPECT_TRUE(tc.created);
  auto pr = std::get<PullReply>(RoundTrip(PullReply{2, 10, 4, DType::kF16, 9}));
  EXPECT_EQ(pr.table_id, 2u);
  EXPECT_EQ(pr.num_rows, 10u);
  EXPECT_EQ(pr.cols, 4u);
  EXPECT_EQ(pr.dtype, DType::kF16);
  EXPECT_EQ(pr.min_clock, 9);
  auto push = std::get<PushReply>(RoundTrip(PushReply{true, 3}));
  EXPECT_TRUE(push.applied);
  EXPECT_EQ(push.skipped_rows, 3u);
  EXPECT_EQ(std::get<ClockReply>(RoundTrip(ClockReply{8})).min_clock, 8);
  auto hb = std::get<HeartbeatReply>(RoundTrip(HeartbeatReply{8, 99}));
  EXPECT_EQ(hb.min_clock, 8);
  EXPECT_EQ(hb.boot_id, 99u);
  EXPECT_TRUE(std::holds_alternative<LeaveReply>(RoundTrip(LeaveReply{})));
  EXPECT_EQ(std::get<CheckpointReply>(RoundTrip(CheckpointReply{6})).clock, 6);

  ShardStats st;
  st.shard = 1;
  st.num_shards = 2;
  st.min_clock = 5;
  st.parked_pulls = 3;
  st.pushes_applied = 40;
  st.pulls_served = 41;
  st.errors = 2;
  st.last_snapshot_clock = 4;
  st.recovered_clock = 1;
  st.snapshot_age_ms = 1500;
  st.coverage = {1, 3, 7, 10, 2};
  st.workers = {{7, 8, "w7", 5, 20}, {9, 1, "", 6, 0}};
  st.tables = {{0, "emb", 100, 8, 50}};
  st.replicas = 3;
  st.log_index = 90;
  st.commit_index = 80;
  st.backups = {{1, true, 90, 0, 0, 0, 12}, {2, false, 70, 20, 81920, 1500, -1}};
  st.durable_log = DurableLogMode::kFsync;
  st.durable_log_bytes = 1u << 20;
  st.durable_log_failed = true;
  auto s = std::get<ShardStats>(RoundTrip(st));
  EXPECT_EQ(s.replicas, 3u);
  EXPECT_EQ(s.durable_log, DurableLogMode::kFsync);
  EXPECT_EQ(s.durable_log_bytes, 1u << 20);
  EXPECT_TRUE(s.durable_log_failed);
  EXPECT_EQ(s.log_index, 90u);
  EXPECT_EQ(s.commit_index, 80u);
  ASSERT_EQ(s.backups.size(), 2u);
  EXPECT_EQ(s.backups[0].replica, 1u);
  EXPECT_TRUE(s.backups[0].in_sync);
  EXPECT_EQ(s.backups[0].ms_since_ack, 12);
  EXPECT_EQ(s.backups[1].replica, 2u);
  EXPECT_FALSE(s.backups[1].in_sync);
  EXPECT_EQ(s.backups[1].match_index, 70u);
  EXPECT_EQ(s.backups[1].entries_behind, 20u);
  EXPECT_EQ(s.backups[1].bytes_behind, 81920u);
  EXPECT_EQ(s.backups[1].ms_behind, 1500);
  EXPECT_EQ(s.backups[1].ms_since_ack, -1);
  EXPECT_EQ(s.shard, 1u);
  EXPECT_EQ(s.num_shards, 2u);
  EXPECT_EQ(s.min_clock, 5);
  EXPECT_EQ(s.parked_pulls, 3u);
  EXPECT_EQ(s.pushes_applied, 40u);
  EXPECT_EQ(s.pulls_served, 41u);
  EXPECT_EQ(s.errors, 2u);
  EXPECT_EQ(s.last_snapshot_clock, 4);
  EXPECT_EQ(s.recovered_clock, 1);
  EXPECT_EQ(s.snapshot_age_ms, 1500);
  EXPECT_EQ(s.coverage, st.coverage);
  ASSERT_EQ(s.workers.size(), 2u);
  EXPECT_EQ(s.workers[0].id, 7u);
  EXPECT_EQ(s.workers[0].incarnation, 8u);
  EXPECT_EQ(s.workers[0].name, "w7");
  EXPECT_EQ(s.workers[0].clock, 5);
  EXPECT_EQ(s.workers[0].ms_since_heartbeat, 20u);
  EXPECT_EQ(s.workers[1].id, 9u);
  ASSERT_EQ(s.tables.size(), 1u);
  EXPECT_EQ(s.tables[0].table_id, 0u);
  EXPECT_EQ(s.tables[0].name, "emb");
  EXPECT_EQ(s.tables[0].rows, 100u);
  EXPECT_EQ(s.tables[0].cols, 8u);
  EXPECT_EQ(s.tables[0].local_rows, 50u);

  ChunkGrant g{ChunkGrant::Kind::kChunk, 1, 7, 7000, 8000, 1, 3, 10};
  EXPECT_EQ(std::get<ChunkGrant>(RoundTrip(g)), g);
  g.kind = ChunkGrant::Kind::kFinished;
  EXPECT_EQ(std::get<ChunkGrant>(RoundTrip(g)), g);
  auto e = std::get<ErrorReply>(RoundTrip(ErrorReply{NotRegistered("who?"), 5}));
  EXPECT_EQ(e.status.code(), StatusCode::kNotRegistered);
  EXPECT_EQ(e.status.message(), "who?");
  EXPECT_EQ(e.boot_id, 5u);
}

TEST(WireTest, PullReplyPayloadsAreTheMessagesFrames) {
  Message m = EncodeReply(3, PullReply{0, 1, 2, DType::kF32, 0},
                          {EncodeValues(std::vector<float>{1, 2}, DType::kF32)});
  auto d = DecodeReply(m);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->payloads.size(), 1u);
  EXPECT_EQ(d->payloads[0].data(), m[1].data());
}

// The snapshot store keeps a table spec as these bytes: they must not change, or data
// directories of earlier releases would no longer recover.
TEST(WireTest, TableSpecBytesRoundTripAndMatchTheSchema) {
  TableSpec spec;
  spec.name = "w";
  spec.rows = 4;
  spec.cols = 3;
  spec.optimizer.kind = OptimizerKind::kMomentum;
  spec.optimizer.lr = 0.5f;
  spec.init = {InitKind::kUniform, 0.25f, 7};
  std::vector<uint8_t> bytes = EncodeTableSpec(spec);
  flatbuffers::FlatBufferBuilder fbb(128);
  auto name = fbb.CreateString("w");
  auto opt = wire::CreateOptimizerSpec(fbb, wire::OptimizerKind::Momentum, 0.5f, 0.9f, 0.9f, 0.999f,
                                       1e-8f, 0.f);
  auto init = wire::CreateInitSpec(fbb, wire::InitKind::Uniform, 0.25f, 7);
  fbb.Finish(wire::CreateTableSpec(fbb, name, 4, 3, opt, init));
  EXPECT_EQ(bytes,
            std::vector<uint8_t>(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()));
  auto back = DecodeTableSpec(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, spec);
  bytes.resize(bytes.size() / 2);
  EXPECT_EQ(DecodeTableSpec(bytes).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(DecodeTableSpec({}).status().code(), StatusCode::kDataLoss);
}

TEST(WireTest, BatchesCarryTheirMessagesInOrder) {
  std::vector<float> g = {1, 2, 3};
  Message push = MakePush(8, 1, Range(0, 1), 7, 1, 5, DType::kF32, EncodeValues(g, DType::kF32));
  Message pull = MakePull(9, 2, Range(0, 5), 7, 3, 1);
  Message clock = MakeClock(10, 7, 4);
  EXPECT_FALSE(IsBatch(push));
  Message batch = PackBatch({push, pull, clock});
  EXPECT_TRUE(IsBatch(batch));
  EXPECT_FALSE(DecodeRequest(batch).ok()) << "a batch header is no envelope";
  ASSERT_EQ(batch.size(), 1u + 2 + 1 + 1);
  auto parts = UnpackBatch(batch);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 3u);
  const std::vector<uint64_t> rids = {8, 9, 10};
  for (size_t i = 0; i < 3; ++i) {
    auto d = DecodeRequest((*parts)[i]);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->request_id, rids[i]);
  }
  ASSERT_EQ((*parts)[0].size(), 2u);
  EXPECT_EQ((*parts)[0][1].data(), push[1].data()) << "frames are shared, not copied";
}

TEST(WireTest, MalformedBatchesAreRejectedSayingWhy) {
  Message a = MakeClock(1, 7, 4), b = MakeClock(2, 7, 5);
  Message good = PackBatch({a, b});
  auto with_head = [&](std::vector<uint8_t> head) {
    Message m = good;
    m[0] = Frame::Copy(head.data(), head.size());
    return m;
  };
  std::vector<uint8_t> head(good[0].data(), good[0].data() + good[0].size());
  auto count = [&](uint32_t n) {
    std::vector<uint8_t> h = head;
    std::memcpy(h.data() + 8, &n, 4);
    return h;
  };
  auto frames = [&](uint32_t first, uint32_t second) {
    std::vector<uint8_t> h = head;
    std::memcpy(h.data() + 12, &first, 4);
    std::memcpy(h.data() + 16, &second, 4);
    return h;
  };
  const std::vector<std::pair<Message, std::string>> bad = {
      {with_head(std::vector<uint8_t>(head.begin(), head.begin() + 10)), "truncated"},
      {with_head(count(0)), "1 to"},
      {with_head(count(kMaxBatchMessages + 1)), "1 to"},
      {with_head(count(3)), "expected"},
      {with_head(frames(0, 2)), "no frames"},
      {with_head(frames(1, 5)), "only 1 follow"},
      {with_head(frames(1, 0)), "no frames"},
      {[&] {
         Message m = good;
         m.push_back(Frame::Copy("x", 1));
         return m;
       }(),
       "beyond"},
  };
  for (const auto& [m, why] : bad) {
    auto r = UnpackBatch(m);
    ASSERT_FALSE(r.ok()) << why;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status();
  }
  EXPECT_FALSE(UnpackBatch(a).ok()) << "a plain message is no batch";
  EXPECT_TRUE(UnpackBatch(good).ok());
}

TEST(WireTest, ParsesDtypeNames) {
  EXPECT_EQ(*ParseDType("fp16"), DType::kF16);
  EXPECT_EQ(*ParseDType("bf16"), DType::kBF16);
  EXPECT_EQ(*ParseDType("fp32"), DType::kF32);
  EXPECT_FALSE(ParseDType("int8").ok());
}

TEST(WireTest, SnapshotChunksAndTheirAcknowledgementsRoundTrip) {
  ReplSnapshotMsg m;
  m.term = 3;
  m.primary = 1;
  m.index = 40;
  m.transfer = 77;
  m.chunk = 5;
  m.last = true;
  m.part = ReplSnapshotMsg::kBytes;
  m.part_id = 2;
  m.offset = 4096;
  const std::vector<uint8_t> bytes = {1, 2, 3, 4, 5};
  // The decoded payloads view the message's frames: the message must outlive them.
  const Message encoded = EncodeReplication(m, {Frame::Copy(bytes.data(), bytes.size())});
  auto d = DecodeReplication(encoded);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const auto& got = std::get<ReplSnapshotMsg>(d->value);
  EXPECT_EQ(got.transfer, 77u);
  EXPECT_EQ(got.chunk, 5u);
  EXPECT_TRUE(got.last);
  EXPECT_EQ(got.part, ReplSnapshotMsg::kBytes);
  EXPECT_EQ(got.part_id, 2u);
  EXPECT_EQ(got.offset, 4096u);
  ASSERT_EQ(d->payloads.size(), 1u);
  EXPECT_EQ(d->payloads[0].size(), bytes.size());
  // A data chunk without its frame, or a header with one, is malformed.
  EXPECT_FALSE(DecodeReplication(EncodeReplication(m, {})).ok());
  ReplSnapshotMsg header;
  header.transfer = 77;
  EXPECT_TRUE(DecodeReplication(EncodeReplication(header, {})).ok());
  // A table's pending clock steps travel with its header (none: an empty list).
  header.tables.push_back({0, {}, 0, 8, 4, 3, 12, 0, {-1, 12}});
  header.tables.push_back({1, {}, 0, 8, 4, 1, 5, 0, {}});
  auto dh = DecodeReplication(EncodeReplication(header, {}));
  ASSERT_TRUE(dh.ok()) << dh.status().ToString();
  const auto& gh = std::get<ReplSnapshotMsg>(dh->value);
  ASSERT_EQ(gh.tables.size(), 2u);
  EXPECT_EQ(gh.tables[0].pending_clocks, (std::vector<int64_t>{-1, 12}));
  EXPECT_EQ(gh.tables[0].slots, 3u);
  EXPECT_TRUE(gh.tables[1].pending_clocks.empty());
  header.tables.clear();
  EXPECT_FALSE(DecodeReplication(EncodeReplication(header, {Frame::Copy("x")})).ok());

  ReplAckMsg a{3, 2, false, 9, true, 11, 77, 6};
  auto da = DecodeReplication(EncodeReplication(a));
  ASSERT_TRUE(da.ok());
  const auto& ga = std::get<ReplAckMsg>(da->value);
  EXPECT_EQ(ga.transfer, 77u);
  EXPECT_EQ(ga.chunk, 6u);
  EXPECT_FALSE(ga.ok);
  EXPECT_TRUE(ga.needs_snapshot);
  EXPECT_TRUE(ga.answered.empty());
  // The entries a backup answers itself travel with its acknowledgement.
  a.answered = {4, 5, 9};
  auto dn = DecodeReplication(EncodeReplication(a));
  ASSERT_TRUE(dn.ok());
  EXPECT_EQ(std::get<ReplAckMsg>(dn->value).answered, (std::vector<uint64_t>{4, 5, 9}));
}

}  // namespace
}  // namespace leash

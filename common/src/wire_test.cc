// Tests of message verification and payload encoding: everything malformed is rejected
// with a clear error.
#include "leash/common/wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

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
  EXPECT_EQ(VerifyEnvelope(Message{Frame::Copy("abc")}).status().code(), StatusCode::kInvalidArgument);
  auto st = VerifyEnvelope(Message{Frame::Copy("this is not a flatbuffer at all")}).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("LSH1"), std::string::npos) << st;
}

TEST(WireTest, EveryTruncationIsRejectedOrReadsTheSameRequest) {
  Message m = MakeCreateTable(1, TableSpecArgs{.name = "embedding", .rows = 10, .cols = 4});
  const Frame& h = m[0];
  int rejected = 0;
  for (size_t cut = 0; cut < h.size(); ++cut) {
    Message truncated{Frame::Copy(h.data(), cut)};  // must outlive the envelope read from it
    auto r = VerifyEnvelope(truncated);
    if (!r.ok()) {
      ++rejected;
      continue;
    }
    // Only trailing alignment padding may be cut: the content must be intact.
    const wire::TableSpec* spec = (*r)->body_as_CreateTable()->spec();
    EXPECT_EQ(spec->name()->str(), "embedding") << "cut at " << cut;
    EXPECT_EQ(spec->rows(), 10u);
    EXPECT_EQ(spec->cols(), 4u);
  }
  EXPECT_GE(rejected, static_cast<int>(h.size()) - 8);
}

TEST(WireTest, RandomCorruptionNeverCrashesTheVerifier) {
  Message m = MakePush(1, 0, Range(0, 2), 1, 1, 1, wire::DType::F32, EncodeValues(std::vector<float>{1, 2}, wire::DType::F32));
  std::mt19937 rng(1);
  std::vector<uint8_t> bytes(m[0].data(), m[0].data() + m[0].size());
  int rejected = 0;
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> b = bytes;
    for (int k = 0; k < 3; ++k) b[rng() % b.size()] = static_cast<uint8_t>(rng());
    Message corrupted{Frame::Own(std::move(b))};
    auto r = VerifyEnvelope(corrupted);
    if (!r.ok()) ++rejected;
    // Accepted ones must be safe to read.
    if (r.ok() && (*r)->body_type() == wire::Body::Push && (*r)->body_as_Push()->rows()) {
      (void)ReadRows((*r)->body_as_Push()->rows(), 100);
    }
  }
  EXPECT_GT(rejected, 0);
}

TEST(WireTest, RejectsAnotherProtocolVersion) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = wire::CreateStats(fbb);
  fbb.Finish(wire::CreateEnvelope(fbb, 99, 1, wire::Body::Stats, body.Union()), wire::EnvelopeIdentifier());
  auto r = VerifyEnvelope(Message{Frame::Copy(fbb.GetBufferPointer(), fbb.GetSize())});
  EXPECT_EQ(r.status().code(), StatusCode::kVersionMismatch);
  EXPECT_NE(r.status().message().find("99"), std::string::npos);
}

TEST(WireTest, RejectsAMessageWithoutBody) {
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(wire::CreateEnvelope(fbb, kProtocolVersion, 1), wire::EnvelopeIdentifier());
  EXPECT_EQ(VerifyEnvelope(Message{Frame::Copy(fbb.GetBufferPointer(), fbb.GetSize())}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(WireTest, HeaderOverTheLimitIsResourceExhausted) {
  TableSpecArgs t{.name = std::string(5000, 'x'), .rows = 1, .cols = 1};
  WireLimits limits;
  limits.max_header_bytes = 1024;
  EXPECT_EQ(VerifyEnvelope(MakeCreateTable(1, t), limits).status().code(), StatusCode::kResourceExhausted);
}

TEST(WireTest, ErrorRepliesCarryCodeAndMessage) {
  Message m = MakeError(5, NotFound("unknown table 3"));
  auto env = VerifyEnvelope(m);
  ASSERT_TRUE(env.ok());
  EXPECT_EQ((*env)->request_id(), 5u);
  Status st = ErrorToStatus((*env)->body_as_Error());
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_EQ(st.message(), "unknown table 3");
}

TEST(WireTest, PayloadRoundTripsInEveryDtype) {
  std::vector<float> v = {0.f, 1.f, -2.5f, 3.1415926f, 1e-3f};
  for (auto dt : {wire::DType::F32, wire::DType::F16, wire::DType::BF16}) {
    Frame f = EncodeValues(v, dt);
    EXPECT_EQ(f.size(), v.size() * DTypeSize(dt));
    std::vector<float> back(v.size());
    ASSERT_TRUE(DecodeValues(f, dt, v.size(), back.data()).ok());
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_NEAR(back[i], v[i], dt == wire::DType::F32 ? 0 : std::fabs(v[i]) / 100 + 1e-6) << DTypeName(dt);
    }
  }
}

TEST(WireTest, PayloadOfTheWrongSizeIsRejectedNamingBothSizes) {
  Frame f = EncodeValues(std::vector<float>{1, 2, 3}, wire::DType::F32);
  std::vector<float> out(4);
  Status st = DecodeValues(f, wire::DType::F32, 4, out.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("12 bytes"), std::string::npos) << st;
  EXPECT_NE(st.message().find("16 bytes"), std::string::npos) << st;
}

// Found by review while writing fuzz_wire (which checks it): a count whose byte size
// wraps around 2^64 to the frame's size was accepted, and fp16 decoding then wrote
// 2^63 values.
TEST(WireTest, PayloadCountWhoseByteSizeOverflowsIsRejected) {
  float out[4] = {};
  EXPECT_EQ(DecodeValues(Frame(), wire::DType::F32, uint64_t{1} << 62, out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeValues(Frame(), wire::DType::F16, uint64_t{1} << 63, out).code(), StatusCode::kInvalidArgument);
  std::vector<float> two = {1.f, 2.f};
  Frame f = EncodeValues(two, wire::DType::BF16);  // 4 bytes
  EXPECT_EQ(DecodeValues(f, wire::DType::BF16, (uint64_t{1} << 63) + 2, out).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(DecodeValues(f, wire::DType::BF16, 2, out).ok());
  EXPECT_EQ(out[1], 2.f);
}

// Found by fuzz_wire (UBSan): a Pull whose key vector is 4-byte but not 8-byte aligned
// passes FlatBuffers verification, and reading its keys was a misaligned 8-byte load.
TEST(WireTest, MisalignedKeyVectorIsRejected) {
  const std::vector<uint8_t> bytes = {
      0x14, 0x00, 0x00, 0x00, 0x4c, 0x53, 0x48, 0x31, 0x0c, 0x00, 0x14, 0x00, 0x06, 0x00, 0x0c, 0x00,
      0x05, 0x00, 0x08, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x00, 0x05, 0x01, 0x00, 0x1c, 0x00, 0x00, 0x00,
      0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x22, 0x00, 0x00, 0x00, 0x08, 0x00,
      0x10, 0x00, 0x00, 0x00, 0x0c, 0x00, 0x07, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00,
      0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00,
      0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x13, 0x13, 0x13, 0x00, 0x00, 0x00};
  Message m{Frame::Copy(bytes.data(), bytes.size())};
  auto env = VerifyEnvelope(m);
  ASSERT_TRUE(env.ok()) << env.status();
  const wire::Pull* pull = (*env)->body_as_Pull();
  ASSERT_NE(pull, nullptr);
  ASSERT_NE(pull->rows()->keys(), nullptr);
  auto rows = ReadRows(pull->rows(), UINT64_MAX);
  EXPECT_EQ(rows.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rows.status().message().find("misaligned"), std::string::npos) << rows.status();
}

TEST(WireTest, RowSetsAreCheckedAgainstTheTable) {
  flatbuffers::FlatBufferBuilder fbb;
  Rows keys;
  keys.explicit_keys = true;
  keys.keys = {1, 5};
  fbb.Finish(BuildRows(fbb, keys));
  auto* rs = flatbuffers::GetRoot<wire::RowSet>(fbb.GetBufferPointer());
  EXPECT_TRUE(ReadRows(rs, 6).ok());
  EXPECT_EQ(ReadRows(rs, 5).status().code(), StatusCode::kInvalidArgument);
  WireLimits limits;
  limits.max_keys = 1;
  EXPECT_EQ(ReadRows(rs, 6, limits).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ReadRows(nullptr, 6).status().code(), StatusCode::kInvalidArgument);
}

TEST(WireTest, BatchesCarryTheirMessagesInOrder) {
  std::vector<float> g = {1, 2, 3};
  Message push = MakePush(8, 1, Range(0, 1), 7, 1, 5, wire::DType::F32, EncodeValues(g, wire::DType::F32));
  Message pull = MakePull(9, 2, Range(0, 5), 7, 3, 1);
  Message clock = MakeClock(10, 7, 4);
  EXPECT_FALSE(IsBatch(push));
  Message batch = PackBatch({push, pull, clock});
  EXPECT_TRUE(IsBatch(batch));
  EXPECT_FALSE(VerifyEnvelope(batch).ok()) << "a batch header is no envelope";
  ASSERT_EQ(batch.size(), 1u + 2 + 1 + 1);
  auto parts = UnpackBatch(batch);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 3u);
  const std::vector<uint64_t> rids = {8, 9, 10};
  for (size_t i = 0; i < 3; ++i) {
    auto env = VerifyEnvelope((*parts)[i]);
    ASSERT_TRUE(env.ok()) << env.status();
    EXPECT_EQ((*env)->request_id(), rids[i]);
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
      {[&] { Message m = good; m.push_back(Frame::Copy("x", 1)); return m; }(), "beyond"},
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

}  // namespace
}  // namespace leash

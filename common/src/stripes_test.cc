// Unit tests of striping's arithmetic (stripes.h): routing ids, splitting, and putting
// messages back together in order, with parts reordered, missing, duplicated or forged.
#include "stripes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>

namespace leash::stripes {
namespace {

Frame Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 31 + i / 7);
  return Frame::Own(std::move(v));
}

bool Same(const Message& a, const Message& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size()) != 0)
      return false;
  }
  return true;
}

TEST(StripesTest, RoutingIdsRoundTripAndOtherIdsAreNotTaken) {
  const std::string id = RoutingId(0x1122334455667788ull, 2, 4);
  ASSERT_EQ(id.size(), 14u);
  EXPECT_NE(id[0], '\0') << "ZeroMQ reserves ids starting with a zero byte";
  auto r = ParseRoutingId(id);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->token, 0x1122334455667788ull);
  EXPECT_EQ(r->index, 2u);
  EXPECT_EQ(r->count, 4u);
  EXPECT_FALSE(ParseRoutingId(std::string("\0\x8b\x45\x67\x10", 5))) << "ZeroMQ's own ids";
  EXPECT_FALSE(ParseRoutingId(RoutingId(1, 4, 4))) << "index past the count";
  EXPECT_FALSE(ParseRoutingId(RoutingId(1, 0, 1))) << "one connection is not striping";
  EXPECT_FALSE(ParseRoutingId(RoutingId(1, 0, kMaxStripes + 1)));
}

TEST(StripesTest, SplitCoversEveryByteOnceWithoutCopyingThePayload) {
  Message m = {Frame::Copy("header"), Pattern(1000, 1), Frame(), Pattern(333, 2)};
  const uint64_t total = 6 + 1000 + 333;
  for (uint32_t count : {2u, 3u, 7u}) {
    std::vector<Message> parts = Split(m, 9, count);
    ASSERT_EQ(parts.size(), count);
    uint64_t carried = 0;
    for (const Message& p : parts) {
      ASSERT_FALSE(p.empty());
      EXPECT_TRUE(IsPart(p[0]));
      for (size_t i = 1; i < p.size(); ++i) {
        carried += p[i].size();
        // Slices point into the message's own frames.
        bool inside = false;
        for (const Frame& f : m) {
          inside |= f.size() > 0 && p[i].data() >= f.data() && p[i].data() < f.data() + f.size();
        }
        EXPECT_TRUE(inside);
      }
    }
    EXPECT_EQ(carried, total) << count << " parts";
  }
  EXPECT_FALSE(IsPart(Frame::Copy("header")));
}

// Every order of arrival (part 0 first, last, or between) gives back the same message, with
// its frames aligned for FlatBuffers and floats.
TEST(StripesTest, PartsInAnyOrderGiveTheMessageBack) {
  Message m = {Frame::Copy("hdr"), Pattern(100'001, 3), Pattern(17, 4)};
  std::vector<Message> parts = Split(m, 0, 4);
  std::vector<uint32_t> order = {0, 1, 2, 3};
  std::mt19937 rng(7);
  for (int trial = 0; trial < 12; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    Assembler a(1 << 30, 1000);
    for (uint32_t k : order) {
      EXPECT_FALSE(a.Pop(0)) << "incomplete";
      Status st = k == 0 ? a.OnMain(parts[0], 0) : a.OnPart(parts[k], k, 0);
      ASSERT_TRUE(st.ok()) << st;
    }
    std::optional<Message> out = a.Pop(0);
    ASSERT_TRUE(out);
    EXPECT_TRUE(Same(*out, m));
    for (const Frame& f : *out) EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data()) % 8, 0u);
    EXPECT_TRUE(a.idle());
    EXPECT_EQ(a.held_bytes(), 0u);
  }
}

Frame Floats(size_t n, float seed) {
  std::vector<uint8_t> v(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) {
    const float x = seed + static_cast<float>(i % 1009) * 0.25f;
    std::memcpy(v.data() + i * sizeof(float), &x, sizeof x);
  }
  return Frame::Own(std::move(v));
}

Message Assembled(const std::vector<Message>& parts, bool check_finite = true) {
  Assembler a(1 << 30, 1000, check_finite);
  for (uint32_t k = 0; k < parts.size(); ++k) {
    Status st = k == 0 ? a.OnMain(parts[k], 0) : a.OnPart(parts[k], k, 0);
    EXPECT_TRUE(st.ok()) << st;
  }
  std::optional<Message> out = a.Pop(0);
  EXPECT_TRUE(out);
  return out ? *out : Message{};
}

// Parts are cut on 64-byte multiples within the frame they cut, whatever the frames before
// it hold (an odd-sized header here), so the receiver copies every slice of a float frame
// checking it (a shard's assembler): a finite frame arrives marked finite_f32() (the shard
// then does not read it again), a frame with a NaN or an Inf anywhere, or bytes that are not
// whole floats, do not.
TEST(StripesTest, PartsAreCutOnWholeFloatsAndFiniteFramesArriveCheckedByTheCopy) {
  for (uint32_t count : {2u, 3u, 7u, 16u}) {
    Message m = {Frame::Copy("hdr"), Floats(100'003, 0.5f), Pattern(17, 4), Floats(4099, -2.f)};
    std::vector<Message> parts = Split(m, 0, count);
    for (const Message& p : parts) {
      for (size_t i = 1; i < p.size(); ++i) {
        for (const Frame& f : m) {
          if (f.size() > 0 && p[i].data() >= f.data() && p[i].data() < f.data() + f.size()) {
            EXPECT_EQ((p[i].data() - f.data()) % 64, 0) << count << " parts";
          }
        }
      }
    }
    Message out = Assembled(parts);
    ASSERT_TRUE(Same(out, m)) << count << " parts";
    EXPECT_FALSE(out[0].finite_f32()) << "3 bytes are not whole floats";
    EXPECT_TRUE(out[1].finite_f32()) << count << " parts";
    EXPECT_FALSE(out[2].finite_f32()) << "17 bytes";
    EXPECT_TRUE(out[3].finite_f32()) << count << " parts";
    // A client's assembler (replies) copies without checking: nothing is marked.
    Message plain = Assembled(parts, /*check_finite=*/false);
    ASSERT_TRUE(Same(plain, m));
    for (const Frame& f : plain) EXPECT_FALSE(f.finite_f32());
  }
  const size_t n = 100'003;
  for (size_t bad : {size_t{0}, n / 3, n / 2 + 1, n - 1}) {
    for (float value :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      Frame floats = Floats(n, 1.f);
      std::vector<uint8_t> v(floats.data(), floats.data() + floats.size());
      std::memcpy(v.data() + bad * sizeof(float), &value, sizeof value);
      Message m = {Frame::Copy("hdr"), Frame::Own(std::move(v))};
      Message out = Assembled(Split(m, 0, 3));
      ASSERT_TRUE(Same(out, m));
      EXPECT_FALSE(out[1].finite_f32()) << value << " at " << bad;
    }
  }
}

TEST(StripesTest, MessagesBehindAnIncompleteOneWaitSoTheOrderHolds) {
  Assembler a(1 << 30, 1000);
  Message big = {Frame::Copy("big"), Pattern(50'000, 5)};
  std::vector<Message> parts = Split(big, 1, 2);
  ASSERT_TRUE(a.OnMain({Frame::Copy("first")}, 0).ok());
  ASSERT_TRUE(a.OnMain(parts[0], 0).ok());
  ASSERT_TRUE(a.OnMain({Frame::Copy("third")}, 0).ok());
  auto m = a.Pop(0);
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)[0].view(), "first");
  EXPECT_FALSE(a.Pop(1)) << "'third' waits for the striped message before it";
  ASSERT_TRUE(a.OnPart(parts[1], 1, 2).ok());
  m = a.Pop(2);
  ASSERT_TRUE(m);
  EXPECT_TRUE(Same(*m, big));
  m = a.Pop(2);
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)[0].view(), "third");
  EXPECT_TRUE(a.idle());
}

TEST(StripesTest, AMessageWhosePartNeverComesIsDroppedAfterTheTimeoutAndTheStreamGoesOn) {
  Assembler a(1 << 30, 100);
  std::vector<Message> lost = Split({Frame::Copy("lost"), Pattern(10'000, 6)}, 1, 3);
  ASSERT_TRUE(a.OnMain(lost[0], 0).ok());
  ASSERT_TRUE(a.OnPart(lost[2], 2, 0).ok());  // part 1 went down with its connection
  ASSERT_TRUE(a.OnMain({Frame::Copy("next")}, 10).ok());
  EXPECT_FALSE(a.Pop(99));
  auto m = a.Pop(100);
  ASSERT_TRUE(m);
  EXPECT_EQ((*m)[0].view(), "next");
  EXPECT_EQ(a.dropped(), 1u);
  // Parts whose part 0 never came (the sender fell back to sending the message whole) go too.
  std::vector<Message> orphan = Split({Frame::Copy("orphan"), Pattern(10'000, 7)}, 2, 2);
  ASSERT_TRUE(a.OnPart(orphan[1], 1, 200).ok());
  EXPECT_GT(a.held_bytes(), 0u);
  EXPECT_FALSE(a.Pop(250));
  EXPECT_FALSE(a.Pop(300));
  EXPECT_EQ(a.held_bytes(), 0u);
  EXPECT_TRUE(a.idle());
  EXPECT_EQ(a.dropped(), 2u);
}

TEST(StripesTest, ForgedDuplicatedOrMisroutedPartsAreRefusedAndNothingIsDelivered) {
  Assembler a(1 << 30, 1000);
  Message m = {Frame::Copy("m"), Pattern(4096, 8)};
  std::vector<Message> parts = Split(m, 3, 2);
  EXPECT_FALSE(a.OnPart(parts[1], 0, 0).ok()) << "part from the main connection as a side part";
  EXPECT_FALSE(a.OnPart(parts[0], 1, 0).ok()) << "part 0 on a side connection";
  ASSERT_TRUE(a.OnPart(parts[1], 1, 0).ok());
  const size_t held = a.held_bytes();
  EXPECT_FALSE(a.OnPart(parts[1], 1, 0).ok()) << "twice";
  // A part whose payload does not match its header.
  Message shortened = parts[0];
  shortened.pop_back();
  EXPECT_FALSE(a.OnMain(shortened, 0).ok());
  // A header that claims a slice that is not its share.
  Message forged = parts[0];
  std::vector<uint8_t> head(forged[0].data(), forged[0].data() + forged[0].size());
  head[24] ^= 1;  // the offset
  forged[0] = Frame::Own(head);
  EXPECT_FALSE(a.OnMain(forged, 0).ok());
  // A header whose frame count does not match its length.
  Message miscounted = parts[0];
  std::vector<uint8_t> head2(miscounted[0].data(), miscounted[0].data() + miscounted[0].size());
  head2[40] = 5;
  miscounted[0] = Frame::Own(head2);
  EXPECT_FALSE(a.OnMain(miscounted, 0).ok());
  EXPECT_EQ(a.held_bytes(), held) << "only part 1's message holds a buffer";
  // The genuine part 0 completes the message.
  ASSERT_TRUE(a.OnMain(parts[0], 0).ok());
  std::optional<Message> out;
  while (auto next = a.Pop(0)) out = std::move(next);
  ASSERT_TRUE(out);
  EXPECT_TRUE(Same(*out, m));
}

TEST(StripesTest, PartsThatWouldPassTheHeldLimitAreDropped) {
  Assembler a(64 * 1024, 1000);
  std::vector<Message> big = Split({Frame::Copy("big"), Pattern(100'000, 9)}, 1, 2);
  EXPECT_EQ(a.OnPart(big[1], 1, 0).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(a.held_bytes(), 0u);
  EXPECT_EQ(a.dropped(), 1u);
  std::vector<Message> fits = Split({Frame::Copy("fits"), Pattern(30'000, 9)}, 2, 2);
  EXPECT_TRUE(a.OnPart(fits[1], 1, 0).ok());
}

}  // namespace
}  // namespace leash::stripes

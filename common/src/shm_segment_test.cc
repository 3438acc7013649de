// Tests of the same-host shared-memory segments and rings: a writer and a reader on two
// mappings of one real POSIX segment (as a client and a shard have), rings that reserve
// /dev/shm only as their frames need it, a full ring, reserved frames and resends,
// granules taken back from a dead reader, bad descriptors, what Open refuses, and copies out
// that learn whether a frame holds finite floats.
#include "shm_segment.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <thread>
#include <vector>

namespace leash::shm {
namespace {

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

Frame FrameOf(const std::vector<uint8_t>& v) { return Frame::Copy(v.data(), v.size()); }

bool SameBytes(const Frame& f, const std::vector<uint8_t>& v) {
  return f.size() == v.size() && std::memcmp(f.data(), v.data(), v.size()) == 0;
}

// A client's segment (allocated) and a shard's mapping of it.
struct Pair {
  std::shared_ptr<ShmSegment> client;
  std::shared_ptr<ShmSegment> shard;
};

Pair MakePair(size_t ring_bytes) {
  Pair p;
  auto c = ShmSegment::Create(ring_bytes);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return p;
  p.client = *c;
  EXPECT_TRUE(p.client->Activate().ok());
  auto s = ShmSegment::Open(p.client->name(), p.client->token());
  EXPECT_TRUE(s.ok()) << s.status();
  if (s.ok()) p.shard = *s;
  return p;
}

// Bytes of /dev/shm the segment `name` holds (its reserved pages, not its size).
size_t HeldBytes(const std::string& name) {
  struct stat st {};
  if (::stat(("/dev/shm" + name).c_str(), &st) != 0) return 0;
  return static_cast<size_t>(st.st_blocks) * 512;
}

constexpr size_t kMiB = size_t{1} << 20;

// The copy out of the ring says whether the frame holds finite floats (a shard then does not
// read a pushed gradient again to check it); a NaN anywhere, or bytes that are not whole
// floats, leave it unknown.
TEST(ShmSegmentTest, ACopyOutKnowsWhetherTheFrameHoldsFiniteFloats) {
  Pair p = MakePair(16 * kMiB);
  ASSERT_TRUE(p.shard);
  ShmWriter w(p.client, 0, 0);
  std::vector<float> grad(300'000, -0.25f);
  auto put = [&](size_t bytes) {
    auto d = w.Put(Frame::Copy(grad.data(), bytes));
    EXPECT_TRUE(d);
    auto f = p.shard->CopyOut(*d);
    EXPECT_TRUE(f.ok()) << f.status();
    EXPECT_FALSE(f->lent());
    EXPECT_EQ(std::memcmp(f->data(), grad.data(), bytes), 0);
    return f->finite_f32();
  };
  EXPECT_TRUE(put(grad.size() * 4));
  EXPECT_FALSE(put(grad.size() * 4 - 2));
  grad[123'457] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(put(grad.size() * 4));
  EXPECT_TRUE(put(123'457 * 4)) << "the Inf lies past the frame";
}

TEST(ShmSegmentTest, ARingReservesOnlyWhatItsFramesInFlightNeed) {
  Pair p = MakePair(16 * kMiB);
  ASSERT_TRUE(p.shard);
  // The header, the message queues and the state words only: a page, two queues of 256
  // slots, and 8 bytes for each of 1024 granules.
  const size_t control = ControlBytes(1024);
  EXPECT_EQ(control, 4096 + 2 * 128 * 1024 + 8192);
  EXPECT_EQ(HeldBytes(p.client->name()), control);
  ShmWriter w(p.client, 0, 0);
  EXPECT_EQ(w.reserved_bytes(), 0u);

  auto small = Bytes(100'000, 1);
  auto d1 = w.Put(FrameOf(small));
  ASSERT_TRUE(d1);
  EXPECT_EQ(w.reserved_bytes(), kMiB) << "the first frame reserves a whole MiB";
  EXPECT_EQ(p.shard->reserved(0), kMiB / kGranuleBytes) << "and declares it to the reader";
  EXPECT_EQ(HeldBytes(p.client->name()), control + kMiB);

  // A frame that does not fit beside the one in flight grows the ring: by half again, at
  // least the frame, in whole MiB.
  auto big = Bytes(3 * kMiB, 2);
  auto d2 = w.Put(FrameOf(big));
  ASSERT_TRUE(d2);
  EXPECT_EQ(w.reserved_bytes(), 4 * kMiB);
  EXPECT_EQ(HeldBytes(p.client->name()), control + 4 * kMiB);
  auto got1 = p.shard->CopyOut(*d1);
  auto got2 = p.shard->CopyOut(*d2);
  ASSERT_TRUE(got1.ok() && got2.ok()) << got1.status() << got2.status();
  EXPECT_TRUE(SameBytes(*got1, small));
  EXPECT_TRUE(SameBytes(*got2, big));

  // Read at once, frames reuse the ring's start: it grows no more.
  for (int i = 0; i < 20; ++i) {
    auto d = w.Put(FrameOf(big));
    ASSERT_TRUE(d);
    ASSERT_TRUE(p.shard->CopyOut(*d).ok());
  }
  EXPECT_EQ(w.reserved_bytes(), 4 * kMiB);

  // Held frames grow it up to its largest size, never beyond.
  std::vector<Descriptor> held;
  while (auto d = w.Put(FrameOf(big))) held.push_back(*d);
  EXPECT_EQ(held.size(), 5u) << "16 MiB hold five frames of 3 MiB";
  EXPECT_EQ(w.reserved_bytes(), 16 * kMiB);
  EXPECT_EQ(HeldBytes(p.client->name()), control + 16 * kMiB);
  EXPECT_FALSE(w.Put(FrameOf(Bytes(17 * kMiB, 0)))) << "larger than the ring";
  EXPECT_FALSE(w.TakeGrowthError()) << "a full ring is no error";
  // Ring 1 is still a hole: its writer sent nothing.
  EXPECT_EQ(p.client->reserved(1), 0u);
}

TEST(ShmSegmentTest, TheReaderRefusesFramesBeyondWhatTheWriterReserved) {
  Pair p = MakePair(16 * kMiB);
  ASSERT_TRUE(p.shard);
  ShmWriter w(p.client, 0, 0);
  auto d = w.Put(FrameOf(Bytes(100'000, 1)));
  ASSERT_TRUE(d);
  ASSERT_EQ(p.shard->reserved(0), kMiB / kGranuleBytes);
  // A writer that stamps granules it never reserved (holes a read may fault on).
  Descriptor beyond = *d;
  beyond.offset = 8 * kMiB;
  for (uint32_t g = 0; g < 7; ++g)
    p.client->states(0)[beyond.offset / kGranuleBytes + g].store(d->generation);
  auto r = p.shard->CopyOut(beyond);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(p.shard->CopyOut(*d).ok());
}

TEST(ShmSegmentTest, ARingThatCannotGrowKeepsItsFramesAndSaysWhyOnce) {
  Pair p = MakePair(16 * kMiB);
  ASSERT_TRUE(p.shard);
  ShmWriter w(p.shard, 1, 0);  // a shard's replies
  auto first = Bytes(600'000, 1);
  auto d = w.Put(FrameOf(first));
  ASSERT_TRUE(d);
  // The client is gone (its segment's name with it): the shard cannot reserve more.
  p.client->Unlink();
  EXPECT_FALSE(w.Put(FrameOf(Bytes(2 * kMiB, 2))));
  std::optional<Status> why = w.TakeGrowthError();
  ASSERT_TRUE(why);
  EXPECT_EQ(why->code(), StatusCode::kIOError) << *why;
  EXPECT_FALSE(w.TakeGrowthError()) << "said once";
  EXPECT_EQ(w.reserved_bytes(), kMiB) << "the ring is as it was";
  EXPECT_TRUE(w.Put(FrameOf(Bytes(300'000, 3)))) << "what fits still goes";
  EXPECT_FALSE(w.Put(FrameOf(Bytes(2 * kMiB, 2))));
  EXPECT_FALSE(w.TakeGrowthError()) << "no second try within 5 s";
  auto got = p.client->Borrow(p.client, *d);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameBytes(*got, first));
}

TEST(ShmSegmentTest, FramesCrossBetweenTwoMappingsInBothDirections) {
  Pair p = MakePair(1 << 20);
  ASSERT_TRUE(p.shard);
  EXPECT_EQ(p.shard->granules(), p.client->granules());
  EXPECT_TRUE(p.shard->ready());
  ShmWriter to_shard(p.client, 0, 0);
  ShmWriter to_client(p.shard, 1, 0);
  auto up = Bytes(100'000, 3), down = Bytes(40'000, 9);
  auto d_up = to_shard.Put(FrameOf(up));
  auto d_down = to_client.Put(FrameOf(down));
  ASSERT_TRUE(d_up && d_down);
  EXPECT_EQ(d_up->ring, 0u);
  EXPECT_EQ(d_down->ring, 1u);
  auto got_up = p.shard->CopyOut(*d_up);
  ASSERT_TRUE(got_up.ok()) << got_up.status();
  EXPECT_TRUE(SameBytes(*got_up, up));
  auto got_down = p.client->Borrow(p.client, *d_down);
  ASSERT_TRUE(got_down.ok()) << got_down.status();
  EXPECT_TRUE(SameBytes(*got_down, down));
  // A copied-out frame was given back at once: reading it again fails.
  EXPECT_FALSE(p.shard->CopyOut(*d_up).ok());
}

TEST(ShmSegmentTest, AFullRingRefusesUntilTheReaderGivesGranulesBack) {
  Pair p = MakePair(4 * kGranuleBytes);  // the smallest ring: 4 granules
  ASSERT_TRUE(p.shard);
  ShmWriter w(p.client, 0, 0);
  auto big = Bytes(3 * kGranuleBytes, 1);
  auto d1 = w.Put(FrameOf(big));
  ASSERT_TRUE(d1);
  EXPECT_FALSE(w.Put(FrameOf(big))) << "3 of 4 granules are taken";
  auto small = Bytes(kGranuleBytes, 2);
  auto d2 = w.Put(FrameOf(small));
  ASSERT_TRUE(d2);
  EXPECT_FALSE(w.Put(FrameOf(small)));
  ASSERT_TRUE(p.shard->CopyOut(*d1).ok());
  auto d3 = w.Put(FrameOf(big));
  ASSERT_TRUE(d3) << "room again once the reader gave the first frame back";
  auto got = p.shard->CopyOut(*d3);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(SameBytes(*got, big));
  // Larger than the whole ring: never.
  EXPECT_FALSE(w.Put(FrameOf(Bytes(5 * kGranuleBytes, 0))));
}

TEST(ShmSegmentTest, AReservedFrameIsReadOnEverySendAndHeldUntilDestroyed) {
  Pair p = MakePair(4 * kGranuleBytes);
  ASSERT_TRUE(p.shard);
  ShmWriter w(p.client, 0, 0);
  auto content = Bytes(2 * kGranuleBytes, 5);
  {
    auto f = w.Reserve(content.size());
    ASSERT_TRUE(f);
    std::memcpy(const_cast<uint8_t*>(f->data()), content.data(), content.size());
    auto first = w.Stamp(*f);
    ASSERT_TRUE(first);
    auto got = p.shard->CopyOut(*first);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(SameBytes(*got, content));
    // Given back by the reader, but the frame still lives: its granules stay taken.
    EXPECT_FALSE(w.Put(FrameOf(Bytes(3 * kGranuleBytes, 0))));
    auto resend = w.Stamp(*f);  // a resend of the same request
    ASSERT_TRUE(resend);
    EXPECT_NE(resend->generation, first->generation);
    EXPECT_FALSE(p.shard->CopyOut(*first).ok()) << "the old stamp is void";
    auto again = p.shard->CopyOut(*resend);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(SameBytes(*again, content));
    // A frame from elsewhere is not the writer's.
    EXPECT_FALSE(w.Stamp(FrameOf(content)));
  }
  EXPECT_TRUE(w.Put(FrameOf(Bytes(4 * kGranuleBytes, 0))))
      << "the whole ring is free once the frame is gone";
}

TEST(ShmSegmentTest, ABorrowedFrameGivesItsGranulesBackWhenDestroyed) {
  Pair p = MakePair(4 * kGranuleBytes);
  ASSERT_TRUE(p.shard);
  ShmWriter w(p.shard, 1, 0);
  auto content = Bytes(4 * kGranuleBytes, 4);
  auto d = w.Put(FrameOf(content));
  ASSERT_TRUE(d);
  {
    auto f = p.client->Borrow(p.client, *d);
    ASSERT_TRUE(f.ok());
    EXPECT_TRUE(f->lent());
    Frame copy = *f;
    f = Frame();
    EXPECT_FALSE(w.Put(FrameOf(content))) << "a copy of the frame still holds it";
    EXPECT_TRUE(SameBytes(copy, content));
  }
  EXPECT_TRUE(w.Put(FrameOf(content)));
}

TEST(ShmSegmentTest, GranulesOfADeadReaderAreTakenBackAndTheirOldDescriptorIsRefused) {
  Pair p = MakePair(4 * kGranuleBytes);
  ASSERT_TRUE(p.shard);
  ShmWriter w(p.client, 0, /*reclaim_ms=*/5);
  auto d_old = w.Put(FrameOf(Bytes(4 * kGranuleBytes, 1)));
  ASSERT_TRUE(d_old);
  EXPECT_FALSE(w.Put(FrameOf(Bytes(kGranuleBytes, 2))));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto content = Bytes(4 * kGranuleBytes, 3);
  auto d_new = w.Put(FrameOf(content));
  ASSERT_TRUE(d_new) << "taken back after the reclaim time";
  EXPECT_FALSE(p.shard->CopyOut(*d_old).ok());
  auto got = p.shard->CopyOut(*d_new);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(SameBytes(*got, content));
}

TEST(ShmSegmentTest, BadDescriptorsAreRefused) {
  Pair p = MakePair(8 * kGranuleBytes);
  ASSERT_TRUE(p.shard);
  ShmWriter w(p.client, 0, 0);
  auto d = w.Put(FrameOf(Bytes(100, 0)));
  ASSERT_TRUE(d);
  std::vector<Descriptor> bad;
  Descriptor x = *d;
  x.ring = 2;
  bad.push_back(x);
  x = *d;
  x.offset = 8 * kGranuleBytes;
  bad.push_back(x);
  x = *d;
  x.offset = 7;
  bad.push_back(x);
  x = *d;
  x.size = 0;
  bad.push_back(x);
  x = *d;
  x.size = 9 * kGranuleBytes;
  bad.push_back(x);
  x = *d;
  x.offset = uint64_t{1} << 63;
  bad.push_back(x);
  for (const Descriptor& b : bad) {
    auto r = p.shard->CopyOut(b);
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  }
  x = *d;
  x.generation ^= 0x55;
  EXPECT_EQ(p.shard->CopyOut(x).status().code(), StatusCode::kNotFound)
      << "another generation: the frame was sent again";
  EXPECT_TRUE(p.shard->CopyOut(*d).ok()) << "the good descriptor still reads after the bad ones";
}

TEST(ShmSegmentTest, OpenRefusesOtherTokensNamesAndMissingSegments) {
  auto c = ShmSegment::Create(1 << 16);
  ASSERT_TRUE(c.ok());
  auto wrong = ShmSegment::Open((*c)->name(), (*c)->token() + 1);
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  for (std::string name :
       {"/etc/passwd", "/leash-shm-1-xyz", "/leash-shm--0123456789abcdef",
        "/leash-shm-12-0123456789abcdeF", "../leash-shm-1-0123456789abcdef", ""}) {
    EXPECT_EQ(ShmSegment::Open(name, 1).status().code(), StatusCode::kInvalidArgument) << name;
  }
  EXPECT_EQ(ShmSegment::Open("/leash-shm-1-0123456789abcdef", 1).status().code(),
            StatusCode::kNotFound);
  // Not activated yet: a shard can map it but no writer touches the rings.
  auto s = ShmSegment::Open((*c)->name(), (*c)->token());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE((*s)->ready());
  ShmWriter w(*s, 1, 0);
  EXPECT_FALSE(w.Put(FrameOf(Bytes(10, 0))));
  // The creator removes the name when it goes; existing mappings stay valid.
  std::string name = (*c)->name();
  uint64_t token = (*c)->token();
  c->reset();
  EXPECT_EQ(ShmSegment::Open(name, token).status().code(), StatusCode::kNotFound);
}

size_t OpenDescriptors() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

TEST(ShmSegmentTest, MappedSegmentsHoldNoDescriptorsAndActivateOnlyOnce) {
  std::vector<std::shared_ptr<ShmSegment>> created, opened;
  const size_t before = OpenDescriptors();
  for (int i = 0; i < 20; ++i) {
    auto c = ShmSegment::Create(1 << 16);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->Activate().ok());
    auto again = (*c)->Activate();
    EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition) << again;
    auto o = ShmSegment::Open((*c)->name(), (*c)->token());
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ((*o)->Activate().code(), StatusCode::kFailedPrecondition)
        << "only the creator activates";
    created.push_back(*c);
    opened.push_back(*o);
  }
  EXPECT_EQ(OpenDescriptors(), before)
      << "a shard mapping many workers' segments keeps no descriptor per segment";
  // The mappings still work, and rings grow without keeping a descriptor either.
  ShmWriter w(created.back(), 0, 0);
  ShmWriter back(opened.back(), 1, 0);
  auto d = w.Put(FrameOf(Bytes(1000, 3)));
  auto d_back = back.Put(FrameOf(Bytes(2000, 4)));
  ASSERT_TRUE(d && d_back);
  auto got = opened.back()->CopyOut(*d);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(SameBytes(*got, Bytes(1000, 3)));
  auto got_back = created.back()->CopyOut(*d_back);
  ASSERT_TRUE(got_back.ok());
  EXPECT_TRUE(SameBytes(*got_back, Bytes(2000, 4)));
  EXPECT_EQ(OpenDescriptors(), before);
}

// The message queue of a ring: records in order from the writer's mapping to the reader's,
// a full queue says so, and the writer rings the bell only for a reader that dozes, once.
TEST(ShmSegmentTest, TheMessageQueueKeepsOrderAndRingsOnlyForADozingReader) {
  Pair p = MakePair(1 << 20);
  ASSERT_TRUE(p.shard);
  for (uint32_t i = 0; i < kQueueSlots; ++i) {
    ASSERT_EQ(p.client->Enqueue(0, reinterpret_cast<const uint8_t*>(&i), sizeof i),
              ShmSegment::Posted::kQueued)
        << i;
  }
  uint32_t more = 7;
  EXPECT_EQ(p.client->Enqueue(0, reinterpret_cast<const uint8_t*>(&more), sizeof more),
            ShmSegment::Posted::kFull);
  EXPECT_FALSE(p.shard->Doze(0)) << "records are waiting";
  for (uint32_t i = 0; i < kQueueSlots; ++i) {
    auto slot = p.shard->Front(0);
    ASSERT_TRUE(slot.ok()) << slot.status();
    ASSERT_NE(*slot, nullptr);
    ASSERT_EQ((*slot)->generation, 0u);
    ASSERT_EQ((*slot)->size, sizeof i);
    uint32_t got = 0;
    std::memcpy(&got, (*slot)->bytes, sizeof got);
    EXPECT_EQ(got, i);
    p.shard->Pop(0);
  }
  auto empty = p.shard->Front(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, nullptr);

  ASSERT_TRUE(p.shard->Doze(0));
  EXPECT_EQ(p.client->Enqueue(0, reinterpret_cast<const uint8_t*>(&more), sizeof more),
            ShmSegment::Posted::kRing);
  EXPECT_EQ(p.client->Enqueue(0, reinterpret_cast<const uint8_t*>(&more), sizeof more),
            ShmSegment::Posted::kQueued)
      << "one ring per doze";
  p.shard->Wake(0);

  // A record too large for a slot travels as a frame of the ring.
  ShmWriter w(p.client, 0, 0);
  auto big = Bytes(5000, 3);
  auto d = w.Put(FrameOf(big));
  ASSERT_TRUE(d);
  EXPECT_EQ(p.client->Enqueue(0, *d), ShmSegment::Posted::kQueued);
  p.shard->Pop(0);
  p.shard->Pop(0);
  auto slot = p.shard->Front(0);
  ASSERT_TRUE(slot.ok() && *slot != nullptr);
  ASSERT_EQ((*slot)->generation, d->generation);
  auto f = p.shard->CopyOut({0, (*slot)->generation, (*slot)->offset, (*slot)->size});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(SameBytes(*f, big));
}

TEST(ShmSegmentTest, AQueueWhoseWriterIndexIsImpossibleIsRefused) {
  Pair p = MakePair(1 << 20);
  ASSERT_TRUE(p.shard);
  // The writer's index of queue 0 is the first word after the header's page.
  int fd = ::shm_open(p.client->name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  const uint64_t bogus = 1'000'000;
  ASSERT_EQ(::pwrite(fd, &bogus, sizeof bogus, 4096), static_cast<ssize_t>(sizeof bogus));
  ::close(fd);
  auto slot = p.shard->Front(0);
  ASSERT_FALSE(slot.ok());
  EXPECT_NE(slot.status().message().find("corrupt"), std::string::npos) << slot.status();
}

// Bells are FIFOs beside the segment: a ring wakes a poll, Drain quiets it, and they go
// with the segment's name (and with a dead process's stale segments).
TEST(ShmSegmentTest, BellsWakeAPollAndGoWithTheSegment) {
  std::string name;
  {
    Pair p = MakePair(1 << 20);
    ASSERT_TRUE(p.shard);
    name = p.client->name();
    EXPECT_EQ(p.shard->OpenBell(0).status().code(), StatusCode::kNotFound) << "none made yet";
    EXPECT_FALSE(p.shard->MakeBells().ok()) << "only the creator makes them";
    ASSERT_TRUE(p.client->MakeBells().ok());
    auto reader = p.shard->OpenBell(0);
    auto writer = p.client->OpenBell(0);
    ASSERT_TRUE(reader.ok() && writer.ok());
    Bell r(*reader), w(*writer);
    pollfd fds{r.fd(), POLLIN, 0};
    EXPECT_EQ(::poll(&fds, 1, 0), 0);
    w.Ring();
    w.Ring();
    EXPECT_EQ(::poll(&fds, 1, 1000), 1);
    r.Drain();
    EXPECT_EQ(::poll(&fds, 1, 0), 0) << "drained";
  }
  struct stat st {};
  EXPECT_NE(::stat(("/dev/shm" + name + ".bell0").c_str(), &st), 0);
  EXPECT_NE(::stat(("/dev/shm" + name + ".bell1").c_str(), &st), 0);

  const std::string dead = "/dev/shm/leash-shm-99999999-0123456789abcdef.bell1";
  ASSERT_EQ(::mkfifo(dead.c_str(), 0600), 0);
  ShmSegment::RemoveStale();
  EXPECT_NE(::stat(dead.c_str(), &st), 0) << "a dead process's bell is removed";
}

TEST(ShmSegmentTest, SegmentsOfDeadProcessesAreRemoved) {
  // Above any pid_max, so no live process has it.
  const std::string dead = "/leash-shm-99999999-0123456789abcdef";
  const std::string mine = "/leash-shm-" + std::to_string(::getpid()) + "-0123456789abcdef";
  for (const auto& n : {dead, mine}) {
    int fd = ::shm_open(n.c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    ::close(fd);
  }
  ShmSegment::RemoveStale();
  EXPECT_LT(::shm_open(dead.c_str(), O_RDONLY, 0), 0);
  int fd = ::shm_open(mine.c_str(), O_RDONLY, 0);
  EXPECT_GE(fd, 0) << "a live process keeps its segments";
  if (fd >= 0) ::close(fd);
  ::shm_unlink(mine.c_str());
}

}  // namespace
}  // namespace leash::shm

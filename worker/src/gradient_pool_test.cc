#include "gradient_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <thread>

namespace leash::worker {
namespace {

TEST(GradientPoolTest, ABufferComesBackOnlyOnceNobodyHoldsIt) {
  GradientPool pool({1000, 3});
  float* a = pool.Take(0);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  for (int j = 0; j < 1000; ++j) a[j] = static_cast<float>(j);
  std::shared_ptr<const float> sent = pool.HandOver(0, a);
  std::shared_ptr<const float> resend = sent;  // the client keeps one for a resend

  // While anyone holds it, the next step gets another buffer.
  float* b = pool.Take(0);
  EXPECT_NE(b, a);
  EXPECT_EQ(pool.allocated(0), 2u);
  sent.reset();
  EXPECT_NE(pool.Take(0), a) << "a buffer came back while the client still held it";
  EXPECT_EQ(pool.allocated(0), 3u);
  EXPECT_EQ(resend.get()[999], 999.f);

  resend.reset();
  EXPECT_EQ(pool.Take(0), a) << "the released buffer was not reused";
  EXPECT_EQ(pool.allocated(0), 3u);
  pool.Return(0, b);
  EXPECT_EQ(pool.Take(0), b);

  // Parameters have pools of their own.
  EXPECT_EQ(pool.allocated(1), 0u);
  float* c = pool.Take(1);
  EXPECT_NE(c, a);
  EXPECT_EQ(pool.allocated(1), 1u);
  EXPECT_EQ(pool.handed_over(), 1);
}

TEST(GradientPoolTest, BuffersReleasedOnAnotherThreadAfterThePoolIsGoneAreFreedWithIt) {
  std::shared_ptr<const float> held;
  {
    GradientPool pool({1 << 16});
    for (int k = 0; k < 8; ++k) {
      float* buf = pool.Take(0);
      buf[0] = static_cast<float>(k);
      std::shared_ptr<const float> p = pool.HandOver(0, buf);
      if (k == 7) held = p;  // the others are released at once and reused
    }
    EXPECT_EQ(pool.allocated(0), 1u) << "buffers released at once were not reused";
    EXPECT_EQ(pool.handed_over(), 8);
  }
  // As ZeroMQ's I/O thread releases a message's last reference after the worker is done.
  std::thread io([p = std::move(held)]() mutable {
    EXPECT_EQ(p.get()[0], 7.f);
    p.reset();
  });
  io.join();  // nothing to assert beyond this: AddressSanitizer and LeakSanitizer watch it
}

TEST(GradientPoolTest, ConcurrentReleasesAndTakesNeverHandOutABufferTwice) {
  GradientPool pool({256});
  constexpr int kRounds = 2000;
  std::vector<std::shared_ptr<const float>> inflight;
  std::thread io;
  for (int r = 0; r < kRounds; ++r) {
    float* buf = pool.Take(0);
    for (int j = 0; j < 256; ++j) buf[j] = static_cast<float>(r);
    inflight.push_back(pool.HandOver(0, buf));
    if (inflight.size() == 4) {
      // Another thread checks and releases them while this one takes the next ones.
      if (io.joinable()) io.join();
      io = std::thread([batch = std::move(inflight), r]() mutable {
        for (size_t k = 0; k < batch.size(); ++k) {
          const float want = static_cast<float>(r - 3 + static_cast<int>(k));
          for (int j = 0; j < 256; ++j) {
            ASSERT_EQ(batch[k].get()[j], want) << "a buffer was rewritten while in flight";
          }
          batch[k].reset();
        }
      });
      inflight.clear();
    }
  }
  if (io.joinable()) io.join();
  EXPECT_LE(pool.allocated(0), 12u) << "buffers were not recycled";
  EXPECT_EQ(pool.handed_over(), kRounds);
}

}  // namespace
}  // namespace leash::worker

// Test support: pushes of known values through a real Client while shards are killed and
// restarted, and the check that the final table is their exact sum. Thread-safe as stated.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "leash/worker/client.h"
#include "support/process.h"

namespace leash::testing {

using namespace std::chrono_literals;

// Pushes of known values from a thread of its own through a client (one that follows the
// primaries in etcd, or one with fixed endpoints): push i adds i % 64 to row i % 4 of a 4-value SGD
// table at learning rate 1, so the table must end as minus the sum of the acknowledged pushes,
// exactly. A push not acknowledged within two minutes is a failure (the thread ends rather than
// hang).
class ExactSumPusher {
 public:
  ExactSumPusher(Client& client, TableHandle table) : client_(client), table_(std::move(table)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~ExactSumPusher() { Stop(); }

  int64_t acknowledged() const { return acknowledged_.load(); }
  // Waits until `n` more pushes than now are acknowledged; false (with the failure, if
  // any, in failure()) if that takes longer than `timeout`.
  bool WaitForMore(int64_t n, std::chrono::milliseconds timeout = 60s) const {
    const int64_t target = acknowledged() + n;
    return WaitFor([&] { return acknowledged() >= target || done_.load(); }, timeout) &&
           acknowledged() >= target;
  }
  // Stops after the push in flight is acknowledged.
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  std::string failure() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }
  // After Stop(): the table pulled through `client` equals minus the acknowledged sums.
  void ExpectExactSums(Client& client) const {
    ASSERT_TRUE(failure().empty()) << failure();
    std::vector<float> values(4);
    Status st = client.Pull(table_, values.data()).get();
    ASSERT_TRUE(st.ok()) << st;
    for (size_t k = 0; k < 4; ++k) {
      EXPECT_EQ(values[k], -static_cast<float>(sum_[k]))
          << "row " << k << " after " << acknowledged() << " acknowledged pushes";
    }
  }

 private:
  void Run() {
    for (int64_t i = 1; !stop_.load(); ++i) {
      std::vector<float> grad(4, 0.f);
      grad[static_cast<size_t>(i % 4)] = static_cast<float>(i % 64);
      auto pending = client_.Push(table_, grad.data());
      const auto deadline = std::chrono::steady_clock::now() + 120s;
      while (pending.wait_for(100ms) != std::future_status::ready) {
        if (std::chrono::steady_clock::now() >= deadline) {
          Fail("push " + std::to_string(i) + " not acknowledged within 120 s");
          return;
        }
      }
      Status st = pending.get();
      if (!st.ok()) {
        Fail("push " + std::to_string(i) + ": " + st.ToString());
        return;
      }
      sum_[static_cast<size_t>(i % 4)] += static_cast<float>(i % 64);
      acknowledged_.store(i);
    }
    done_.store(true);
  }
  void Fail(std::string why) {
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = std::move(why);
    done_.store(true);
  }

  Client& client_;
  TableHandle table_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};
  std::atomic<int64_t> acknowledged_{0};
  std::vector<double> sum_ = std::vector<double>(4, 0);  // written by the thread only
  mutable std::mutex mu_;
  std::string failure_;
  std::thread thread_;
};

}  // namespace leash::testing

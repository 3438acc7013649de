// A ShardDirectory answered from memory: a thread of its own follows another directory's
// changes (its WaitForChange, a watch of etcd) and keeps the latest view, so a caller's
// View() never waits on the coordinator. leash-server's replicas read the directory in
// their request loop (who is primary, whether to campaign); a coordinator that hangs
// (connections accepted, nothing answered) held that loop for the whole request timeout
// on every read, and the backup then acknowledged the log only every few seconds.
// Thread-safe: View and WaitForChange may be called from any thread; destruction stops the
// follower and waits for its call in flight (at most the inner directory's timeouts).
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "leash/common/coordinator.h"

namespace leash {

class WatchedDirectory final : public ShardDirectory {
 public:
  explicit WatchedDirectory(std::unique_ptr<ShardDirectory> inner);
  ~WatchedDirectory() override;
  WatchedDirectory(const WatchedDirectory&) = delete;
  WatchedDirectory& operator=(const WatchedDirectory&) = delete;

  // The latest view the follower saw, without waiting: while the coordinator does not
  // answer, the last one it gave (the coordinator cannot change while nobody reaches it,
  // and a replica cannot win an election without it). Before the first answer, the error
  // of the first attempt (Unavailable or NotFound, as the inner directory's View).
  Result<ClusterView> View() override;
  // Waits up to `timeout` for a view newer than `after_revision`; then as View().
  Result<ClusterView> WaitForChange(int64_t after_revision,
                                    std::chrono::milliseconds timeout) override;

 private:
  void Follow();

  std::unique_ptr<ShardDirectory> inner_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::optional<ClusterView> view_;  // under mu_
  Status error_;                     // under mu_: the inner directory's latest error
  bool answered_ = false;            // under mu_: an attempt finished, error_ or view_ set
  bool stop_ = false;                // under mu_
  std::thread thread_;
};

}  // namespace leash

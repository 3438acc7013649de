// Unit tests of WatchedDirectory: views come from its follower thread, the last one is
// kept while the inner directory hangs or fails, and it stops while the inner one hangs.
// The inner directory is a fake that hangs on demand (fault injection); the real etcd
// case is FailoverTest.TrainingGoesOnWhileEtcdHangs.
#include "leash/common/watched_directory.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

namespace leash {
namespace {

using namespace std::chrono_literals;

// A directory whose calls hang while hang() is set, and which records the threads that
// call it.
class HangingDirectory final : public ShardDirectory {
 public:
  Result<ClusterView> View() override {
    std::unique_lock<std::mutex> lock(mu_);
    callers_.insert(std::this_thread::get_id());
    cv_.wait(lock, [&] { return !hang_; });
    if (!error_.ok()) return error_;
    return view_;
  }
  Result<ClusterView> WaitForChange(int64_t after, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    callers_.insert(std::this_thread::get_id());
    cv_.wait_for(lock, timeout, [&] { return !hang_ && view_.revision > after; });
    cv_.wait(lock, [&] { return !hang_; });
    if (!error_.ok()) return error_;
    return view_;
  }
  void Publish(int64_t revision, uint32_t num_shards) {
    std::lock_guard<std::mutex> lock(mu_);
    view_.revision = revision;
    view_.num_shards = num_shards;
    cv_.notify_all();
  }
  void SetHang(bool hang) {
    std::lock_guard<std::mutex> lock(mu_);
    hang_ = hang;
    cv_.notify_all();
  }
  void SetError(Status st) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::move(st);
    cv_.notify_all();
  }
  bool CalledFrom(std::thread::id id) {
    std::lock_guard<std::mutex> lock(mu_);
    return callers_.count(id) > 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  ClusterView view_;
  Status error_;
  bool hang_ = false;
  std::set<std::thread::id> callers_;
};

TEST(WatchedDirectoryTest, ViewsComeFromTheFollowerAndTheLastIsKeptWhileTheInnerHangs) {
  auto inner = std::make_unique<HangingDirectory>();
  HangingDirectory* fake = inner.get();
  fake->Publish(1, 2);
  WatchedDirectory d(std::move(inner));
  auto first = d.WaitForChange(0, 20s);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->revision, 1);
  EXPECT_EQ(first->num_shards, 2u);

  fake->Publish(2, 2);
  auto second = d.WaitForChange(1, 20s);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->revision, 2);

  fake->SetHang(true);
  fake->Publish(3, 2);
  // The caller gets the last view at once; the fake would hang any call it made.
  auto cached = d.View();
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(cached->revision, 2);
  EXPECT_FALSE(fake->CalledFrom(std::this_thread::get_id()));

  fake->SetHang(false);
  auto third = d.WaitForChange(2, 20s);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->revision, 3);
}

TEST(WatchedDirectoryTest, ErrorsBeforeTheFirstViewAreTheInnerDirectorysAndAViewOutlivesLaterOnes) {
  auto inner = std::make_unique<HangingDirectory>();
  HangingDirectory* fake = inner.get();
  fake->SetError(NotFound("no replica of job 'j' has registered"));
  WatchedDirectory d(std::move(inner));
  auto none = d.WaitForChange(0, 20s);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound) << none.status();

  fake->SetError(Status::Ok());
  fake->Publish(5, 1);
  // The follower tries again every 200 ms after an error.
  Result<ClusterView> seen = d.View();
  for (int i = 0; i < 400 && !seen.ok(); ++i) {
    std::this_thread::sleep_for(50ms);
    seen = d.View();
  }
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_EQ(seen->revision, 5);

  // The coordinator fails afterwards: the last view stays (nothing can change meanwhile).
  fake->SetError(Unavailable("etcd at http://127.0.0.1:1 did not answer"));
  fake->Publish(6, 1);
  auto kept = d.WaitForChange(5, 300ms);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->revision, 5);
}

TEST(WatchedDirectoryTest, StopsWhileNoViewHasComeYet) {
  auto inner = std::make_unique<HangingDirectory>();
  HangingDirectory* fake = inner.get();
  fake->SetError(Unavailable("etcd unreachable"));
  {
    WatchedDirectory d(std::move(inner));
    auto v = d.WaitForChange(0, 20s);
    EXPECT_EQ(v.status().code(), StatusCode::kUnavailable);
  }  // joins its follower, which waits between attempts
  SUCCEED();
}

}  // namespace
}  // namespace leash

// WatchedDirectory (watched_directory.h): the follower thread and the cached view.
// Thread-safe.
#include "leash/common/watched_directory.h"

#include <utility>

namespace leash {

using std::chrono::milliseconds;

WatchedDirectory::WatchedDirectory(std::unique_ptr<ShardDirectory> inner)
    : inner_(std::move(inner)), error_(Unavailable("the shard directory has not answered yet")) {
  thread_ = std::thread([this] { Follow(); });
}

WatchedDirectory::~WatchedDirectory() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void WatchedDirectory::Follow() {
  int64_t revision = 0;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    // A long watch: each change comes as it happens; on its timeout, the current view.
    Result<ClusterView> view =
        revision == 0 ? inner_->View() : inner_->WaitForChange(revision, milliseconds(1000));
    std::unique_lock<std::mutex> lock(mu_);
    answered_ = true;
    if (view.ok()) {
      revision = view->revision;
      error_ = Status::Ok();
      view_ = std::move(*view);
      changed_.notify_all();
      continue;
    }
    error_ = view.status();
    revision = 0;
    changed_.notify_all();
    // Not answered (or no replica registered yet): try again shortly, the last view kept.
    changed_.wait_for(lock, milliseconds(200), [this] { return stop_; });
  }
}

Result<ClusterView> WatchedDirectory::View() {
  std::lock_guard<std::mutex> lock(mu_);
  if (view_) return *view_;
  return error_;
}

Result<ClusterView> WatchedDirectory::WaitForChange(int64_t after_revision, milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, timeout, [&] {
    return stop_ || (view_ && view_->revision > after_revision) || (!view_ && answered_);
  });
  if (view_) return *view_;
  return error_;
}

}  // namespace leash

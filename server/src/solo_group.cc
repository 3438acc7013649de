#include "solo_group.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace leash::server {
namespace {

constexpr char kMagic[] = "leash solo group v1";

Status ErrnoError(const std::string& what) { return IOError(what + ": " + std::strerror(errno)); }

// Writes `text` to `path` so that a crash leaves either the old file or the new one:
// written and synced under a temporary name, renamed over it, the directory synced.
Status ReplaceFile(const std::string& dir, const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot write " + tmp);
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status st = ErrnoError("cannot write " + tmp);
      ::close(fd);
      return st;
    }
    done += static_cast<size_t>(n);
  }
  if (::fdatasync(fd) != 0) {
    Status st = ErrnoError("cannot sync " + tmp);
    ::close(fd);
    return st;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("cannot rename " + tmp);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoError("cannot open " + dir);
  const int synced = ::fsync(dfd);
  ::close(dfd);
  if (synced != 0) return ErrnoError("cannot sync " + dir);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<SoloGroup>> SoloGroup::Open(std::string dir, uint32_t shard,
                                                   uint32_t num_shards) {
  if (shard >= num_shards) {
    return InvalidArgument("shard " + std::to_string(shard) + " of " + std::to_string(num_shards));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IOError("cannot create " + dir + ": " + ec.message());
  std::unique_ptr<SoloGroup> g(new SoloGroup(dir, shard, num_shards));
  const std::string path = dir + "/group";
  std::ifstream in(path);
  if (!in) {
    if (std::filesystem::exists(path, ec)) return IOError("cannot read " + path);
    return g;  // a group that never acknowledged anything
  }
  std::string magic, key;
  std::getline(in, magic);
  uint64_t term = 0;
  if (magic != kMagic || !(in >> key >> term) || key != "term") {
    return InvalidArgument(path +
                           " is not a Leash solo group file (is --data-dir another program's "
                           "directory?); move it away to start this shard's log anew");
  }
  g->term_ = term;
  if (in >> key && key == "in_sync") {
    uint32_t r = 0;
    while (in >> r) g->in_sync_.push_back(r);
  }
  return g;
}

Status SoloGroup::Join(uint32_t shard, const ReplicaAddress& self) {
  if (shard != shard_ || self.replica != 0) {
    return InvalidArgument("a solo group is replica 0 of shard " + std::to_string(shard_) +
                           ", not replica " + std::to_string(self.replica) + " of shard " +
                           std::to_string(shard));
  }
  std::lock_guard<std::mutex> lock(mu_);
  self_ = self;
  ++revision_;
  changed_.notify_all();
  return Status::Ok();
}

Status SoloGroup::Leave() {
  std::lock_guard<std::mutex> lock(mu_);
  self_.reset();
  primary_ = false;
  ++revision_;
  changed_.notify_all();
  return Status::Ok();
}

Result<std::optional<uint64_t>> SoloGroup::Campaign() {
  std::lock_guard<std::mutex> lock(mu_);
  if (primary_) return std::optional<uint64_t>();
  ++term_;
  if (Status st = SaveLocked(); !st.ok()) {
    --term_;
    return st.WithContext("taking term " + std::to_string(term_ + 1));
  }
  primary_ = true;
  ++revision_;
  changed_.notify_all();
  return std::optional<uint64_t>(term_);
}

Status SoloGroup::SetInSync(uint64_t term, const std::vector<uint32_t>& in_sync) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!primary_ || term != term_) {
    return FailedPrecondition("term " + std::to_string(term) + " is not the current term (" +
                              std::to_string(term_) + ")");
  }
  std::vector<uint32_t> sorted = in_sync;
  std::sort(sorted.begin(), sorted.end());
  if (sorted == in_sync_) return Status::Ok();
  std::vector<uint32_t> before = std::move(in_sync_);
  in_sync_ = std::move(sorted);
  if (Status st = SaveLocked(); !st.ok()) {
    in_sync_ = std::move(before);
    return st;
  }
  ++revision_;
  changed_.notify_all();
  return Status::Ok();
}

Status SoloGroup::Resign(uint64_t term) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!primary_ || term != term_) return Status::Ok();
  primary_ = false;
  ++revision_;
  changed_.notify_all();
  return Status::Ok();
}

ClusterView SoloGroup::ViewLocked() const {
  ClusterView v;
  v.num_shards = num_shards_;
  v.replicas = 1;
  v.revision = revision_;
  v.shards.resize(num_shards_);
  for (uint32_t s = 0; s < num_shards_; ++s) v.shards[s].shard = s;
  ShardView& own = v.shards[shard_];
  own.in_sync = in_sync_;
  if (self_) own.live.push_back(*self_);
  if (primary_ && self_) {
    own.term = term_;
    own.primary = self_;
  }
  return v;
}

ClusterView SoloGroup::View() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ViewLocked();
}

ClusterView SoloGroup::WaitForChange(int64_t after_revision,
                                     std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, timeout, [&] { return revision_ > after_revision; });
  return ViewLocked();
}

std::unique_ptr<ShardDirectory> SoloGroup::Directory() {
  class Reader final : public ShardDirectory {
   public:
    explicit Reader(const SoloGroup& g) : g_(g) {}
    Result<ClusterView> View() override { return g_.View(); }
    Result<ClusterView> WaitForChange(int64_t after_revision,
                                      std::chrono::milliseconds timeout) override {
      return g_.WaitForChange(after_revision, timeout);
    }

   private:
    const SoloGroup& g_;
  };
  return std::make_unique<Reader>(*this);
}

uint64_t SoloGroup::term() const {
  std::lock_guard<std::mutex> lock(mu_);
  return term_;
}

std::vector<uint32_t> SoloGroup::in_sync() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_sync_;
}

Status SoloGroup::SaveLocked() {
  std::ostringstream text;
  text << kMagic << "\nterm " << term_ << "\nin_sync";
  for (uint32_t r : in_sync_) text << ' ' << r;
  text << '\n';
  return ReplaceFile(dir_, dir_ + "/group", text.str());
}

}  // namespace leash::server

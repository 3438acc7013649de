// A replica's log on disk (durable_log.h): records written with writev from the frames as
// they are, files begun beside a snapshot and made current once it is saved.
#include "durable_log.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "leash/common/crc32c.h"

namespace leash::server {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kMagic = 0x52485344;    // "DSHR" little-endian
constexpr uint32_t kTrailer = 0x45524844;  // "DHRE"
constexpr size_t kHeaderBytes = 40;
constexpr size_t kTrailerBytes = 16;
constexpr uint32_t kCouldLead = 1;
constexpr uint32_t kWholeCrc = 2;  // the trailer's CRC covers the whole record
constexpr uint64_t kMaxFrames = uint64_t{1} << 24;
constexpr std::string_view kPrefix = "log-";
constexpr std::string_view kPendingSuffix = ".new";
constexpr std::string_view kSpare = "spare";

void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{p[i]} << (8 * i);
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

Status Errno(const std::string& what, const std::string& path) {
  return IOError(what + " " + path + ": " + std::strerror(errno));
}

// The header's CRC: over the header past its magic (but its own field), the frame sizes and
// frame 0.
uint32_t HeaderCrc(const uint8_t* header, const uint8_t* sizes, size_t sizes_bytes,
                   const uint8_t* first, size_t first_bytes) {
  uint32_t crc = Crc32c(header + 4, 8);               // flags, count
  crc = Crc32c(header + 16, kHeaderBytes - 16, crc);  // body bytes, sequence, time
  crc = Crc32c(sizes, sizes_bytes, crc);              // every frame's size
  return Crc32c(first, first_bytes, crc);             // the append's header
}

Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open the directory", dir);
  const int r = ::fsync(fd);
  ::close(fd);
  if (r != 0) return Errno("cannot fsync the directory", dir);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<DurableLog>> DurableLog::Open(std::string dir, Sync sync) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return IOError("cannot create the durable log directory " + dir + ": " + ec.message() +
                   " (give --data-dir a writable directory)");
  }
  return std::unique_ptr<DurableLog>(new DurableLog(std::move(dir), sync));
}

DurableLog::~DurableLog() {
  if (next_fd_ >= 0) Abort();
  if (fd_ >= 0) ::close(fd_);
}

std::string DurableLog::PathOf(DurableSnapshotId id, bool pending) const {
  std::string name =
      std::string(kPrefix) + std::to_string(id.sequence) + "-" + std::to_string(id.unix_ms);
  if (pending) name += kPendingSuffix;
  return (fs::path(dir_) / name).string();
}

Status DurableLog::WriteRecord(int fd, DurableSnapshotId id, uint64_t* offset, bool could_lead,
                               const Message& append, const std::string& path) {
  if (append.empty() || append.size() > kMaxFrames) {
    return InvalidArgument("a durable log record needs 1 to 2^24 frames");
  }
  const bool whole = sync_ == Sync::kFsync;
  // The header and the sizes in one buffer, the frames written from where they are, then
  // the trailer: a write cut short by the process's death leaves a prefix without it.
  std::vector<uint8_t> head(kHeaderBytes + 8 * append.size());
  uint64_t body = 8 * append.size();
  for (size_t i = 0; i < append.size(); ++i) {
    PutU64(head.data() + kHeaderBytes + 8 * i, append[i].size());
    body += append[i].size();
  }
  PutU32(head.data(), kMagic);
  PutU32(head.data() + 4, (could_lead ? kCouldLead : 0) | (whole ? kWholeCrc : 0));
  PutU32(head.data() + 8, static_cast<uint32_t>(append.size()));
  PutU64(head.data() + 16, body);
  PutU64(head.data() + 24, id.sequence);
  PutU64(head.data() + 32, static_cast<uint64_t>(id.unix_ms));
  const uint32_t crc = HeaderCrc(head.data(), head.data() + kHeaderBytes, 8 * append.size(),
                                 append[0].data(), append[0].size());
  PutU32(head.data() + 12, crc);
  uint32_t trailer_crc = crc;
  if (whole) {
    for (size_t i = 1; i < append.size(); ++i)
      trailer_crc = Crc32c(append[i].data(), append[i].size(), trailer_crc);
  }
  uint8_t trailer[kTrailerBytes];
  PutU32(trailer, kTrailer);
  PutU32(trailer + 4, trailer_crc);
  PutU64(trailer + 8, *offset);
  std::vector<iovec> iov;
  iov.reserve(append.size() + 2);
  iov.push_back({head.data(), head.size()});
  for (const Frame& f : append) {
    if (!f.empty()) iov.push_back({const_cast<uint8_t*>(f.data()), f.size()});
  }
  iov.push_back({trailer, kTrailerBytes});
  const uint64_t total = kHeaderBytes + body + kTrailerBytes;
  uint64_t done = 0;
  size_t at = 0;  // the first iovec not yet written whole
  while (at < iov.size()) {
    const int n = static_cast<int>(std::min<size_t>(iov.size() - at, IOV_MAX));
    const ssize_t w = ::pwritev(fd, iov.data() + at, n, static_cast<off_t>(*offset + done));
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot write the durable log", path);
    }
    size_t left = static_cast<size_t>(w);
    done += left;
    while (at < iov.size() && left >= iov[at].iov_len) left -= iov[at++].iov_len;
    if (at < iov.size() && left > 0) {
      iov[at].iov_base = static_cast<uint8_t*>(iov[at].iov_base) + left;
      iov[at].iov_len -= left;
    }
  }
  if (done != total) return Internal("durable log: wrote " + std::to_string(done) + " bytes");
  *offset += done;
  ++records_written_;
  bytes_written_ += done;
  return Status::Ok();
}

Status DurableLog::Begin(DurableSnapshotId id, bool could_lead, const Message& base) {
  if (next_fd_ >= 0) Abort();
  next_id_ = id;
  next_final_path_ = PathOf(id, false);
  next_path_ = PathOf(id, true);
  // The spare file if there is one: its pages are overwritten in place.
  const std::string spare = (fs::path(dir_) / kSpare).string();
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC;
  if (::rename(spare.c_str(), next_path_.c_str()) != 0) flags |= O_TRUNC;
  next_fd_ = ::open(next_path_.c_str(), flags, 0644);
  if (next_fd_ < 0) return Errno("cannot create the durable log", next_path_);
  next_bytes_ = 0;
  Status st = WriteRecord(next_fd_, id, &next_bytes_, could_lead, base, next_path_);
  if (st.ok() && sync_ == Sync::kFsync && ::fdatasync(next_fd_) != 0) {
    st = Errno("cannot fdatasync", next_path_);
  }
  if (!st.ok()) {
    Abort();
    return st;
  }
  return Status::Ok();
}

Status DurableLog::Commit() {
  if (next_fd_ < 0) return FailedPrecondition("durable log: no file begun");
  if (::rename(next_path_.c_str(), next_final_path_.c_str()) != 0) {
    Status st = Errno("cannot rename the durable log to", next_final_path_);
    Abort();
    return st;
  }
  if (sync_ == Sync::kFsync) LEASH_RETURN_IF_ERROR(SyncDir(dir_));
  if (fd_ >= 0) {
    ::close(fd_);
    // The file before becomes the spare the next snapshot's file is written over.
    const std::string spare = (fs::path(dir_) / kSpare).string();
    if (::rename(path_.c_str(), spare.c_str()) != 0) {
      spdlog::warn("durable log: cannot keep {} as the spare file: {}", path_,
                   std::strerror(errno));
    }
  }
  fd_ = next_fd_;
  next_fd_ = -1;
  unsynced_ = false;
  id_ = next_id_;
  path_ = next_final_path_;
  current_bytes_ = next_bytes_;
  // Every other file follows an older snapshot (or none the store still has).
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(kPrefix) || entry.path().string() == path_) continue;
    std::error_code rm;
    fs::remove(entry.path(), rm);
    if (rm) spdlog::warn("durable log: cannot delete {}: {}", entry.path().string(), rm.message());
  }
  return Status::Ok();
}

void DurableLog::Abort() {
  if (next_fd_ < 0) return;
  ::close(next_fd_);
  next_fd_ = -1;
  ::unlink(next_path_.c_str());
}

Status DurableLog::Append(bool could_lead, const Message& append) {
  if (fd_ < 0) return FailedPrecondition("durable log: no current file (no snapshot begun one)");
  LEASH_RETURN_IF_ERROR(WriteRecord(fd_, id_, &current_bytes_, could_lead, append, path_));
  unsynced_ = true;
  return Status::Ok();
}

Status DurableLog::MakeDurable() {
  if (sync_ != Sync::kFsync || !unsynced_ || fd_ < 0) return Status::Ok();
  const auto start = std::chrono::steady_clock::now();
  if (::fdatasync(fd_) != 0) return Errno("cannot fdatasync", path_);
  sync_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++syncs_;
  unsynced_ = false;
  return Status::Ok();
}

Result<std::vector<DurableLogRecord>> DurableLog::Read(DurableSnapshotId id) const {
  std::string path = PathOf(id, false);
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    // Killed after the snapshot was saved, before its file was renamed.
    path = PathOf(id, true);
    if (!fs::exists(path, ec)) {
      return NotFound("no durable log follows snapshot " + std::to_string(id.sequence) + " in " +
                      dir_);
    }
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  const off_t end = ::lseek(fd, 0, SEEK_END);
  const uint64_t size = end < 0 ? 0 : static_cast<uint64_t>(end);
  auto read_at = [&](void* dst, uint64_t n, uint64_t offset) {
    uint64_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(fd, static_cast<uint8_t*>(dst) + done, n - done,
                                static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      done += static_cast<uint64_t>(r);
    }
    return true;
  };
  std::vector<DurableLogRecord> records;
  uint64_t at = 0;
  std::string why_ended = "the end of the file";
  while (at < size) {
    // Whatever does not verify is where the log ends (the header's comment).
    auto ends = [&](std::string why) { why_ended = std::move(why); };
    uint8_t header[kHeaderBytes];
    if (size - at < kHeaderBytes + kTrailerBytes || !read_at(header, kHeaderBytes, at)) {
      ends("a record cut short");
      break;
    }
    const uint64_t count = GetU32(header + 8);
    const uint64_t body = GetU64(header + 16);
    if (GetU32(header) != kMagic || count == 0 || count > kMaxFrames || body < 8 * count ||
        body > size - at - kHeaderBytes - kTrailerBytes) {
      ends("no record (a record cut short, or an older file's bytes)");
      break;
    }
    if (GetU64(header + 24) != id.sequence ||
        static_cast<int64_t>(GetU64(header + 32)) != id.unix_ms) {
      ends("a record of another snapshot's file (the spare file's older bytes)");
      break;
    }
    std::vector<uint8_t> sizes(8 * count);
    if (!read_at(sizes.data(), sizes.size(), at + kHeaderBytes)) {
      ends("a record cut short");
      break;
    }
    uint64_t sum = 8 * count;
    bool fits = true;
    for (uint64_t i = 0; i < count && fits; ++i) {
      const uint64_t n = GetU64(sizes.data() + 8 * i);
      fits = n <= body && sum + n <= body;
      sum += n;
    }
    if (!fits || sum != body) {
      ends("a record whose frame sizes do not add up");
      break;
    }
    DurableLogRecord rec;
    const uint32_t flags = GetU32(header + 4);
    rec.could_lead = (flags & kCouldLead) != 0;
    uint64_t pos = at + kHeaderBytes + 8 * count;
    bool ok = true;
    for (uint64_t i = 0; i < count && ok; ++i) {
      std::vector<uint8_t> bytes(GetU64(sizes.data() + 8 * i));
      ok = read_at(bytes.data(), bytes.size(), pos);
      pos += bytes.size();
      rec.append.push_back(Frame::Own(std::move(bytes)));
    }
    uint8_t trailer[kTrailerBytes];
    if (!ok || !read_at(trailer, kTrailerBytes, pos)) {
      ends("a record cut short");
      break;
    }
    const uint32_t crc =
        HeaderCrc(header, sizes.data(), sizes.size(), rec.append[0].data(), rec.append[0].size());
    if (crc != GetU32(header + 12)) {
      ends("a record that fails its checksum");
      break;
    }
    uint32_t trailer_crc = crc;
    if ((flags & kWholeCrc) != 0) {
      for (size_t i = 1; i < rec.append.size(); ++i)
        trailer_crc = Crc32c(rec.append[i].data(), rec.append[i].size(), trailer_crc);
    }
    if (GetU32(trailer) != kTrailer || GetU32(trailer + 4) != trailer_crc ||
        GetU64(trailer + 8) != at) {
      ends("a record without its trailer (cut short)");
      break;
    }
    records.push_back(std::move(rec));
    at = pos + kTrailerBytes;
  }
  ::close(fd);
  if (at < size) {
    spdlog::info(
        "durable log {}: {} records; it ends at byte {} of {} with {} (never acknowledged)", path,
        records.size(), at, size, why_ended);
  }
  return records;
}

}  // namespace leash::server

// The RocksDB helpers the server's stores share (rocksdb_common.h). Thread-safe.
#include "rocksdb_common.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstring>

namespace leash::server {
namespace {

bool IsLockError(const rocksdb::Status& s) {
  if (!s.IsIOError()) return false;
  const std::string m = s.ToString();
  return m.find("lock hold by current process") != std::string::npos ||
         m.find("While lock file") != std::string::npos || m.find("/LOCK:") != std::string::npos;
}

}  // namespace

Status FromRocksDb(const rocksdb::Status& s, const std::string& path, std::string_view doing) {
  if (s.ok()) return Status::Ok();
  const std::string what = std::string(doing) + " RocksDB store " + path + ": " + s.ToString();
  if (IsLockError(s)) {
    return IOError(
        "cannot lock data directory " + path +
        ": another leash-server may be using this data directory; stop it or point --data-dir "
        "elsewhere (" +
        s.ToString() + ")");
  }
  if (s.IsNoSpace()) return ResourceExhausted(what + "; free disk space and retry");
  if (s.IsIOError()) return IOError(what);
  if (s.IsCorruption()) return DataLoss(what + std::string(kDamagedHint));
  if (s.IsNotFound()) return NotFound(what);
  // RocksDB reports unusable directory state (missing DB, features it lacks) as these.
  if (s.IsInvalidArgument() || s.IsNotSupported()) return FailedPrecondition(what);
  if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain()) return Unavailable(what);
  if (s.IsShutdownInProgress() || s.IsAborted()) return Aborted(what);
  return Internal(what);
}

void SpdlogRocksDbLogger::Logv(const char* format, va_list ap) {
  Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
}

void SpdlogRocksDbLogger::Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) {
  if (level < GetInfoLogLevel()) return;
  char buf[1024];
  std::vsnprintf(buf, sizeof buf, format, ap);
  // Every checkpoint turns file deletions off and on again, which RocksDB 7.8 logs as a
  // warning when they nest; nothing is wrong.
  if (std::strstr(buf, "File Deletions") != nullptr) return;
  if (level >= rocksdb::InfoLogLevel::ERROR_LEVEL) {
    spdlog::error("rocksdb: {}", buf);
  } else {
    spdlog::warn("rocksdb: {}", buf);
  }
}

}  // namespace leash::server

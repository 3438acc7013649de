// What the RocksDB users of the server (the snapshot store and the sparse row store) share:
// the one translation from rocksdb::Status to leash::Status, and RocksDB's info log sent to
// spdlog. Private to server/src. Thread-safe (stateless; the logger is safe as spdlog is).
#pragma once

#include <rocksdb/env.h>
#include <rocksdb/status.h>

#include <cstdarg>
#include <string>
#include <string_view>

#include "leash/common/status.h"

namespace leash::server {

// What a person can do about a damaged store.
inline constexpr std::string_view kDamagedHint =
    "; restore the data directory from a backup, or move it aside to start this shard empty";

// `s` as a leash::Status; `doing` says what was attempted ("opening"), `path` which store.
Status FromRocksDb(const rocksdb::Status& s, const std::string& path, std::string_view doing);

// RocksDB's own info log to spdlog (warnings and errors only) instead of LOG files in the
// data directory, so that refusing a directory leaves every file in it as it was.
class SpdlogRocksDbLogger final : public rocksdb::Logger {
 public:
  SpdlogRocksDbLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL) {}
  void Logv(const char* format, va_list ap) override;
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override;
};

}  // namespace leash::server

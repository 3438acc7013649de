// A replica's log on disk while it runs (leash-server --durable-log; docs/replication.md,
// "Every replica killed at once"). Each file follows one snapshot of the shard: its first
// record is where that snapshot's state stands in the log (the entries past it included),
// and every later record is a change of the log as the replica made it (entries appended,
// a divergent tail cut, a new term, whether it may lead), written before the replica
// acknowledges anything that depends on it. A replica SIGKILLed (every replica of a shard
// at once, even) starts again from its snapshot and this file with every entry it
// acknowledged.
//
// On disk: DIR/log-<sequence>-<unix_ms> for the snapshot of that sequence and time
// (DIR/log-0-0: no snapshot, the empty state), DIR/log-...new while the snapshot it follows is
// being saved, and DIR/spare, the file before the current one, which the next snapshot's
// file reuses: overwriting pages the page cache holds costs half of writing new ones (and far
// less when the kernel must first find pages for them), as RocksDB's and PostgreSQL's
// recycled logs do.
//
// A record is a 40-byte header (magic, flags, frame count, CRC32C, body bytes, the
// snapshot's sequence and time), each frame's size (u64), the frames (an encoded
// ReplAppendMsg) and a 16-byte trailer (magic, CRC, the record's offset). The header's CRC
// covers the header, the sizes and the first frame (the append's header: every entry's
// index, term and kind); with kFsync the trailer's CRC covers the whole record. The log ends
// at the first record that does not verify: one cut short by the process's death (a copy
// that stops early leaves a prefix, so its trailer is missing) or an older file's bytes
// (another snapshot's id, or no record at all). Such a record was never acknowledged.
//
// With kWrite the current file's first kMappedBytes are reserved on the disk (fallocate: a
// full disk is an error here, never a SIGBUS later) and mapped, and records are copied into
// the mapping with non-temporal stores: into the page cache without the write(2) path's
// work per page, and without evicting from the CPU's caches the tables the replica updates
// next. Records past the mapping, and every record with kFsync, are written with pwritev.
// Not thread-safe (the replica's serving loop).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "leash/common/message.h"
#include "leash/common/status.h"

namespace leash::server {

// Which snapshot a file follows. {0, 0}: none (the state a replica starts empty with).
struct DurableSnapshotId {
  uint64_t sequence = 0;
  int64_t unix_ms = 0;
  bool operator==(const DurableSnapshotId&) const = default;
};

struct DurableLogRecord {
  bool could_lead = false;  // the replica could lead with the log as it stood then
  Message append;           // an encoded ReplAppendMsg (wire.h)
};

class DurableLog {
 public:
  enum class Sync {
    kWrite,  // write(2) before acknowledging: survives the process (SIGKILL, OOM kill)
    kFsync,  // and fdatasync(2): survives the host (a power cut)
  };
  // Creates `dir` if needed. Nothing is read or written yet.
  static Result<std::unique_ptr<DurableLog>> Open(std::string dir, Sync sync);
  ~DurableLog();
  DurableLog(const DurableLog&) = delete;
  DurableLog& operator=(const DurableLog&) = delete;

  // The records of the file that follows snapshot `id`, in order, up to its end (above;
  // where it ended before the file's size is logged). NotFound: no such file. IOError.
  Result<std::vector<DurableLogRecord>> Read(DurableSnapshotId id) const;
  // Starts the file that follows snapshot `id` (in the spare file if there is one), `base`
  // its first record. Called before that snapshot is saved; appends go on to the current
  // file until Commit.
  Status Begin(DurableSnapshotId id, bool could_lead, const Message& base);
  // The snapshot was saved: the file begun becomes the current one, the current one the
  // spare, and every other is deleted.
  Status Commit();
  // The snapshot was not saved: the file begun is deleted.
  void Abort();
  // Appends a record to the current file, written when it returns. FailedPrecondition
  // without a current file.
  Status Append(bool could_lead, const Message& append);
  // kFsync: every record appended so far is on the disk when it returns (one fdatasync for
  // all of them: a primary syncs once before it releases replies). kWrite: nothing to do.
  Status MakeDurable();

  // The part of the current file a kWrite log maps (see above).
  static constexpr uint64_t kMappedBytes = uint64_t{128} << 20;

  bool has_current() const { return fd_ >= 0; }
  // Records copied into the mapping (the rest were written with pwritev).
  uint64_t records_mapped() const { return records_mapped_; }
  // Bytes of the current file (what a restart would read).
  uint64_t current_bytes() const { return current_bytes_; }
  uint64_t records_written() const { return records_written_; }
  uint64_t bytes_written() const { return bytes_written_; }
  const std::string& dir() const { return dir_; }

 private:
  DurableLog(std::string dir, Sync sync) : dir_(std::move(dir)), sync_(sync) {}
  std::string PathOf(DurableSnapshotId id, bool pending) const;
  // Writes one record of the file of snapshot `id` at `*offset` of `fd` (and moves it),
  // into `map` (the file's first `map_bytes`) if it fits there.
  Status WriteRecord(int fd, DurableSnapshotId id, uint64_t* offset, bool could_lead,
                     const Message& append, const std::string& path, uint8_t* map = nullptr,
                     uint64_t map_bytes = 0);
  // kWrite: reserves and maps the current file's first kMappedBytes (nothing if that fails:
  // said once, and records are written with pwritev).
  void MapCurrent();
  void Unmap();

  std::string dir_;
  Sync sync_;
  int fd_ = -1;  // the current file
  std::string path_;
  DurableSnapshotId id_;
  uint64_t current_bytes_ = 0;
  uint8_t* map_ = nullptr;  // the current file's mapping (kWrite)
  uint64_t map_bytes_ = 0;
  bool map_failed_said_ = false;
  uint64_t records_mapped_ = 0;
  bool unsynced_ = false;  // records appended since the last fdatasync
  int next_fd_ = -1;       // the file begun
  DurableSnapshotId next_id_;
  std::string next_path_;
  std::string next_final_path_;
  uint64_t next_bytes_ = 0;
  uint64_t records_written_ = 0;
  uint64_t bytes_written_ = 0;
};

}  // namespace leash::server

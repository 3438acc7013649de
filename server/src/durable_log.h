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
// less when the kernel must first reclaim memory for them), as RocksDB's and PostgreSQL's
// recycled logs do. A record is a 40-byte header (magic, flags, frame count, CRC32C, body
// bytes, the snapshot's sequence and time), each frame's size (u64), the frames (an encoded
// ReplAppendMsg) and a 16-byte trailer (magic, CRC, the record's offset). The header's CRC
// covers the header, the sizes and the first frame (the append's header: every entry's index,
// term and kind); with kFsync the trailer's CRC covers the whole record. The log ends at the
// first record that does not verify: one cut short by the process's death (a write that
// stops early leaves a prefix, so its trailer is missing) or an older file's bytes (another
// snapshot's id, or no record at all). Such a record was never acknowledged.
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

  bool has_current() const { return fd_ >= 0; }
  // Bytes of the current file (what a restart would read).
  uint64_t current_bytes() const { return current_bytes_; }
  uint64_t records_written() const { return records_written_; }
  uint64_t bytes_written() const { return bytes_written_; }
  // fdatasyncs made by MakeDurable (kFsync) and the seconds they took in all.
  uint64_t syncs() const { return syncs_; }
  double sync_seconds() const { return sync_seconds_; }
  const std::string& dir() const { return dir_; }

 private:
  DurableLog(std::string dir, Sync sync) : dir_(std::move(dir)), sync_(sync) {}
  std::string PathOf(DurableSnapshotId id, bool pending) const;
  // Writes one record of the file of snapshot `id` at `*offset` of `fd` (and moves it).
  Status WriteRecord(int fd, DurableSnapshotId id, uint64_t* offset, bool could_lead,
                     const Message& append, const std::string& path);

  std::string dir_;
  Sync sync_;
  int fd_ = -1;  // the current file
  std::string path_;
  DurableSnapshotId id_;
  uint64_t current_bytes_ = 0;
  bool unsynced_ = false;  // records appended since the last fdatasync
  int next_fd_ = -1;       // the file begun
  DurableSnapshotId next_id_;
  std::string next_path_;
  std::string next_final_path_;
  uint64_t next_bytes_ = 0;
  uint64_t records_written_ = 0;
  uint64_t bytes_written_ = 0;
  uint64_t syncs_ = 0;
  double sync_seconds_ = 0;
};

}  // namespace leash::server

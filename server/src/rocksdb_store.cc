// SnapshotStore on RocksDB: the key layout, the little-endian record encoding, CRC32C checks
// on every piece, and the one place rocksdb::Status becomes leash::Status. A store object is
// used by one thread at a time; RocksDB's LOCK file keeps a second process out of the directory.
//
// Key layout (all in the default column family; numbers in keys are 8 lower-case hex digits so
// that keys sort by number, numbers in values are little-endian):
//
//   leash/identity                              magic "leash-shard", format version, shard,
//                                               num_shards, CRC32C. Written once, never deleted.
//   snap/manifest                               sequence, min_clock, unix_ms, chunk size,
//                                               counts and the CRC32C of every other snap/ key
//                                               below, then a CRC32C of itself.
//   snap/workers                                every WorkerClock, the data-coverage bytes, then
//                                               each worker's staleness, speed and push decision.
//   snap/table/<id>/meta                        spec bytes, row range, cols, optimizer steps,
//                                               slot count.
//   snap/table/<id>/values/<chunk>              values, at most chunk_bytes per key.
//   snap/table/<id>/slot/<slot>/<chunk>         optimizer slot `slot`, chunked like the values.
//
// Save writes one WriteBatch: DeleteRange over snap/ followed by every new snap/ key, so a
// crash leaves either the whole previous snapshot or the whole new one (the write-ahead log
// drops a record cut short at its end; tests/durability_test.cc kills a shard mid-write).
// An existing directory is checked read-only before it is opened for writing, so one that
// is refused (damaged, foreign, another shard's) is left byte for byte as it was.
#include "leash/server/rocksdb_store.h"

#include "leash/common/crc32c.h"

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/status.h>
#include <rocksdb/write_batch.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "leash/common/wire.h"
#include "rocksdb_common.h"

namespace leash::server {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kMagic = "leash-shard";
constexpr uint32_t kFormatVersion = 1;

constexpr std::string_view kIdentityKey = "leash/identity";
constexpr std::string_view kSnapshotPrefix = "snap/";
constexpr std::string_view kSnapshotEnd = "snap0";  // '0' follows '/': the end of the snap/ range
constexpr std::string_view kManifestKey = "snap/manifest";
constexpr std::string_view kWorkersKey = "snap/workers";
// Only in a replica's final snapshot (ShardSnapshot::replica_stop), sealed with its CRC32C.
constexpr std::string_view kReplicaStopKey = "snap/replica_stop";
// Snapshots smaller than this share the memtable until it holds this many bytes.
constexpr uint64_t kMinFlushBytes = 4u << 20;

// What a person can do about a damaged snapshot.

// ---------------------------------------------------------------------------------------------
// Little-endian encoding.

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
}
void PutI64(std::string* out, int64_t v) { PutU64(out, static_cast<uint64_t>(v)); }
void PutBytes(std::string* out, std::string_view bytes) {
  PutU32(out, static_cast<uint32_t>(bytes.size()));
  out->append(bytes);
}
// Appends the record's CRC32C so that Decoder::StripCrc can check it.
void SealWithCrc(std::string* out) { PutU32(out, Crc32c(*out)); }

// Reads what the Put* functions wrote. Every read is bounds-checked; once one fails, all later
// ones fail too, so a caller may check ok() once at the end.
class Decoder {
 public:
  explicit Decoder(std::string_view in) : in_(in) {}

  bool U32(uint32_t* v) { return Fixed(v, 4); }
  bool U64(uint64_t* v) { return Fixed(v, 8); }
  bool I64(int64_t* v) {
    uint64_t u = 0;
    if (!Fixed(&u, 8)) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }
  bool Bytes(std::string_view* v) {
    uint32_t n = 0;
    if (!U32(&n) || in_.size() < n) return Fail();
    *v = in_.substr(0, n);
    in_.remove_prefix(n);
    return true;
  }
  // Checks and removes the trailing CRC32C written by SealWithCrc.
  bool StripCrc() {
    if (!ok_ || in_.size() < 4) return Fail();
    std::string_view body = in_.substr(0, in_.size() - 4);
    Decoder tail(in_.substr(in_.size() - 4));
    uint32_t stored = 0;
    if (!tail.U32(&stored) || stored != Crc32c(body)) return Fail();
    in_ = body;
    return true;
  }
  size_t remaining() const { return in_.size(); }
  bool ok() const { return ok_; }
  // True when everything was read successfully and nothing is left over.
  bool done() const { return ok_ && in_.empty(); }

 private:
  template <typename T>
  bool Fixed(T* v, int n) {
    if (!ok_ || in_.size() < static_cast<size_t>(n)) return Fail();
    T r = 0;
    for (int i = 0; i < n; ++i)
      r |= static_cast<T>(static_cast<unsigned char>(in_[static_cast<size_t>(i)])) << (8 * i);
    *v = r;
    in_.remove_prefix(static_cast<size_t>(n));
    return true;
  }
  bool Fail() {
    ok_ = false;
    return false;
  }

  std::string_view in_;
  bool ok_ = true;
};

// A replica's stop record as stored: the record sealed with its CRC32C, as the other records.
std::string EncodeReplicaStop(const std::string& record) {
  std::string out = record;
  SealWithCrc(&out);
  return out;
}
Result<std::string> DecodeReplicaStop(std::string_view stored) {
  Decoder d(stored);
  if (!d.StripCrc() || d.remaining() == 0)
    return DataLoss("the replica's stop record (key snap/replica_stop) fails its checksum");
  return std::string(stored.substr(0, d.remaining()));
}

// Floats travel as little-endian IEEE-754 bit patterns (NaN payloads and -0 survive).
void EncodeFloats(std::span<const float> in, std::string* out) {
  out->resize(in.size() * sizeof(float));
  if constexpr (std::endian::native == std::endian::little) {
    if (!in.empty()) std::memcpy(out->data(), in.data(), out->size());
  } else {
    for (size_t i = 0; i < in.size(); ++i) {
      const auto bits = std::bit_cast<uint32_t>(in[i]);
      for (size_t b = 0; b < 4; ++b)
        (*out)[4 * i + b] = static_cast<char>((bits >> (8 * b)) & 0xffu);
    }
  }
}

// `bytes.size()` is a multiple of 4; appends bytes.size() / 4 floats to `out`.
void AppendDecodedFloats(std::string_view bytes, std::vector<float>* out) {
  const size_t n = bytes.size() / sizeof(float);
  const size_t old = out->size();
  out->resize(old + n);
  if constexpr (std::endian::native == std::endian::little) {
    if (n > 0) std::memcpy(out->data() + old, bytes.data(), n * sizeof(float));
  } else {
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits = 0;
      for (size_t b = 0; b < 4; ++b)
        bits |= uint32_t{static_cast<unsigned char>(bytes[4 * i + b])} << (8 * b);
      (*out)[old + i] = std::bit_cast<float>(bits);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Keys.

void AppendHex32(std::string* out, uint32_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  for (int shift = 28; shift >= 0; shift -= 4) out->push_back(kDigits[(v >> shift) & 0xfu]);
}

std::string TablePrefix(uint32_t table_id) {
  std::string k = "snap/table/";
  AppendHex32(&k, table_id);
  k += '/';
  return k;
}
std::string TableMetaKey(uint32_t table_id) { return TablePrefix(table_id) + "meta"; }

// The key of chunk `chunk` of array `array` of a table: array 0 is the values, array s + 1 is
// optimizer slot s.
std::string ChunkKey(uint32_t table_id, uint32_t array, uint32_t chunk) {
  std::string k = TablePrefix(table_id);
  if (array == 0) {
    k += "values/";
  } else {
    k += "slot/";
    AppendHex32(&k, array - 1);
    k += '/';
  }
  AppendHex32(&k, chunk);
  return k;
}

std::string ArrayName(uint32_t table_id, uint32_t array) {
  std::string s = "table " + std::to_string(table_id) + " ";
  if (array == 0) return s + "values";
  return s + "optimizer slot " + std::to_string(array - 1);
}

std::string IdentityString(uint32_t shard, uint32_t num_shards) {
  return "shard " + std::to_string(shard) + " of " + std::to_string(num_shards);
}

// ---------------------------------------------------------------------------------------------
// Records.

std::string EncodeIdentity(uint32_t shard, uint32_t num_shards) {
  std::string out;
  PutBytes(&out, kMagic);
  PutU32(&out, kFormatVersion);
  PutU32(&out, shard);
  PutU32(&out, num_shards);
  SealWithCrc(&out);
  return out;
}

// The per-table part of the manifest.
struct ManifestTable {
  uint32_t table_id = 0;
  uint32_t meta_crc = 0;
  uint32_t num_slots = 0;
  uint64_t num_floats = 0;     // in the values and in each slot
  uint32_t chunk_count = 0;    // per array
  std::vector<uint32_t> crcs;  // (1 + num_slots) * chunk_count: values' chunks, then slot 0's, ...
};

struct Manifest {
  uint32_t shard = 0;
  uint32_t num_shards = 0;
  uint64_t sequence = 0;
  int64_t min_clock = 0;
  int64_t unix_ms = 0;
  uint32_t chunk_bytes = 0;
  uint32_t num_workers = 0;
  uint32_t workers_crc = 0;
  std::vector<ManifestTable> tables;
};

std::string EncodeManifest(const Manifest& m) {
  std::string out;
  PutU32(&out, m.shard);
  PutU32(&out, m.num_shards);
  PutU64(&out, m.sequence);
  PutI64(&out, m.min_clock);
  PutI64(&out, m.unix_ms);
  PutU32(&out, m.chunk_bytes);
  PutU32(&out, m.num_workers);
  PutU32(&out, m.workers_crc);
  PutU32(&out, static_cast<uint32_t>(m.tables.size()));
  for (const ManifestTable& t : m.tables) {
    PutU32(&out, t.table_id);
    PutU32(&out, t.meta_crc);
    PutU32(&out, t.num_slots);
    PutU64(&out, t.num_floats);
    PutU32(&out, t.chunk_count);
    for (uint32_t c : t.crcs) PutU32(&out, c);
  }
  SealWithCrc(&out);
  return out;
}

bool DecodeManifest(std::string_view bytes, Manifest* m) {
  Decoder d(bytes);
  uint32_t num_tables = 0;
  if (!d.StripCrc() || !d.U32(&m->shard) || !d.U32(&m->num_shards) || !d.U64(&m->sequence) ||
      !d.I64(&m->min_clock) || !d.I64(&m->unix_ms) || !d.U32(&m->chunk_bytes) ||
      !d.U32(&m->num_workers) || !d.U32(&m->workers_crc) || !d.U32(&num_tables)) {
    return false;
  }
  for (uint32_t i = 0; i < num_tables; ++i) {
    ManifestTable t;
    if (!d.U32(&t.table_id) || !d.U32(&t.meta_crc) || !d.U32(&t.num_slots) ||
        !d.U64(&t.num_floats) || !d.U32(&t.chunk_count)) {
      return false;
    }
    const uint64_t n = (uint64_t{t.num_slots} + 1) * t.chunk_count;
    if (n > d.remaining() / 4) return false;  // checked before allocating
    t.crcs.resize(static_cast<size_t>(n));
    for (uint32_t& c : t.crcs) d.U32(&c);
    m->tables.push_back(std::move(t));
  }
  return d.done();
}

std::string EncodeTableMeta(const TableSnapshot& t) {
  std::string out;
  PutU32(&out, t.table_id);
  PutU64(&out, t.row_begin);
  PutU64(&out, t.row_end);
  PutU32(&out, t.cols);
  PutU64(&out, t.optimizer_steps);
  PutU32(&out, static_cast<uint32_t>(t.slots.size()));
  // The spec as the codec serializes it, the bytes every release so far has written.
  std::vector<uint8_t> spec = EncodeTableSpec(t.spec);
  PutBytes(&out, std::string_view(reinterpret_cast<const char*>(spec.data()), spec.size()));
  // The iterations of the pending clock steps, the last of `slots` (TableSnapshot). Written
  // only when there are some, so a table without them is stored as before they existed.
  if (!t.pending_clocks.empty()) {
    PutU32(&out, static_cast<uint32_t>(t.pending_clocks.size()));
    for (int64_t c : t.pending_clocks) PutI64(&out, c);
  }
  return out;
}

bool DecodeTableMeta(std::string_view bytes, TableSnapshot* t, uint32_t* num_slots) {
  Decoder d(bytes);
  std::string_view spec;
  if (!d.U32(&t->table_id) || !d.U64(&t->row_begin) || !d.U64(&t->row_end) || !d.U32(&t->cols) ||
      !d.U64(&t->optimizer_steps) || !d.U32(num_slots) || !d.Bytes(&spec)) {
    return false;
  }
  if (!d.done()) {
    uint32_t pending = 0;
    if (!d.U32(&pending) || pending > *num_slots || pending > d.remaining() / 8) return false;
    t->pending_clocks.resize(pending);
    for (int64_t& c : t->pending_clocks) d.I64(&c);
    if (!d.done()) return false;
  }
  auto decoded =
      DecodeTableSpec(std::span(reinterpret_cast<const uint8_t*>(spec.data()), spec.size()));
  if (!decoded.ok()) return false;
  t->spec = std::move(*decoded);
  return true;
}

// The worker clocks, followed by the job's data-coverage state (opaque bytes), then how the
// shard judges each worker's next requests (WorkerClock's staleness, speed and push
// decision), one record per worker in the same order. Snapshots written before that last
// part existed end after the coverage; their workers decode with the defaults (re-learned
// from their next pull and clock).
std::string EncodeWorkers(const std::vector<WorkerClock>& workers,
                          const std::vector<uint8_t>& coverage) {
  std::string out;
  PutU32(&out, static_cast<uint32_t>(workers.size()));
  for (const WorkerClock& w : workers) {
    PutU64(&out, w.worker_id);
    PutU64(&out, w.incarnation);
    PutI64(&out, w.clock);
    PutU64(&out, w.last_seq);
    PutBytes(&out, w.name);
  }
  PutBytes(&out, std::string_view(reinterpret_cast<const char*>(coverage.data()), coverage.size()));
  PutU32(&out, static_cast<uint32_t>(workers.size()));
  for (const WorkerClock& w : workers) {
    PutI64(&out, w.staleness);
    PutU64(&out, std::bit_cast<uint64_t>(w.samples_per_second));
    PutI64(&out, w.push_decided_clock);
    PutU32(&out, (w.speed_reported ? 1u : 0u) | (w.push_dropped ? 2u : 0u));
  }
  return out;
}

bool DecodeWorkers(std::string_view bytes, std::vector<WorkerClock>* workers,
                   std::vector<uint8_t>* coverage) {
  Decoder d(bytes);
  uint32_t n = 0;
  if (!d.U32(&n)) return false;
  for (uint32_t i = 0; i < n; ++i) {
    WorkerClock w;
    std::string_view name;
    if (!d.U64(&w.worker_id) || !d.U64(&w.incarnation) || !d.I64(&w.clock) || !d.U64(&w.last_seq) ||
        !d.Bytes(&name)) {
      return false;
    }
    w.name.assign(name);
    workers->push_back(std::move(w));
  }
  std::string_view cov;
  if (!d.Bytes(&cov)) return false;
  coverage->assign(cov.begin(), cov.end());
  if (d.done()) return true;  // written before the judgement records existed
  uint32_t m = 0;
  if (!d.U32(&m) || m != n) return false;
  for (WorkerClock& w : *workers) {
    uint64_t speed = 0;
    uint32_t flags = 0;
    if (!d.I64(&w.staleness) || !d.U64(&speed) || !d.I64(&w.push_decided_clock) || !d.U32(&flags) ||
        flags > 3) {
      return false;
    }
    w.samples_per_second = std::bit_cast<double>(speed);
    w.speed_reported = (flags & 1u) != 0;
    w.push_dropped = (flags & 2u) != 0;
  }
  return d.done();
}

// Number of chunks of at most `chunk_bytes` that hold `num_floats` floats; nullopt if more
// than a uint32_t can count.
std::optional<uint32_t> ChunkCount(uint64_t num_floats, uint32_t chunk_bytes) {
  if (num_floats > UINT64_MAX / sizeof(float)) return std::nullopt;
  const uint64_t bytes = num_floats * sizeof(float);
  const uint64_t chunks = bytes / chunk_bytes + (bytes % chunk_bytes != 0 ? 1 : 0);
  if (chunks > UINT32_MAX) return std::nullopt;
  return static_cast<uint32_t>(chunks);
}

// ---------------------------------------------------------------------------------------------
// Directory checks before RocksDB touches anything.

// RocksDB refuses nothing: pointed at a home directory it would happily create a database
// there. Returns whether the directory is new (or empty), ok to create a database in.
Result<bool> PrepareDirectory(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return IOError("cannot inspect data directory " + path + ": " + ec.message());
  }
  if (!fs::exists(st)) {
    fs::create_directories(path, ec);
    if (ec) return IOError("cannot create data directory " + path + ": " + ec.message());
    return true;
  }
  if (!fs::is_directory(st)) {
    return FailedPrecondition("data directory " + path +
                              " exists and is not a directory; point --data-dir at a directory");
  }
  bool empty = true;
  bool has_current = false;
  bool has_manifest = false;
  bool looks_like_rocksdb =
      false;  // files only RocksDB makes: a damaged database, not a foreign directory
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == "lost+found") continue;  // the root of a freshly formatted volume
    empty = false;
    if (name == "CURRENT") has_current = true;
    if (name.starts_with("MANIFEST-")) has_manifest = true;
    if (name == "IDENTITY" || name.starts_with("OPTIONS-") || name.ends_with(".sst") ||
        (name.ends_with(".log") && name.find_first_not_of("0123456789") == name.size() - 4)) {
      looks_like_rocksdb = true;
    }
  }
  if (ec) return IOError("cannot list data directory " + path + ": " + ec.message());
  if (empty) return true;
  if ((!has_current || !has_manifest) && looks_like_rocksdb) {
    return DataLoss(
        "data directory " + path + " holds a damaged RocksDB database: its " +
        (has_current ? std::string("MANIFEST-* file is") : std::string("CURRENT file is")) +
        " missing, so its snapshots cannot be read; nothing was changed in it" +
        std::string(kDamagedHint));
  }
  if (!has_current || !has_manifest) {
    return FailedPrecondition(
        "data directory " + path +
        " is not empty and is not a Leash shard store (it holds no RocksDB database); "
        "nothing was written to it. Point --data-dir at an empty or new directory");
  }
  return false;
}

// ---------------------------------------------------------------------------------------------

class RocksDbStore final : public SnapshotStore {
 public:
  RocksDbStore(RocksDbStoreOptions options, std::unique_ptr<rocksdb::DB> db, size_t memtable_bytes)
      : options_(std::move(options)), db_(std::move(db)), memtable_bytes_(memtable_bytes) {}

  Result<std::optional<ShardSnapshot>> Load() override;
  Result<std::string> LoadReplicaStop() override;
  Status Save(const ShardSnapshot& snapshot) override;
  std::string Describe() const override { return "rocksdb:" + options_.path; }

 private:
  Status Validate(const ShardSnapshot& snapshot) const;
  Status BuildBatch(const ShardSnapshot& snapshot, rocksdb::WriteBatch* batch) const;
  Status ReadArray(const rocksdb::ReadOptions& ro, const Manifest& m, const ManifestTable& t,
                   uint32_t array, std::vector<float>* out) const;
  Status Damaged(const Manifest& m, const std::string& what) const {
    return DataLoss("snapshot #" + std::to_string(m.sequence) + " in " + options_.path +
                    " is damaged: " + what + std::string(kDamagedHint));
  }

  RocksDbStoreOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  size_t memtable_bytes_;
};

// Releases a RocksDB read snapshot.
class ReadSnapshot {
 public:
  explicit ReadSnapshot(rocksdb::DB* db) : db_(db), snap_(db->GetSnapshot()) {}
  ~ReadSnapshot() { db_->ReleaseSnapshot(snap_); }
  ReadSnapshot(const ReadSnapshot&) = delete;
  ReadSnapshot& operator=(const ReadSnapshot&) = delete;
  const rocksdb::Snapshot* get() const { return snap_; }

 private:
  rocksdb::DB* db_;
  const rocksdb::Snapshot* snap_;
};

Status RocksDbStore::Validate(const ShardSnapshot& s) const {
  if (s.shard != options_.shard || s.num_shards != options_.num_shards) {
    return InvalidArgument("cannot save a snapshot of " + IdentityString(s.shard, s.num_shards) +
                           " into " + options_.path + ", which belongs to " +
                           IdentityString(options_.shard, options_.num_shards));
  }
  std::set<uint32_t> ids;
  for (const TableSnapshot& t : s.tables) {
    const std::string name = "table " + std::to_string(t.table_id);
    if (!ids.insert(t.table_id).second) return InvalidArgument("snapshot holds " + name + " twice");
    if (t.row_end < t.row_begin) return InvalidArgument(name + " has row_end before row_begin");
    const uint64_t rows = t.row_end - t.row_begin;
    if (t.cols != 0 && rows > UINT64_MAX / t.cols)
      return InvalidArgument(name + " has too many rows");
    if (t.values.size() != rows * t.cols) {
      return InvalidArgument(name + " has " + std::to_string(t.values.size()) +
                             " values, expected rows * cols = " + std::to_string(rows * t.cols));
    }
    for (size_t i = 0; i < t.slots.size(); ++i) {
      if (t.slots[i].size() != t.values.size()) {
        return InvalidArgument(name + " optimizer slot " + std::to_string(i) + " has " +
                               std::to_string(t.slots[i].size()) + " floats, expected " +
                               std::to_string(t.values.size()));
      }
    }
    if (!ChunkCount(t.values.size(), options_.chunk_bytes) || t.slots.size() >= UINT32_MAX ||
        t.spec.name.size() > UINT32_MAX) {
      return InvalidArgument(name + " is too large to store");
    }
  }
  for (const WorkerClock& w : s.workers) {
    if (w.name.size() > UINT32_MAX) return InvalidArgument("worker name too long");
  }
  if (s.tables.size() > UINT32_MAX || s.workers.size() > UINT32_MAX)
    return InvalidArgument("snapshot too large");
  return Status::Ok();
}

Status RocksDbStore::BuildBatch(const ShardSnapshot& s, rocksdb::WriteBatch* batch) const {
  auto put = [&](const std::string& key, rocksdb::Slice value) {
    return FromRocksDb(batch->Put(key, value), options_.path, "writing snapshot to");
  };
  LEASH_RETURN_IF_ERROR(
      FromRocksDb(batch->DeleteRange(std::string(kSnapshotPrefix), std::string(kSnapshotEnd)),
                  options_.path, "writing snapshot to"));

  Manifest m;
  m.shard = s.shard;
  m.num_shards = s.num_shards;
  m.sequence = s.sequence;
  m.min_clock = s.min_clock;
  m.unix_ms = s.unix_ms;
  m.chunk_bytes = options_.chunk_bytes;
  m.num_workers = static_cast<uint32_t>(s.workers.size());

  const size_t chunk_floats = options_.chunk_bytes / sizeof(float);
  std::string buf;
  for (const TableSnapshot& t : s.tables) {
    ManifestTable mt;
    mt.table_id = t.table_id;
    mt.num_slots = static_cast<uint32_t>(t.slots.size());
    mt.num_floats = t.values.size();
    mt.chunk_count = *ChunkCount(t.values.size(), options_.chunk_bytes);
    const std::string meta = EncodeTableMeta(t);
    mt.meta_crc = Crc32c(meta);
    LEASH_RETURN_IF_ERROR(put(TableMetaKey(t.table_id), meta));
    for (uint32_t array = 0; array <= mt.num_slots; ++array) {
      const std::vector<float>& data = array == 0 ? t.values : t.slots[array - 1];
      for (uint32_t c = 0; c < mt.chunk_count; ++c) {
        const size_t begin = c * chunk_floats;
        const size_t n = std::min(chunk_floats, data.size() - begin);
        EncodeFloats(std::span<const float>(data.data() + begin, n), &buf);
        mt.crcs.push_back(Crc32c(buf));
        LEASH_RETURN_IF_ERROR(put(ChunkKey(t.table_id, array, c), buf));
      }
    }
    m.tables.push_back(std::move(mt));
  }
  const std::string workers = EncodeWorkers(s.workers, s.coverage);
  m.workers_crc = Crc32c(workers);
  LEASH_RETURN_IF_ERROR(put(std::string(kWorkersKey), workers));
  if (!s.replica_stop.empty())
    LEASH_RETURN_IF_ERROR(put(std::string(kReplicaStopKey), EncodeReplicaStop(s.replica_stop)));
  return put(std::string(kManifestKey), EncodeManifest(m));
}

Status RocksDbStore::Save(const ShardSnapshot& snapshot) {
  LEASH_RETURN_IF_ERROR(Validate(snapshot));
  size_t floats = 0;
  for (const TableSnapshot& t : snapshot.tables) floats += t.values.size() * (1 + t.slots.size());
  try {
    // Reserved up front so that a snapshot of hundreds of MB is not copied while the batch grows.
    rocksdb::WriteBatch batch(floats * sizeof(float) + 64 * 1024);
    LEASH_RETURN_IF_ERROR(BuildBatch(snapshot, &batch));
    rocksdb::WriteOptions wo;
    wo.sync = options_.sync;
    LEASH_RETURN_IF_ERROR(
        FromRocksDb(db_->Write(wo, &batch), options_.path, "writing snapshot to"));
    // Each snapshot replaces the last, but the memtable keeps every one written since its
    // last flush until it reaches write_buffer_size (64 MiB): a shard's RSS would creep up by
    // a snapshot per checkpoint (the soak test saw it). Flush in the background once it holds
    // about two snapshots, or a whole one that is larger than the buffer. The snapshot is
    // already durable in the WAL, and a failed flush resurfaces on the next write.
    uint64_t active = 0;
    db_->GetIntProperty(rocksdb::DB::Properties::kCurSizeActiveMemTable, &active);
    const uint64_t batch_bytes = batch.GetDataSize();
    if (batch_bytes >= memtable_bytes_ ||
        active >= std::max<uint64_t>(kMinFlushBytes, 2 * batch_bytes)) {
      rocksdb::FlushOptions fo;
      fo.wait = false;
      db_->Flush(fo).PermitUncheckedError();
    }
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory while writing snapshot #" +
                             std::to_string(snapshot.sequence) + " to " + options_.path +
                             "; the previous snapshot is kept");
  }
  return Status::Ok();
}

Status RocksDbStore::ReadArray(const rocksdb::ReadOptions& ro, const Manifest& m,
                               const ManifestTable& t, uint32_t array,
                               std::vector<float>* out) const {
  const std::string name = ArrayName(t.table_id, array);
  try {
    out->reserve(static_cast<size_t>(t.num_floats));
  } catch (const std::exception&) {
    return ResourceExhausted("cannot allocate " + std::to_string(t.num_floats) + " floats for " +
                             name + " of snapshot #" + std::to_string(m.sequence) + " in " +
                             options_.path);
  }
  const uint64_t total_bytes = t.num_floats * sizeof(float);
  rocksdb::PinnableSlice v;
  for (uint32_t c = 0; c < t.chunk_count; ++c) {
    const std::string key = ChunkKey(t.table_id, array, c);
    const std::string piece = name + " chunk " + std::to_string(c) + " of " +
                              std::to_string(t.chunk_count) + " (key " + key + ")";
    v.Reset();
    const rocksdb::Status s = db_->Get(ro, db_->DefaultColumnFamily(), key, &v);
    if (s.IsNotFound()) return Damaged(m, piece + " is missing");
    LEASH_RETURN_IF_ERROR(FromRocksDb(s, options_.path, "reading " + piece + " from"));
    const uint64_t expected =
        std::min<uint64_t>(m.chunk_bytes, total_bytes - uint64_t{c} * m.chunk_bytes);
    if (v.size() != expected) {
      return Damaged(m, piece + " has " + std::to_string(v.size()) + " bytes, expected " +
                            std::to_string(expected));
    }
    if (Crc32c(v.data(), v.size()) != t.crcs[size_t{array} * t.chunk_count + c]) {
      return Damaged(m, piece + " fails its checksum");
    }
    AppendDecodedFloats(std::string_view(v.data(), v.size()), out);
  }
  return Status::Ok();
}

Result<std::string> RocksDbStore::LoadReplicaStop() {
  ReadSnapshot snap(db_.get());
  rocksdb::ReadOptions ro;
  ro.snapshot = snap.get();
  ro.verify_checksums = true;
  std::string bytes;
  rocksdb::Status s = db_->Get(ro, std::string(kManifestKey), &bytes);
  if (s.IsNotFound()) return std::string();  // no snapshot (Load says whether that is damage)
  LEASH_RETURN_IF_ERROR(FromRocksDb(s, options_.path, "reading snapshot manifest from"));
  s = db_->Get(ro, std::string(kReplicaStopKey), &bytes);
  if (s.IsNotFound()) return std::string();
  LEASH_RETURN_IF_ERROR(FromRocksDb(s, options_.path, "reading the replica's stop record from"));
  return DecodeReplicaStop(bytes);
}

Result<std::optional<ShardSnapshot>> RocksDbStore::Load() {
  ReadSnapshot snap(db_.get());
  rocksdb::ReadOptions ro;
  ro.snapshot = snap.get();
  ro.verify_checksums = true;
  ro.fill_cache = false;  // read once at start-up; keep the block cache for nothing else
  const std::string& path = options_.path;

  std::string manifest_bytes;
  rocksdb::Status s = db_->Get(ro, std::string(kManifestKey), &manifest_bytes);
  if (s.IsNotFound()) {
    // A snapshot is written in one batch, so snapshot keys without a manifest mean damage.
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
    it->Seek(std::string(kSnapshotPrefix));
    LEASH_RETURN_IF_ERROR(FromRocksDb(it->status(), path, "reading snapshot from"));
    if (it->Valid() && it->key().starts_with(std::string(kSnapshotPrefix))) {
      return DataLoss("the snapshot in " + path + " has no manifest (" + std::string(kManifestKey) +
                      ") but key " + it->key().ToString() + " exists" + std::string(kDamagedHint));
    }
    return std::optional<ShardSnapshot>();
  }
  LEASH_RETURN_IF_ERROR(FromRocksDb(s, path, "reading snapshot manifest from"));

  Manifest m;
  if (!DecodeManifest(manifest_bytes, &m)) {
    return DataLoss("the snapshot manifest (" + std::string(kManifestKey) + ") in " + path +
                    " is corrupt: checksum mismatch or truncated record" +
                    std::string(kDamagedHint));
  }
  if (m.shard != options_.shard || m.num_shards != options_.num_shards) {
    return FailedPrecondition(
        "the snapshot in " + path + " is of " + IdentityString(m.shard, m.num_shards) +
        ", but the store belongs to " + IdentityString(options_.shard, options_.num_shards) +
        "; point --data-dir at this shard's own directory");
  }
  if (m.chunk_bytes == 0 || m.chunk_bytes % sizeof(float) != 0) {
    return Damaged(m, "the manifest gives an impossible chunk size of " +
                          std::to_string(m.chunk_bytes) + " bytes");
  }

  ShardSnapshot out;
  out.shard = m.shard;
  out.num_shards = m.num_shards;
  out.sequence = m.sequence;
  out.min_clock = m.min_clock;
  out.unix_ms = m.unix_ms;

  std::string record;
  s = db_->Get(ro, std::string(kWorkersKey), &record);
  if (s.IsNotFound())
    return Damaged(m, "the worker clocks (key " + std::string(kWorkersKey) + ") are missing");
  LEASH_RETURN_IF_ERROR(FromRocksDb(s, path, "reading worker clocks from"));
  if (Crc32c(record) != m.workers_crc) return Damaged(m, "the worker clocks fail their checksum");
  if (!DecodeWorkers(record, &out.workers, &out.coverage) || out.workers.size() != m.num_workers) {
    return Damaged(m, "the worker clocks record is malformed");
  }

  s = db_->Get(ro, std::string(kReplicaStopKey), &record);
  if (!s.IsNotFound()) {
    LEASH_RETURN_IF_ERROR(FromRocksDb(s, path, "reading the replica's stop record from"));
    Result<std::string> stop = DecodeReplicaStop(record);
    if (!stop.ok()) return Damaged(m, stop.status().message());
    out.replica_stop = std::move(*stop);
  }

  out.tables.reserve(m.tables.size());
  for (const ManifestTable& mt : m.tables) {
    const std::string name = "table " + std::to_string(mt.table_id);
    const std::string meta_key = TableMetaKey(mt.table_id);
    s = db_->Get(ro, meta_key, &record);
    if (s.IsNotFound()) return Damaged(m, name + " record (key " + meta_key + ") is missing");
    LEASH_RETURN_IF_ERROR(FromRocksDb(s, path, "reading " + name + " from"));
    if (Crc32c(record) != mt.meta_crc)
      return Damaged(m, name + " record (key " + meta_key + ") fails its checksum");
    TableSnapshot t;
    uint32_t num_slots = 0;
    if (!DecodeTableMeta(record, &t, &num_slots) || t.table_id != mt.table_id ||
        num_slots != mt.num_slots) {
      return Damaged(
          m, name + " record (key " + meta_key + ") is malformed or disagrees with the manifest");
    }
    const uint64_t rows = t.row_end >= t.row_begin ? t.row_end - t.row_begin : 0;
    const bool sizes_ok = t.row_end >= t.row_begin &&
                          (t.cols == 0 || rows <= UINT64_MAX / t.cols) &&
                          rows * t.cols == mt.num_floats &&
                          ChunkCount(mt.num_floats, m.chunk_bytes) == mt.chunk_count;
    if (!sizes_ok) {
      return Damaged(m, name + " has rows [" + std::to_string(t.row_begin) + ", " +
                            std::to_string(t.row_end) + ") x " + std::to_string(t.cols) +
                            " cols but the manifest counts " + std::to_string(mt.num_floats) +
                            " floats in " + std::to_string(mt.chunk_count) + " chunks");
    }
    LEASH_RETURN_IF_ERROR(ReadArray(ro, m, mt, 0, &t.values));
    t.slots.resize(num_slots);
    for (uint32_t i = 0; i < num_slots; ++i)
      LEASH_RETURN_IF_ERROR(ReadArray(ro, m, mt, i + 1, &t.slots[i]));
    out.tables.push_back(std::move(t));
  }
  return std::optional<ShardSnapshot>(std::move(out));
}

// Reads the identity record, or stamps it into a database that holds nothing yet.
Status CheckOrStampIdentity(rocksdb::DB* db, const RocksDbStoreOptions& o) {
  const std::string ours = IdentityString(o.shard, o.num_shards);
  std::string value;
  rocksdb::Status s = db->Get(rocksdb::ReadOptions(), std::string(kIdentityKey), &value);
  if (s.IsNotFound()) {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
    it->SeekToFirst();
    LEASH_RETURN_IF_ERROR(FromRocksDb(it->status(), o.path, "opening"));
    if (it->Valid()) {
      return FailedPrecondition("data directory " + o.path +
                                " holds a RocksDB database that is not a Leash shard store (no " +
                                std::string(kIdentityKey) +
                                " record); it was left as it was. Point --data-dir "
                                "elsewhere, or delete " +
                                o.path + " if its data is no longer needed");
    }
    rocksdb::WriteOptions wo;
    wo.sync = true;  // once per directory; a later crash must not forget whose it is
    return FromRocksDb(
        db->Put(wo, std::string(kIdentityKey), EncodeIdentity(o.shard, o.num_shards)), o.path,
        "stamping the identity of");
  }
  LEASH_RETURN_IF_ERROR(FromRocksDb(s, o.path, "reading the identity of"));

  Decoder d(value);
  std::string_view magic;
  if (!d.Bytes(&magic) || magic != kMagic) {
    return FailedPrecondition("data directory " + o.path +
                              " has an identity record that is not Leash's (magic \"" +
                              std::string(kMagic) + "\" missing); point --data-dir elsewhere");
  }
  Decoder full(value);
  uint32_t version = 0;
  uint32_t shard = 0;
  uint32_t num_shards = 0;
  if (!full.StripCrc() || !full.Bytes(&magic) || !full.U32(&version) || !full.U32(&shard) ||
      !full.U32(&num_shards) || !full.done()) {
    return DataLoss("the identity record (" + std::string(kIdentityKey) + ") of data directory " +
                    o.path + " is corrupt" + std::string(kDamagedHint));
  }
  if (version != kFormatVersion) {
    return VersionMismatch("data directory " + o.path + " was written in store format version " +
                           std::to_string(version) + ", but this leash-server reads version " +
                           std::to_string(kFormatVersion) +
                           "; run a leash-server that matches it, or point "
                           "--data-dir elsewhere");
  }
  if (shard != o.shard || num_shards != o.num_shards) {
    return FailedPrecondition("data directory " + o.path + " belongs to " +
                              IdentityString(shard, num_shards) + ", but this leash-server is " +
                              ours + "; point --data-dir elsewhere, or delete " + o.path +
                              " if its data is no longer needed");
  }
  return Status::Ok();
}

rocksdb::Options BaseOptions() {
  rocksdb::Options ro;
  ro.info_log = std::make_shared<SpdlogRocksDbLogger>();
  ro.paranoid_checks =
      true;  // the default; a corrupt MANIFEST or a missing/short SST fails the open
  // A write-ahead-log record cut short at the end (a crash in the middle of writing a
  // snapshot) is dropped and the previous snapshot is recovered; a record that is complete
  // but fails its checksum is damage, and the open fails instead of silently going back.
  ro.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  return ro;
}

// Opening an existing directory for writing may change files in it (WAL replay, a new
// MANIFEST and OPTIONS file), so it is first checked read-only: RocksDB's own consistency
// checks, the identity record, and the checksum of every table file. Whatever is found, a
// directory that fails here is left exactly as it was.
Status CheckReadOnly(const RocksDbStoreOptions& o) {
  auto damaged = [&](const std::string& what, const rocksdb::Status& s) {
    return DataLoss("data directory " + o.path + " is damaged: " + what + " (" + s.ToString() +
                    "); nothing was changed in it" + std::string(kDamagedHint));
  };
  // Damage shows as Corruption, or as IOError for a file the database lists but lacks.
  auto is_damage = [](const rocksdb::Status& s) {
    return s.IsCorruption() ||
           (s.IsIOError() && s.ToString().find("No such file") != std::string::npos);
  };
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::OpenForReadOnly(BaseOptions(), o.path, &raw);
  if (is_damage(s)) return damaged("RocksDB cannot open its database", s);
  LEASH_RETURN_IF_ERROR(FromRocksDb(s, o.path, "opening (read-only check of)"));
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string value;
  s = db->Get(rocksdb::ReadOptions(), std::string(kIdentityKey), &value);
  if (s.IsNotFound()) {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
    it->SeekToFirst();
    if (is_damage(it->status())) return damaged("reading its first key failed", it->status());
    LEASH_RETURN_IF_ERROR(FromRocksDb(it->status(), o.path, "opening"));
    if (it->Valid()) return CheckOrStampIdentity(db.get(), o);  // refuses: not a Leash store
  } else {
    if (is_damage(s)) return damaged("reading its identity record failed", s);
    LEASH_RETURN_IF_ERROR(FromRocksDb(s, o.path, "reading the identity of"));
    LEASH_RETURN_IF_ERROR(CheckOrStampIdentity(db.get(), o));  // finds it, so writes nothing
  }
  s = db->VerifyChecksum();
  if (!s.ok()) return damaged("a table file fails its checksum", s);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<SnapshotStore>> OpenRocksDbStore(const RocksDbStoreOptions& options) {
  if (options.path.empty()) return InvalidArgument("no data directory given; set --data-dir");
  if (options.num_shards == 0 || options.shard >= options.num_shards) {
    return InvalidArgument("bad shard identity " +
                           IdentityString(options.shard, options.num_shards) +
                           ": need shard < num_shards");
  }
  if (options.chunk_bytes < sizeof(float) || options.chunk_bytes % sizeof(float) != 0) {
    return InvalidArgument("chunk_bytes must be a positive multiple of 4, got " +
                           std::to_string(options.chunk_bytes));
  }
  LEASH_ASSIGN_OR_RETURN(const bool fresh, PrepareDirectory(options.path));
  if (!fresh) LEASH_RETURN_IF_ERROR(CheckReadOnly(options));

  rocksdb::Options ro = BaseOptions();
  ro.create_if_missing = fresh;
  rocksdb::DB* raw = nullptr;
  LEASH_RETURN_IF_ERROR(
      FromRocksDb(rocksdb::DB::Open(ro, options.path, &raw), options.path, "opening"));
  std::unique_ptr<rocksdb::DB> db(raw);
  LEASH_RETURN_IF_ERROR(CheckOrStampIdentity(db.get(), options));
  return std::unique_ptr<SnapshotStore>(
      std::make_unique<RocksDbStore>(options, std::move(db), ro.write_buffer_size));
}

}  // namespace leash::server

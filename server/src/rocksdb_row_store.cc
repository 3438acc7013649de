// The sparse tables' cold tier on RocksDB (rocksdb_row_store.h): point-lookup tuning, reads
// split over a pool of threads, one WriteBatch per write, and checkpoints by hard links.
// One caller thread at a time; the reader threads run only inside Read.
//
// Layout: <path>/live is the database; <path>/checkpoints/<sequence> are RocksDB checkpoints
// (hard links to the live SST files, copies of the small MANIFEST/OPTIONS/CURRENT files).
// Keys are 12 bytes, big-endian table id then big-endian row key, so a table's rows are
// contiguous and in key order (Scan). Values are the row records as the table lays them
// out (ps::RowLayout), without a checksum of ours: RocksDB checksums every block.
//
// Tuning (for random point lookups of ~100-byte records, far more of them than memory):
//   - full-filter bloom filters, 10 bits/key on whole keys (~1% false positives): a key never
//     written (a new row) costs no disk read;
//   - data blocks indexed by binary search plus a hash (kDataBlockBinaryAndHash), whole-key
//     memtable bloom: what Options::OptimizeForPointLookup sets, with our own cache size;
//   - one LRU block cache of a given size (inside the shard's memory budget) that also holds
//     index and filter blocks at high priority, so they stay while data blocks come and go;
//   - a bounded write buffer (two memtables of half of it each), also inside the budget;
//   - no compression (embeddings are random floats: it costs CPU and saves nothing);
//   - O_DIRECT reads by default, so the page cache does not silently hold the table;
//   - no write-ahead log: the live store is thrown away on recovery anyway (it is replaced
//     by the checkpoint the recovered snapshot names), so its writes need no durability;
//     a checkpoint flushes the memtables first.
//
// What others do, and what this does differently:
//   - PaddlePaddle's SSDSparseTable keeps the cold rows in RocksDB too, but reads misses
//     key by key on the calling thread and saves a table by writing out every row it holds
//     (cost proportional to the table, not to what changed). Here misses go out in parallel
//     and a snapshot costs the dirty rows plus hard links.
//   - FBGEMM's EmbeddingRocksDB splits its keys over several RocksDB instances, each with
//     its own executor thread, memtables and caches, and disables the WAL too. Here one
//     instance holds one block cache and one write buffer (so the memory budget is one
//     number to split), and a reader pool splits each batch of misses into slices, one
//     MultiGet per slice, which gives the same parallelism on the disk. Its checkpoints are
//     taken on request by the trainer; here they are tied to the shard's snapshot sequence
//     so both tiers and the dense tables recover to the same instant.
#include "leash/server/rocksdb_row_store.h"

#include <fcntl.h>
#include <pthread.h>
#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>
#include <rocksdb/write_buffer_manager.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "rocksdb_common.h"

namespace leash::server {
namespace {

namespace fs = std::filesystem;

constexpr size_t kKeyBytes = 12;
// Below this many keys per reader a Read is not split (a thread hand-off costs more).
constexpr size_t kMinKeysPerReader = 16;
// Keys per MultiGet. Its values pin the data blocks they were found in until they are
// copied out, so one MultiGet of n keys holds up to n blocks (4 KiB each) besides the cache:
// measured 98 MiB at an 80 MiB budget with 13k keys per reader. RocksDB batches a MultiGet
// by 32 keys inside anyway, so slices of 64 cost nothing measurable, and 32 readers pin at
// most 2048 blocks (8 MiB).
constexpr size_t kMaxKeysPerMultiGet = 64;
// Open table files (each holds a table reader, charged to the block cache). A 64 MiB file
// per table: 512 files are 32 GiB of rows before any is closed and reopened.
constexpr int kMaxOpenFiles = 512;

void EncodeKey(uint32_t table, uint64_t key, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((table >> (24 - 8 * i)) & 0xffu);
  for (int i = 0; i < 8; ++i) out[4 + i] = static_cast<char>((key >> (56 - 8 * i)) & 0xffu);
}

std::string Key(uint32_t table, uint64_t key) {
  std::string s(kKeyBytes, '\0');
  EncodeKey(table, key, s.data());
  return s;
}

uint64_t DecodeRowKey(const rocksdb::Slice& k) {
  uint64_t v = 0;
  for (size_t i = 4; i < kKeyBytes; ++i) v = v << 8 | static_cast<unsigned char>(k[i]);
  return v;
}

// The first key past table `table` (a 13-byte key sorts after every 12-byte key of it).
std::string TableEnd(uint32_t table) { return Key(table, UINT64_MAX) + '\xff'; }

Status SyncDirectory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return IOError("cannot open directory " + dir.string() + " to sync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return IOError("cannot sync directory " + dir.string());
  return Status::Ok();
}

Status FsError(const std::string& what, const std::error_code& ec) {
  if (ec == std::errc::no_space_on_device) return ResourceExhausted(what + ": " + ec.message());
  return IOError(what + ": " + ec.message());
}

// Whether files in `dir` can be opened with O_DIRECT (tmpfs and some others refuse it).
bool SupportsDirectIo(const fs::path& dir) {
  const fs::path probe = dir / ".direct-io-probe";
  const int fd = ::open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT, 0600);
  if (fd >= 0) ::close(fd);
  std::error_code ec;
  fs::remove(probe, ec);
  return fd >= 0;
}

// Runs a function on a fixed set of threads, slice i on thread i (slice 0 on the caller).
class ReaderPool {
 public:
  explicit ReaderPool(int threads) {
    for (int i = 1; i < threads; ++i) {
      threads_.emplace_back([this, i] {
        // Named, so top -H, perf and the benchmark's per-thread CPU tell readers apart.
        pthread_setname_np(pthread_self(), "leash-sparse-rd");
        Loop(i);
      });
    }
  }
  ~ReaderPool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    start_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int size() const { return static_cast<int>(threads_.size()) + 1; }

  // Calls fn(i) for every i in [0, n), n <= size(), and returns when all have returned.
  void Run(int n, const std::function<void(int)>& fn) {
    {
      std::lock_guard lock(mu_);
      fn_ = &fn;
      n_ = n;
      pending_ = n - 1;
      ++generation_;
    }
    if (n > 1) start_.notify_all();
    fn(0);
    std::unique_lock lock(mu_);
    done_.wait(lock, [this] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  void Loop(int i) {
    uint64_t seen = 0;
    std::unique_lock lock(mu_);
    while (true) {
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (i >= n_) continue;
      const std::function<void(int)>* fn = fn_;
      lock.unlock();
      (*fn)(i);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable start_;
  std::condition_variable done_;
  const std::function<void(int)>* fn_ = nullptr;
  int n_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

class RocksDbRowStore final : public SparseStore {
 public:
  explicit RocksDbRowStore(RocksDbRowStoreOptions options)
      : options_(std::move(options)),
        root_(options_.path),
        live_(root_ / "live"),
        checkpoints_(root_ / "checkpoints"),
        pool_(std::max(1, options_.readers)) {}
  ~RocksDbRowStore() override { Close(); }

  Status Open();

  Status Read(uint32_t table_id, std::span<const uint64_t> keys, size_t record_bytes, uint8_t* out,
              std::vector<uint8_t>* found) override;
  Status Write(uint32_t table_id, std::span<const uint64_t> keys, size_t record_bytes,
               const uint8_t* records, std::span<const uint64_t> deletes) override;
  Status Scan(uint32_t table_id, uint64_t* cursor, size_t limit, size_t record_bytes,
              const std::function<void(uint64_t key, const uint8_t* record)>& visit,
              bool* wrapped) override;
  Status DropTable(uint32_t table_id) override;
  uint64_t ApproxRows(uint32_t table_id) const override;
  uint64_t MemoryBytes() const override;

  Result<std::unique_ptr<Image>> OpenImage() override;
  Status Checkpoint(uint64_t sequence) override;
  Status Restore(std::optional<uint64_t> sequence) override;
  Status Prune(uint64_t keep) override;
  std::string Describe() const override { return "rocksdb:" + root_.string(); }

  // Scan, reading at `snapshot` (null: now).
  Status ScanAt(const rocksdb::Snapshot* snapshot, uint32_t table_id, uint64_t* cursor,
                size_t limit, size_t record_bytes,
                const std::function<void(uint64_t key, const uint8_t* record)>& visit,
                bool* wrapped);
  rocksdb::DB* db() { return db_.get(); }

 private:
  rocksdb::Options MakeOptions(bool direct_reads) const;
  void Close() {
    if (db_) db_->Close().PermitUncheckedError();
    db_.reset();
  }
  // Reads keys [begin, end) of `keys` with one MultiGet.
  Status ReadSlice(uint32_t table_id, std::span<const uint64_t> keys, size_t begin, size_t end,
                   size_t record_bytes, uint8_t* out, std::vector<uint8_t>* found);

  RocksDbRowStoreOptions options_;
  fs::path root_;
  fs::path live_;
  fs::path checkpoints_;
  std::shared_ptr<rocksdb::Cache> cache_;
  std::shared_ptr<rocksdb::WriteBufferManager> wbm_;
  std::unique_ptr<rocksdb::DB> db_;
  ReaderPool pool_;
};

rocksdb::Options RocksDbRowStore::MakeOptions(bool direct_reads) const {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.info_log = std::make_shared<SpdlogRocksDbLogger>();
  o.max_background_jobs = 2;
  o.compression = rocksdb::kNoCompression;
  o.level_compaction_dynamic_level_bytes = true;
  o.write_buffer_size = std::max<size_t>(size_t{64} << 10, options_.write_buffer_bytes / 2);
  o.max_write_buffer_number = 2;
  o.memtable_whole_key_filtering = true;
  o.memtable_prefix_bloom_size_ratio = 0.02;
  o.use_direct_reads = direct_reads;
  // Flushes and compactions bypass the page cache too: a memory cgroup (a container's
  // limit) counts page cache, and dirty pages of compaction output cannot be reclaimed at
  // once (a 20M-row shard at a 0.72 GB budget was OOM-killed in a cgroup of its stated
  // bound by them while its own memory stayed within it).
  o.use_direct_io_for_flush_and_compaction = direct_reads;
  o.avoid_unnecessary_blocking_io = true;
  // Memory outside the block cache, bounded (see "Memory" at the top of this file):
  // memtables are charged to the cache by the write buffer manager (writes stall, rather
  // than grow, while a flush is behind); table readers are at most kMaxOpenFiles.
  o.write_buffer_manager = wbm_;
  o.max_open_files = kMaxOpenFiles;
  // Direct reads make RocksDB read compaction inputs through a readahead buffer per input
  // file, 2 MiB each by default (measured 17 MiB in flight); a quarter of that is plenty for
  // sequential reads of an SSD.
  o.compaction_readahead_size = size_t{512} << 10;

  rocksdb::BlockBasedTableOptions t;
  t.block_cache = cache_;
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10, /*use_block_based_builder=*/false));
  t.whole_key_filtering = true;
  t.cache_index_and_filter_blocks = true;
  t.cache_index_and_filter_blocks_with_high_priority = true;
  t.pin_l0_filter_and_index_blocks_in_cache = true;
  // Partitioned index and filters: a file's index and bloom filter are split into blocks of
  // about metadata_block_size, cached like data blocks, with only their small top level
  // pinned. A whole-file filter of a 64 MiB file is ~0.5 MiB: larger than a cache shard's
  // share of a small cache, so each lookup evicted and re-read it (40 KB per miss measured).
  t.index_type = rocksdb::BlockBasedTableOptions::kTwoLevelIndexSearch;
  t.partition_filters = true;
  t.metadata_block_size = 4096;
  t.pin_top_level_index_and_filter = true;
  // Data blocks on 4 KiB boundaries (possible without compression): a direct read of a
  // block is one page, not two.
  t.block_size = 4096;
  t.block_align = true;
  t.data_block_index_type = rocksdb::BlockBasedTableOptions::kDataBlockBinaryAndHash;
  t.data_block_hash_table_util_ratio = 0.75;
  // Also charged to the cache: an open table's reader (its properties and structures), the
  // per-file metadata, and the bloom filter a flush or compaction builds.
  using rocksdb::CacheEntryRole;
  using rocksdb::CacheEntryRoleOptions;
  for (CacheEntryRole role : {CacheEntryRole::kBlockBasedTableReader, CacheEntryRole::kFileMetadata,
                              CacheEntryRole::kFilterConstruction}) {
    t.cache_usage_options.options_overrides.insert(
        {role, {/*.charged = */ CacheEntryRoleOptions::Decision::kEnabled}});
  }
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  return o;
}

Status RocksDbRowStore::Open() {
  const std::string path = root_.string();
  if (!cache_) {
    // One pool for data blocks, index and filter blocks and the memtables. Not a strict
    // capacity limit: with one, a block that cannot be inserted fails the read (index and
    // filter blocks: "Insert failed due to LRU cache being full"), and blocks pinned by a
    // read in flight are in memory either way; so the usage may pass the capacity by the
    // blocks pinned at once (see "Memory" at the top of this file).
    const size_t blocks = std::max<size_t>(size_t{1} << 20, options_.block_cache_bytes);
    cache_ = rocksdb::NewLRUCache(blocks + options_.write_buffer_bytes, -1, false,
                                  /*high_pri_pool_ratio=*/0.5);
    wbm_ = std::make_shared<rocksdb::WriteBufferManager>(options_.write_buffer_bytes, cache_,
                                                         /*allow_stall=*/true);
  }
  std::error_code ec;
  fs::create_directories(live_, ec);
  if (ec) return FsError("cannot create sparse store directory " + live_.string(), ec);
  fs::create_directories(checkpoints_, ec);
  if (ec) return FsError("cannot create checkpoint directory " + checkpoints_.string(), ec);
  fs::remove_all(root_ / "live.restoring", ec);  // a restore cut short by a crash

  bool direct = options_.direct_reads && SupportsDirectIo(live_);
  if (options_.direct_reads && !direct) {
    spdlog::warn(
        "sparse store {}: the file system refuses O_DIRECT (tmpfs?); using buffered reads, so "
        "the page cache may hold the cold tier",
        path);
  }
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(MakeOptions(direct), live_.string(), &raw);
  LEASH_RETURN_IF_ERROR(FromRocksDb(s, live_.string(), "opening sparse"));
  db_.reset(raw);
  return Status::Ok();
}

Status RocksDbRowStore::ReadSlice(uint32_t table_id, std::span<const uint64_t> keys, size_t begin,
                                  size_t end, size_t record_bytes, uint8_t* out,
                                  std::vector<uint8_t>* found) {
  if (end - begin > kMaxKeysPerMultiGet) {  // see kMaxKeysPerMultiGet
    for (size_t b = begin; b < end; b += kMaxKeysPerMultiGet) {
      LEASH_RETURN_IF_ERROR(ReadSlice(table_id, keys, b, std::min(end, b + kMaxKeysPerMultiGet),
                                      record_bytes, out, found));
    }
    return Status::Ok();
  }
  const size_t n = end - begin;
  std::vector<char> key_bytes(n * kKeyBytes);
  std::vector<rocksdb::Slice> slices(n);
  for (size_t i = 0; i < n; ++i) {
    char* k = key_bytes.data() + i * kKeyBytes;
    EncodeKey(table_id, keys[begin + i], k);
    slices[i] = rocksdb::Slice(k, kKeyBytes);
  }
  std::vector<rocksdb::PinnableSlice> values(n);
  std::vector<rocksdb::Status> statuses(n);
  rocksdb::ReadOptions ro;
  db_->MultiGet(ro, db_->DefaultColumnFamily(), n, slices.data(), values.data(), statuses.data());
  for (size_t i = 0; i < n; ++i) {
    const size_t at = begin + i;
    if (statuses[i].IsNotFound()) {
      (*found)[at] = 0;
      continue;
    }
    LEASH_RETURN_IF_ERROR(FromRocksDb(statuses[i], live_.string(), "reading sparse rows from"));
    if (values[i].size() != record_bytes) {
      return DataLoss("sparse store " + live_.string() + ": row " + std::to_string(keys[at]) +
                      " of table " + std::to_string(table_id) + " has " +
                      std::to_string(values[i].size()) + " bytes, expected " +
                      std::to_string(record_bytes) + std::string(kDamagedHint));
    }
    std::memcpy(out + at * record_bytes, values[i].data(), record_bytes);
    (*found)[at] = 1;
  }
  return Status::Ok();
}

Status RocksDbRowStore::Read(uint32_t table_id, std::span<const uint64_t> keys, size_t record_bytes,
                             uint8_t* out, std::vector<uint8_t>* found) {
  found->assign(keys.size(), 0);
  if (keys.empty()) return Status::Ok();
  const int slices = static_cast<int>(
      std::clamp<size_t>(keys.size() / kMinKeysPerReader, 1, static_cast<size_t>(pool_.size())));
  if (slices == 1) return ReadSlice(table_id, keys, 0, keys.size(), record_bytes, out, found);
  std::vector<Status> results(static_cast<size_t>(slices));
  const size_t per = (keys.size() + static_cast<size_t>(slices) - 1) / static_cast<size_t>(slices);
  pool_.Run(slices, [&](int i) {
    const size_t b = std::min(keys.size(), static_cast<size_t>(i) * per);
    const size_t e = std::min(keys.size(), b + per);
    if (b < e)
      results[static_cast<size_t>(i)] = ReadSlice(table_id, keys, b, e, record_bytes, out, found);
  });
  for (Status& st : results) LEASH_RETURN_IF_ERROR(st);
  return Status::Ok();
}

Status RocksDbRowStore::Write(uint32_t table_id, std::span<const uint64_t> keys,
                              size_t record_bytes, const uint8_t* records,
                              std::span<const uint64_t> deletes) {
  rocksdb::WriteBatch batch(keys.size() * (kKeyBytes + record_bytes + 8) + deletes.size() * 24);
  char k[kKeyBytes];
  for (size_t i = 0; i < keys.size(); ++i) {
    EncodeKey(table_id, keys[i], k);
    batch
        .Put(
            rocksdb::Slice(k, kKeyBytes),
            rocksdb::Slice(reinterpret_cast<const char*>(records) + i * record_bytes, record_bytes))
        .PermitUncheckedError();
  }
  for (uint64_t key : deletes) {
    EncodeKey(table_id, key, k);
    batch.Delete(rocksdb::Slice(k, kKeyBytes)).PermitUncheckedError();
  }
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;  // durability comes from checkpoints (see the top of this file)
  return FromRocksDb(db_->Write(wo, &batch), live_.string(), "writing sparse rows to");
}

Status RocksDbRowStore::Scan(uint32_t table_id, uint64_t* cursor, size_t limit, size_t record_bytes,
                             const std::function<void(uint64_t key, const uint8_t* record)>& visit,
                             bool* wrapped) {
  return ScanAt(nullptr, table_id, cursor, limit, record_bytes, visit, wrapped);
}

namespace {

// A RocksDB snapshot of the store, released with the image.
class RocksDbImage final : public SparseStore::Image {
 public:
  explicit RocksDbImage(RocksDbRowStore* store)
      : store_(store), snapshot_(store->db()->GetSnapshot()) {}
  ~RocksDbImage() override { store_->db()->ReleaseSnapshot(snapshot_); }
  Status Scan(uint32_t table_id, uint64_t* cursor, size_t limit, size_t record_bytes,
              const std::function<void(uint64_t key, const uint8_t* record)>& visit,
              bool* wrapped) override {
    return store_->ScanAt(snapshot_, table_id, cursor, limit, record_bytes, visit, wrapped);
  }

 private:
  RocksDbRowStore* store_;
  const rocksdb::Snapshot* snapshot_;
};

}  // namespace

Result<std::unique_ptr<SparseStore::Image>> RocksDbRowStore::OpenImage() {
  if (!db_) return FailedPrecondition("sparse store " + live_.string() + " is not open");
  return std::unique_ptr<Image>(std::make_unique<RocksDbImage>(this));
}

Status RocksDbRowStore::ScanAt(
    const rocksdb::Snapshot* snapshot, uint32_t table_id, uint64_t* cursor, size_t limit,
    size_t record_bytes, const std::function<void(uint64_t key, const uint8_t* record)>& visit,
    bool* wrapped) {
  const std::string end = TableEnd(table_id);
  rocksdb::Slice upper(end);
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot;
  ro.iterate_upper_bound = &upper;
  ro.fill_cache = false;  // a sweep must not push the hot rows out of the block cache
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
  it->Seek(Key(table_id, *cursor));
  size_t visited = 0;
  uint64_t last = 0;
  for (; it->Valid() && visited < limit; it->Next(), ++visited) {
    if (it->key().size() != kKeyBytes || it->value().size() != record_bytes) {
      return DataLoss("sparse store " + live_.string() + ": a row of table " +
                      std::to_string(table_id) + " has a malformed key or record" +
                      std::string(kDamagedHint));
    }
    last = DecodeRowKey(it->key());
    visit(last, reinterpret_cast<const uint8_t*>(it->value().data()));
  }
  LEASH_RETURN_IF_ERROR(FromRocksDb(it->status(), live_.string(), "scanning sparse rows of"));
  if (!it->Valid() || (visited > 0 && last == UINT64_MAX)) {
    *cursor = 0;
    *wrapped = true;
  } else {
    *cursor = last + 1;  // visited == limit > 0 here, or limit == 0 (cursor unchanged)
    if (visited == 0) *cursor = DecodeRowKey(it->key());
    *wrapped = false;
  }
  return Status::Ok();
}

Status RocksDbRowStore::DropTable(uint32_t table_id) {
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;
  return FromRocksDb(
      db_->DeleteRange(wo, db_->DefaultColumnFamily(), Key(table_id, 0), TableEnd(table_id)),
      live_.string(), "dropping a sparse table from");
}

uint64_t RocksDbRowStore::ApproxRows(uint32_t table_id) const {
  // RocksDB estimates keys only for the whole database: scale by the table's share of bytes.
  uint64_t keys = 0;
  db_->GetIntProperty("rocksdb.estimate-num-keys", &keys);
  if (keys == 0) return 0;
  const std::string b = Key(table_id, 0);
  const std::string e = TableEnd(table_id);
  const std::string all_b(1, '\0');
  const std::string all_e(kKeyBytes + 1, '\xff');
  rocksdb::Range ranges[2] = {rocksdb::Range(b, e), rocksdb::Range(all_b, all_e)};
  uint64_t sizes[2] = {0, 0};
  rocksdb::SizeApproximationOptions o;
  o.include_memtables = true;
  o.include_files = true;
  if (!db_->GetApproximateSizes(o, db_->DefaultColumnFamily(), ranges, 2, sizes).ok() ||
      sizes[1] == 0) {
    return 0;
  }
  const double share = std::min(1.0, static_cast<double>(sizes[0]) / static_cast<double>(sizes[1]));
  return static_cast<uint64_t>(static_cast<double>(keys) * share + 0.5);
}

uint64_t RocksDbRowStore::MemoryBytes() const {
  // The cache holds the memtables' charge too (the write buffer manager's reservations).
  return cache_->GetUsage();
}

Status RocksDbRowStore::Checkpoint(uint64_t sequence) {
  const fs::path dir = checkpoints_ / std::to_string(sequence);
  const fs::path tmp = checkpoints_ / (std::to_string(sequence) + ".tmp");
  std::error_code ec;
  // One of this number left by a crash before its snapshot was saved: that snapshot never
  // existed, so neither does the checkpoint.
  fs::remove_all(dir, ec);
  if (!ec) fs::remove_all(tmp, ec);
  if (ec) return FsError("cannot clear checkpoint " + dir.string(), ec);
  rocksdb::Checkpoint* raw = nullptr;
  LEASH_RETURN_IF_ERROR(FromRocksDb(rocksdb::Checkpoint::Create(db_.get(), &raw), live_.string(),
                                    "checkpointing sparse"));
  std::unique_ptr<rocksdb::Checkpoint> cp(raw);
  // log_size_for_flush 0: the memtables are flushed first (there is no WAL to copy).
  LEASH_RETURN_IF_ERROR(
      FromRocksDb(cp->CreateCheckpoint(tmp.string(), 0), live_.string(), "checkpointing sparse"));
  fs::rename(tmp, dir, ec);
  if (ec) return FsError("cannot name checkpoint " + dir.string(), ec);
  return SyncDirectory(checkpoints_);
}

Status RocksDbRowStore::Restore(std::optional<uint64_t> sequence) {
  const fs::path from = sequence ? checkpoints_ / std::to_string(*sequence) : fs::path();
  std::error_code ec;
  if (sequence && !fs::is_directory(from, ec)) {
    return NotFound("sparse store " + root_.string() + " has no checkpoint #" +
                    std::to_string(*sequence) + " of its rows, which the recovered snapshot names" +
                    std::string(kDamagedHint));
  }
  Close();
  const fs::path staging = root_ / "live.restoring";
  fs::remove_all(staging, ec);
  if (ec) return FsError("cannot clear " + staging.string(), ec);
  if (sequence) {
    fs::create_directories(staging, ec);
    for (fs::directory_iterator it(from, ec), end; !ec && it != end; it.increment(ec)) {
      const fs::path target = staging / it->path().filename();
      // SST files are never changed once written: the live store may share them.
      if (it->path().extension() == ".sst") {
        fs::create_hard_link(it->path(), target, ec);
      } else {
        fs::copy_file(it->path(), target, ec);
      }
      if (ec) break;
    }
    if (ec) return FsError("cannot restore checkpoint " + from.string(), ec);
  }
  fs::remove_all(live_, ec);
  if (ec) return FsError("cannot remove " + live_.string(), ec);
  if (sequence) {
    fs::rename(staging, live_, ec);
    if (ec) return FsError("cannot move the restored checkpoint into " + live_.string(), ec);
  } else {
    fs::remove_all(checkpoints_, ec);  // no snapshot names them
    if (ec) return FsError("cannot remove " + checkpoints_.string(), ec);
  }
  LEASH_RETURN_IF_ERROR(Open());
  spdlog::info("sparse store {}: {}", root_.string(),
               sequence ? "rows restored from checkpoint #" + std::to_string(*sequence)
                        : std::string("emptied (no snapshot to recover)"));
  return Status::Ok();
}

Status RocksDbRowStore::Prune(uint64_t keep) {
  const std::string name = std::to_string(keep);
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (fs::directory_iterator it(checkpoints_, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename() != name) doomed.push_back(it->path());
  }
  if (ec) return FsError("cannot list " + checkpoints_.string(), ec);
  for (const fs::path& p : doomed) {
    fs::remove_all(p, ec);
    if (ec) return FsError("cannot delete old checkpoint " + p.string(), ec);
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<SparseStore>> OpenRocksDbRowStore(const RocksDbRowStoreOptions& options) {
  if (options.path.empty()) return InvalidArgument("no directory given for the sparse store");
  if (options.readers < 1 || options.readers > 256) {
    return InvalidArgument("sparse readers must be in [1, 256], got " +
                           std::to_string(options.readers));
  }
  auto store = std::make_unique<RocksDbRowStore>(options);
  LEASH_RETURN_IF_ERROR(store->Open());
  return std::unique_ptr<SparseStore>(std::move(store));
}

}  // namespace leash::server

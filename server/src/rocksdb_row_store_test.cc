// Tests of the sparse tables' RocksDB cold tier on real RocksDB databases in temporary
// directories: records, scans, parallel reads, checkpoints and recovery beside the snapshot
// store. Single-threaded (the store's reader threads run inside Read).
#include "leash/server/rocksdb_row_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "leash/server/rocksdb_store.h"

namespace leash::server {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr size_t kRecord = 24;

// A record whose bytes depend on (key, version), so stale and fresh rows differ.
std::vector<uint8_t> RecordOf(uint64_t key, uint32_t version) {
  std::vector<uint8_t> r(kRecord);
  for (size_t i = 0; i < kRecord; ++i)
    r[i] = static_cast<uint8_t>((key * 131 + i * 7 + version * 29) & 0xffu);
  return r;
}

class RocksDbRowStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "leash_row_store_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  std::unique_ptr<SparseStore> Open(int readers = 4, bool direct_reads = true) {
    RocksDbRowStoreOptions o;
    o.path = (root_ / "sparse").string();
    o.direct_reads = direct_reads;
    o.block_cache_bytes = 1 << 20;
    o.write_buffer_bytes = 1 << 20;
    o.readers = readers;
    auto s = OpenRocksDbRowStore(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }

  static void Put(SparseStore& s, uint32_t table, const std::vector<uint64_t>& keys,
                  uint32_t version, const std::vector<uint64_t>& deletes = {}) {
    std::vector<uint8_t> records;
    for (uint64_t k : keys) {
      auto r = RecordOf(k, version);
      records.insert(records.end(), r.begin(), r.end());
    }
    ASSERT_TRUE(s.Write(table, keys, kRecord, records.data(), deletes).ok());
  }

  // key -> record for the keys found.
  static std::map<uint64_t, std::vector<uint8_t>> Get(SparseStore& s, uint32_t table,
                                                      const std::vector<uint64_t>& keys) {
    std::vector<uint8_t> out(keys.size() * kRecord);
    std::vector<uint8_t> found;
    Status st = s.Read(table, keys, kRecord, out.data(), &found);
    EXPECT_TRUE(st.ok()) << st.ToString();
    std::map<uint64_t, std::vector<uint8_t>> m;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (found[i])
        m[keys[i]] =
            std::vector<uint8_t>(out.begin() + i * kRecord, out.begin() + (i + 1) * kRecord);
    }
    return m;
  }

  fs::path root_;
};

TEST_F(RocksDbRowStoreTest, RoundTripsRecordsAndReportsMissingKeys) {
  auto s = Open();
  ASSERT_NE(s, nullptr);
  Put(*s, 3, {1, 0, UINT64_MAX, 77}, 1);
  Put(*s, 4, {1}, 9);  // same key, another table
  auto got = Get(*s, 3, {77, 2, 0, UINT64_MAX, 1, 1});
  ASSERT_EQ(got.size(), 4u);
  for (uint64_t k : {0ull, 1ull, 77ull, static_cast<unsigned long long>(UINT64_MAX)})
    EXPECT_EQ(got[k], RecordOf(k, 1)) << k;
  EXPECT_EQ(Get(*s, 4, {1})[1], RecordOf(1, 9));
  Put(*s, 3, {1}, 2, /*deletes=*/{77});
  got = Get(*s, 3, {1, 77});
  EXPECT_EQ(got.size(), 1u);
  EXPECT_EQ(got[1], RecordOf(1, 2));
  ASSERT_TRUE(s->DropTable(3).ok());
  EXPECT_TRUE(Get(*s, 3, {0, 1, UINT64_MAX}).empty());
  EXPECT_EQ(Get(*s, 4, {1}).size(), 1u);
}

TEST_F(RocksDbRowStoreTest, ScanVisitsOneTableInKeyOrderFromTheCursor) {
  auto s = Open();
  ASSERT_NE(s, nullptr);
  // Keys whose little-endian bytes would sort differently from their values.
  const std::vector<uint64_t> keys = {UINT64_MAX, 256, 1, 0, 65536, 255, 1ull << 40};
  Put(*s, 7, keys, 1);
  Put(*s, 6, {5}, 1);
  Put(*s, 8, {2}, 1);
  std::vector<uint64_t> seen;
  uint64_t cursor = 0;
  bool wrapped = false;
  int calls = 0;
  while (!wrapped && calls++ < 10) {
    ASSERT_TRUE(s->Scan(
                     7, &cursor, 3, kRecord,
                     [&](uint64_t k, const uint8_t* rec) {
                       EXPECT_EQ(std::memcmp(rec, RecordOf(k, 1).data(), kRecord), 0);
                       seen.push_back(k);
                     },
                     &wrapped)
                    .ok());
    if (!wrapped) {
      EXPECT_EQ(cursor, seen.back() + 1);
    }
  }
  EXPECT_EQ(seen, (std::vector<uint64_t>{0, 1, 255, 256, 65536, 1ull << 40, UINT64_MAX}));
  EXPECT_EQ(cursor, 0u);
  EXPECT_EQ(calls, 3);
  // A cursor in the middle starts there.
  seen.clear();
  cursor = 257;
  ASSERT_TRUE(
      s->Scan(
           7, &cursor, 2, kRecord, [&](uint64_t k, const uint8_t*) { seen.push_back(k); }, &wrapped)
          .ok());
  EXPECT_EQ(seen, (std::vector<uint64_t>{65536, 1ull << 40}));
  EXPECT_FALSE(wrapped);
}

TEST_F(RocksDbRowStoreTest, AnImageKeepsTheRowsAsTheyWereWhileTheStoreChanges) {
  auto s = Open();
  ASSERT_NE(s, nullptr);
  Put(*s, 7, {1, 2, 3, 4}, 1);
  auto image = s->OpenImage();
  ASSERT_TRUE(image.ok()) << image.status().ToString();
  // Later writes, deletes and a dropped table are not seen through the image.
  Put(*s, 7, {2, 5}, 2, /*deletes=*/{3});
  ASSERT_TRUE(s->DropTable(7).ok());
  Put(*s, 7, {9}, 3);
  auto scan_all = [&](SparseStore::Image& im, uint64_t limit) {
    std::map<uint64_t, std::vector<uint8_t>> rows;
    uint64_t cursor = 0;
    bool wrapped = false;
    for (int calls = 0; !wrapped && calls < 10; ++calls) {
      EXPECT_TRUE(im.Scan(
                        7, &cursor, limit, kRecord,
                        [&](uint64_t k, const uint8_t* rec) {
                          rows[k] = std::vector<uint8_t>(rec, rec + kRecord);
                        },
                        &wrapped)
                      .ok());
    }
    EXPECT_TRUE(wrapped);
    return rows;
  };
  auto rows = scan_all(**image, 3);
  ASSERT_EQ(rows.size(), 4u);
  for (uint64_t k : {1, 2, 3, 4}) EXPECT_EQ(rows[k], RecordOf(k, 1)) << k;
  EXPECT_EQ(Get(*s, 7, {1, 2, 9}).size(), 1u) << "the store itself moved on";
  // A new image sees the store as it is now.
  auto now = s->OpenImage();
  ASSERT_TRUE(now.ok());
  rows = scan_all(**now, 100);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[9], RecordOf(9, 3));
}

TEST_F(RocksDbRowStoreTest, ParallelReadEqualsSerialRead) {
  std::vector<uint64_t> keys;
  for (uint64_t i = 0; i < 6000; ++i) keys.push_back(i * 0x9E3779B97F4A7C15ull);
  std::vector<uint64_t> asked(keys.begin(), keys.begin() + 4000);
  for (uint64_t i = 0; i < 1000; ++i) asked.push_back(i * 2 + 1);  // mostly missing
  std::map<uint64_t, std::vector<uint8_t>> parallel;
  {
    auto s = Open(8);
    ASSERT_NE(s, nullptr);
    Put(*s, 1, keys, 3);
    ASSERT_TRUE(s->Checkpoint(1).ok());  // flushes the memtables: reads come from SST files
    parallel = Get(*s, 1, asked);
  }
  auto s = Open(1);
  ASSERT_NE(s, nullptr);
  auto serial = Get(*s, 1, asked);
  EXPECT_EQ(parallel, serial);
  EXPECT_GE(parallel.size(), 4000u);
  for (const auto& [k, r] : parallel) EXPECT_EQ(r, RecordOf(k, 3));
  EXPECT_GT(s->MemoryBytes(), 0u);
  EXPECT_NEAR(static_cast<double>(s->ApproxRows(1)), 6000.0, 1500.0);
  EXPECT_EQ(s->ApproxRows(2), 0u);
}

TEST_F(RocksDbRowStoreTest, RestoredCheckpointDiscardsLaterWrites) {
  auto s = Open();
  ASSERT_NE(s, nullptr);
  Put(*s, 1, {10, 11, 12}, 1);
  ASSERT_TRUE(s->Checkpoint(5).ok());
  Put(*s, 1, {11, 13}, 2, /*deletes=*/{12});
  ASSERT_TRUE(s->Checkpoint(6).ok());
  Put(*s, 1, {10}, 3);
  ASSERT_TRUE(s->Restore(5).ok());
  auto got = Get(*s, 1, {10, 11, 12, 13});
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[10], RecordOf(10, 1));
  EXPECT_EQ(got[11], RecordOf(11, 1));
  EXPECT_EQ(got[12], RecordOf(12, 1));
  // The checkpoint is still whole after the live store sharing its files changed.
  Put(*s, 1, {10}, 4);
  ASSERT_TRUE(s->Restore(6).ok());
  got = Get(*s, 1, {10, 11, 12, 13});
  EXPECT_EQ(got[10], RecordOf(10, 1));
  EXPECT_EQ(got[11], RecordOf(11, 2));
  EXPECT_EQ(got.count(12), 0u);
  EXPECT_EQ(got[13], RecordOf(13, 2));
  ASSERT_TRUE(s->Restore(5).ok());
  EXPECT_EQ(Get(*s, 1, {13}).size(), 0u);
  ASSERT_TRUE(s->Prune(5).ok());
  Status missing = s->Restore(6);
  EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing.ToString();
  EXPECT_THAT(missing.message(), HasSubstr("#6"));
  ASSERT_TRUE(s->Restore(std::nullopt).ok());
  EXPECT_TRUE(Get(*s, 1, {10, 11, 12}).empty());
}

// The shard's snapshot order: flush rows, checkpoint N, save snapshot N, prune. A crash after
// checkpoint N but before snapshot N is saved must recover snapshot N-1 with checkpoint N-1.
TEST_F(RocksDbRowStoreTest, CrashBetweenCheckpointAndSnapshotSaveRecoversThePreviousPair) {
  RocksDbStoreOptions so;
  so.path = (root_ / "snapshots").string();
  so.sync = false;
  {
    auto snapshots = OpenRocksDbStore(so);
    ASSERT_TRUE(snapshots.ok());
    auto rows = Open();
    ASSERT_NE(rows, nullptr);
    Put(*rows, 0, {1, 2}, 1);
    ASSERT_TRUE(rows->Checkpoint(1).ok());
    ShardSnapshot snap;
    snap.sequence = 1;
    snap.min_clock = 4;
    ASSERT_TRUE((*snapshots)->Save(snap).ok());
    ASSERT_TRUE(rows->Prune(1).ok());
    Put(*rows, 0, {1, 3}, 2);  // evictions after snapshot 1
    ASSERT_TRUE(rows->Checkpoint(2).ok());
    // Crash: snapshot 2 is never saved; the objects go away without a word.
  }
  auto snapshots = OpenRocksDbStore(so);
  ASSERT_TRUE(snapshots.ok());
  auto loaded = (*snapshots)->Load();
  ASSERT_TRUE(loaded.ok() && loaded->has_value());
  ASSERT_EQ((*loaded)->sequence, 1u);
  auto rows = Open();
  ASSERT_NE(rows, nullptr);
  ASSERT_TRUE(rows->Restore((*loaded)->sequence).ok());
  auto got = Get(*rows, 0, {1, 2, 3});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1], RecordOf(1, 1));
  EXPECT_EQ(got[2], RecordOf(2, 1));
  // The next snapshot takes number 2 again and replaces the stale checkpoint.
  Put(*rows, 0, {2}, 5);
  ASSERT_TRUE(rows->Checkpoint(2).ok());
  ASSERT_TRUE(rows->Prune(2).ok());
  ASSERT_TRUE(rows->Restore(2).ok());
  got = Get(*rows, 0, {1, 2, 3});
  EXPECT_EQ(got[2], RecordOf(2, 5));
  EXPECT_EQ(got.count(3), 0u);
  EXPECT_FALSE(fs::exists(root_ / "sparse" / "checkpoints" / "1"));
}

TEST_F(RocksDbRowStoreTest, DirectReadsFallBackToBufferedWhereTheFileSystemRefusesThem) {
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm (tmpfs) here";
  TearDown();
  std::string tmpl = "/dev/shm/leash_row_store_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  root_ = tmpl;
  auto s = Open(/*readers=*/2, /*direct_reads=*/true);
  ASSERT_NE(s, nullptr);
  Put(*s, 1, {5, 6}, 3);
  auto got = Get(*s, 1, {5, 6});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[6], RecordOf(6, 3));
}

TEST_F(RocksDbRowStoreTest, ASecondStoreOnTheSameDirectoryIsRefusedAsLocked) {
  auto first = Open();
  ASSERT_NE(first, nullptr);
  RocksDbRowStoreOptions o;
  o.path = (root_ / "sparse").string();
  auto second = OpenRocksDbRowStore(o);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("another leash-server"), std::string::npos)
      << second.status().ToString();
}

TEST_F(RocksDbRowStoreTest, RefusesBadOptions) {
  RocksDbRowStoreOptions o;
  EXPECT_EQ(OpenRocksDbRowStore(o).status().code(), StatusCode::kInvalidArgument);
  o.path = (root_ / "x").string();
  o.readers = 0;
  EXPECT_THAT(OpenRocksDbRowStore(o).status().message(), HasSubstr("readers"));
}

}  // namespace
}  // namespace leash::server

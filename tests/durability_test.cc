// Durability tests with the real leash-server: a shard SIGKILLed while it writes large
// snapshots recovers a complete earlier one; a damaged or foreign data directory is refused
// at start (non-zero exit, a message naming the directory and what to do) and left byte for
// byte as it was; a table's spec survives a restart. Every process is started by the test
// and killed by PID when the test ends.
#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "leash/common/zmq_transport.h"
#include "leash/server/rocksdb_store.h"
#include "leash/worker/client.h"
#include "support/files.h"
#include "support/process.h"

namespace leash {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::Endpoint;
using testing::FreePort;
using testing::Process;
using testing::TempDir;
using testing::WaitFor;

// One leash-server shard (shard/num_shards) on `endpoint` with data in `dir`.
std::unique_ptr<Process> StartShard(const std::string& endpoint, const std::string& dir,
                                    const std::string& log, std::vector<std::string> extra = {},
                                    int shard = 0, int num_shards = 1) {
  std::vector<std::string> argv = {LEASH_SERVER_BIN,
                                   "--shard=" + std::to_string(shard),
                                   "--num-shards=" + std::to_string(num_shards),
                                   "--bind=" + endpoint,
                                   "--data-dir=" + dir,
                                   "--checkpoint-interval=0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return std::make_unique<Process>(argv, log);
}

std::unique_ptr<Client> Connect(ZmqContext& ctx, const std::string& endpoint,
                                const std::string& name) {
  auto t = ConnectZmqClient(ctx, {endpoint});
  if (!t.ok()) return nullptr;
  ClientOptions o;
  o.name = name;
  o.connect_timeout_ms = 20000;
  auto c = Client::Connect(std::move(*t), o);
  return c.ok() ? std::move(*c) : nullptr;
}

using testing::FilesNamed;
using testing::TreeOf;

TableSpec BigTable(uint64_t rows, uint32_t cols) {
  TableSpec t;
  t.name = "big";
  t.rows = rows;
  t.cols = cols;
  t.optimizer.lr = 1.f;  // SGD with lr 1: a push of -1 everywhere adds exactly 1 to every value
  return t;
}

// A shard SIGKILLed at random moments while it snapshots a 16 MiB table after every push
// (and each push changes every value) must always recover a whole earlier snapshot: every
// value equal (a torn snapshot would mix two), CRC-checked by the store, and no older than
// the one recovered before.
TEST(DurabilityTest, ShardKilledWhileWritingLargeSnapshotsRecoversACompleteEarlierOne) {
  TempDir dir;
  const std::string data = dir.path() + "/shard0";
  const std::string endpoint = Endpoint(FreePort());
  const uint64_t seed = std::random_device{}();
  std::printf("kill-timing seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  constexpr uint64_t kRows = 1 << 16;
  constexpr uint32_t kCols = 64;  // 4 Mi floats, 16 MiB per snapshot
  std::vector<float> minus_one(kRows * kCols, -1.f);
  uint64_t last_sequence = 0;
  float last_value = 0.f;
  int recovered_nonempty = 0;
  for (int round = 0; round < 4; ++round) {
    auto shard =
        StartShard(endpoint, data, dir.path() + "/shard0.log", {"--checkpoint-interval=1ms"});
    ZmqContext ctx;
    auto client = Connect(ctx, endpoint, "pusher");
    ASSERT_NE(client, nullptr) << shard->ReadLog();
    auto table = client->CreateTable(BigTable(kRows, kCols));
    ASSERT_TRUE(table.ok()) << table.status();
    // Push until the kill; a push the dead shard never answers is simply abandoned.
    const auto kill_at =
        std::chrono::steady_clock::now() +
        std::chrono::milliseconds(std::uniform_int_distribution<int>(400, 2000)(rng));
    int pushes = 0;
    while (std::chrono::steady_clock::now() < kill_at) {
      auto f = client->Push(*table, minus_one.data());
      if (f.wait_for(2s) == std::future_status::ready) {
        ASSERT_TRUE(f.get().ok());
        ++pushes;
      }
    }
    shard->Kill();
    client.reset();
    const std::string log = shard->ReadLog();
    ASSERT_NE(log.find("snapshot #"), std::string::npos)
        << "the shard wrote no snapshot before the kill: " << log;

    server::RocksDbStoreOptions so;
    so.path = data;
    auto store = server::OpenRocksDbStore(so);
    ASSERT_TRUE(store.ok()) << store.status();
    auto snap = (*store)->Load();
    ASSERT_TRUE(snap.ok()) << "round " << round << ": " << snap.status();
    ASSERT_TRUE(snap->has_value()) << "round " << round;
    const server::ShardSnapshot& s = **snap;
    ASSERT_EQ(s.tables.size(), 1u);
    const std::vector<float>& v = s.tables[0].values;
    ASSERT_EQ(v.size(), kRows * kCols);
    size_t mixed = 0;
    for (float x : v) mixed += x != v[0];
    EXPECT_EQ(mixed, 0u) << "round " << round << ": snapshot #" << s.sequence
                         << " mixes two states";
    EXPECT_EQ(v[0], std::floor(v[0]));
    EXPECT_GE(s.sequence, last_sequence) << "recovered an older snapshot than the last round's";
    EXPECT_GE(v[0], last_value);
    EXPECT_EQ(static_cast<uint64_t>(v[0]), s.tables[0].optimizer_steps)
        << "values and optimizer steps agree";
    std::printf("round %d: %d pushes acknowledged, recovered snapshot #%llu holding %g pushes\n",
                round, pushes, static_cast<unsigned long long>(s.sequence),
                static_cast<double>(v[0]));
    // No snapshot the shard finished (and logged) before the kill is lost: it was synced.
    uint64_t last_logged = 0;
    for (size_t at = log.find("snapshot #"); at != std::string::npos;
         at = log.find("snapshot #", at + 1)) {
      if (log.compare(log.find(' ', at + 10), 9, " at clock") == 0) {
        last_logged = std::max<uint64_t>(last_logged, std::stoull(log.substr(at + 10)));
      }
    }
    EXPECT_GE(s.sequence, last_logged)
        << "snapshot #" << last_logged << " was written, yet #" << s.sequence << " was recovered";
    last_sequence = s.sequence;
    last_value = v[0];
    recovered_nonempty += v[0] > 0;
  }
  EXPECT_GT(recovered_nonempty, 0) << "no round got as far as a snapshot holding a push";
}

// The spec of a table a restarted shard recovered is compared with a CreateTable's.
TEST(DurabilityTest, RecoveredTableKeepsItsSpecAcrossAShardRestart) {
  TempDir dir;
  const std::string data = dir.path() + "/shard0";
  const std::string endpoint = Endpoint(FreePort());
  TableSpec spec = BigTable(100, 4);
  spec.optimizer.kind = OptimizerKind::kAdam;
  {
    auto shard = StartShard(endpoint, data, dir.path() + "/shard0.log");
    ZmqContext ctx;
    auto client = Connect(ctx, endpoint, "a");
    ASSERT_NE(client, nullptr) << shard->ReadLog();
    ASSERT_TRUE(client->CreateTable(spec).ok());
    shard->Kill();  // the table was persisted when it was created
  }
  auto shard = StartShard(endpoint, data, dir.path() + "/shard0.log");
  ZmqContext ctx;
  auto client = Connect(ctx, endpoint, "b");
  ASSERT_NE(client, nullptr) << shard->ReadLog();
  auto same = client->CreateTable(spec);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->shard_ids, std::vector<uint32_t>{0});
  TableSpec other = spec;
  other.cols = 5;
  auto refused = client->CreateTable(other);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kAlreadyExists) << refused.status();
  EXPECT_NE(refused.status().message().find("as 100 x 4 float32, adam("), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("asks for 100 x 5 float32, adam("), std::string::npos)
      << refused.status();
  EXPECT_NE(shard->ReadLog().find("recovered snapshot"), std::string::npos);
}

// Starting leash-server on a bad data directory: exit code 1 within a few seconds, a message
// naming the directory and `hint`, and not one byte of the directory changed.
class RefusedDirectoryTest : public ::testing::Test {
 protected:
  // Writes a real shard store (shard/num_shards) holding one table, with a table (.sst) file
  // and a write-ahead log: create, stop, restart (the restart flushes the log into a table
  // file), checkpoint again, stop.
  void MakeStore(const std::string& data, int shard = 0, int num_shards = 1) {
    const std::string endpoint = Endpoint(FreePort());
    for (int run = 0; run < 2; ++run) {
      auto p = StartShard(endpoint, data, dir_.path() + "/make" + std::to_string(run) + ".log", {},
                          shard, num_shards);
      if (num_shards !=
          1) {  // a one-endpoint client cannot join a 2-shard job: the shard's own snapshots do
        ASSERT_TRUE(
            WaitFor([&] { return p->ReadLog().find("listening") != std::string::npos; }, 20s));
      } else {
        ZmqContext ctx;
        auto t = ConnectZmqClient(ctx, {endpoint});
        ASSERT_TRUE(t.ok());
        ClientOptions o;
        o.register_worker = false;
        o.connect_timeout_ms = 20000;
        auto c = Client::Connect(std::move(*t), o);
        ASSERT_TRUE(c.ok()) << c.status() << p->ReadLog();
        ASSERT_TRUE((*c)->CreateTable(BigTable(1000, 16)).ok());
        ASSERT_TRUE((*c)->Checkpoint().ok());
      }
      p->Signal(SIGTERM);
      ASSERT_EQ(p->Wait(20s), std::optional<int>(0)) << p->ReadLog();
    }
  }

  void ExpectRefused(const std::string& data, const std::string& hint, int shard = 0,
                     int num_shards = 1) {
    const auto before = TreeOf(data);
    auto p =
        StartShard(Endpoint(FreePort()), data, dir_.path() + "/refused.log", {}, shard, num_shards);
    auto code = p->Wait(30s);
    const std::string log = p->ReadLog();
    ASSERT_TRUE(code.has_value()) << "leash-server did not exit: " << log;
    EXPECT_EQ(*code, 1) << log;
    EXPECT_NE(log.find(data), std::string::npos) << "the message names the directory: " << log;
    EXPECT_NE(log.find(hint), std::string::npos) << "the message says '" << hint << "': " << log;
    EXPECT_EQ(TreeOf(data), before) << "the refused directory must be left as it was";
    if (auto at = log.find("cannot open"); at != std::string::npos) {
      std::printf("refused: %s\n", log.substr(at, log.find('\n', at) - at).c_str());
    }
    fs::remove(dir_.path() + "/refused.log");
  }

  TempDir dir_;
};

TEST_F(RefusedDirectoryTest, DirectoryOfUnrelatedFiles) {
  const std::string data = dir_.path() + "/data";
  fs::create_directories(data + "/photos");
  std::ofstream(data + "/notes.txt") << "my notes";
  std::ofstream(data + "/photos/a.jpg") << "jpeg";
  ExpectRefused(data, "not a Leash shard store");
}

TEST_F(RefusedDirectoryTest, RocksDbDatabaseOfSomethingElse) {
  const std::string data = dir_.path() + "/data";
  {
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(o, data, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "user:1", "alice").ok());
    ASSERT_TRUE(db->Flush(rocksdb::FlushOptions()).ok());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "user:2", "bob").ok());
  }
  ExpectRefused(data, "not a Leash shard store");
}

TEST_F(RefusedDirectoryTest, AnotherShardsDataOrAnotherLayout) {
  const std::string data = dir_.path() + "/data";
  MakeStore(data, 1, 2);
  ExpectRefused(data, "belongs to shard 1 of 2", 0, 2);
  ExpectRefused(data, "belongs to shard 1 of 2", 1, 3);
}

TEST_F(RefusedDirectoryTest, FlippedByteInATableFile) {
  const std::string data = dir_.path() + "/data";
  MakeStore(data);
  auto ssts = FilesNamed(data, ".sst");
  ASSERT_FALSE(ssts.empty());
  {
    std::fstream f(ssts[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(64);
    char c = 0;
    f.get(c);
    f.seekp(64);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  ExpectRefused(data, "restore the data directory from a backup");
}

TEST_F(RefusedDirectoryTest, TruncatedTableFile) {
  const std::string data = dir_.path() + "/data";
  MakeStore(data);
  auto ssts = FilesNamed(data, ".sst");
  ASSERT_FALSE(ssts.empty());
  fs::resize_file(ssts[0], fs::file_size(ssts[0]) / 2);
  ExpectRefused(data, "restore the data directory from a backup");
}

TEST_F(RefusedDirectoryTest, MissingManifest) {
  const std::string data = dir_.path() + "/data";
  MakeStore(data);
  for (const auto& f : FilesNamed(data, "MANIFEST-")) fs::remove(f);
  ExpectRefused(data, "restore the data directory from a backup");
}

TEST_F(RefusedDirectoryTest, CorruptWriteAheadLog) {
  const std::string data = dir_.path() + "/data";
  MakeStore(data);
  fs::path log;
  for (const auto& f : FilesNamed(data, ".log")) {
    if (log.empty() || fs::file_size(f) > fs::file_size(log)) log = f;
  }
  ASSERT_FALSE(log.empty());
  ASSERT_GT(fs::file_size(log), 1000u);
  {
    std::fstream f(log, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(fs::file_size(log) / 2);
    f.seekg(at);
    char c = 0;
    f.get(c);
    f.seekp(at);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  ExpectRefused(data, "restore the data directory from a backup");
}

}  // namespace
}  // namespace leash

// Tests of leash-server's configuration: defaults, one error per bad value of every flag,
// a job file's server: section, and environment and flag overrides of it.
#include "config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "support/config_args.h"

namespace leash::server {
namespace {

Result<ServerConfig> Parse(const std::vector<std::string>& args) {
  return testing::ParseArgs<ServerConfig>("leash-server", ParseServerConfig, args);
}

// The message of parsing `args`, which must fail.
std::string Error(const std::vector<std::string>& args) {
  return testing::ErrorOf(Parse(args), args);
}

std::string WriteJobFile(const std::string& text) {
  return testing::WriteJobFile("leash_server_config_test", text);
}

TEST(ServerConfigTest, DefaultsAreTheDocumentedOnes) {
  auto c = Parse({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shard, 0);
  EXPECT_EQ(c->num_shards, 1);
  EXPECT_EQ(c->bind, "tcp://127.0.0.1:7000");
  EXPECT_EQ(c->data_dir, "./run/shard0");
  EXPECT_EQ(c->lease_ms, 10000);
  EXPECT_EQ(c->checkpoint_interval_ms, 60000);
  EXPECT_EQ(c->max_message_mb, 512);
  EXPECT_TRUE(c->sync);
  EXPECT_EQ(c->nonfinite, NonFinitePolicy::kReject);
  EXPECT_EQ(c->max_keys, int64_t{1} << 24);
  EXPECT_EQ(c->max_parked_per_peer, 4096);
  EXPECT_EQ(c->max_queued_reply_mb, 1024);
  EXPECT_TRUE(c->shared_memory);
  EXPECT_EQ(c->shm_ring_mb, 64);
  EXPECT_EQ(c->io_threads, 1);
  EXPECT_EQ(c->update_threads, 1);
  EXPECT_FALSE(c->insecure);
  EXPECT_EQ(c->log_level, "info");
}

TEST(ServerConfigTest, FlagsAreParsed) {
  auto c =
      Parse({"--shard=1", "--num-shards=3", "--lease-timeout=500ms", "--checkpoint-interval=0",
             "--nonfinite=skip-rows", "--no-sync", "--no-shm", "--max-keys=100",
             "--backup-workers=2", "--io-threads=4", "--update-threads=3", "--shm-ring-mb=16"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shard, 1);
  EXPECT_EQ(c->num_shards, 3);
  EXPECT_EQ(c->lease_ms, 500);
  EXPECT_EQ(c->checkpoint_interval_ms, 0);
  EXPECT_EQ(c->nonfinite, NonFinitePolicy::kSkipRows);
  EXPECT_FALSE(c->sync);
  EXPECT_FALSE(c->shared_memory);
  EXPECT_EQ(c->max_keys, 100);
  EXPECT_EQ(c->backup_workers, 2);
  EXPECT_EQ(c->io_threads, 4);
  EXPECT_EQ(c->update_threads, 3);
  EXPECT_EQ(c->shm_ring_mb, 16);
}

// Secure by default: a --bind other hosts can reach needs CURVE keys or --insecure;
// loopback and ipc:// need neither.
TEST(ServerConfigTest, ReachableBindWithoutKeysNeedsInsecure) {
  for (const char* bind : {"tcp://0.0.0.0:7000", "tcp://*:7000", "tcp://10.1.2.3:7000",
                           "tcp://eth0:7000", "tcp://[::]:7000"}) {
    std::string message = Error({std::string("--bind=") + bind});
    EXPECT_NE(
        message.find(std::string("refusing to listen on ") + bind + " (--bind) without CURVE keys"),
        std::string::npos)
        << message;
    EXPECT_NE(message.find("Add --curve-keys DIR"), std::string::npos) << message;
    EXPECT_NE(message.find("--insecure (LEASH_INSECURE=1)"), std::string::npos) << message;
  }
  setenv("LEASH_BIND", "tcp://0.0.0.0:7000", 1);
  std::string message = Error({});
  EXPECT_NE(message.find("tcp://0.0.0.0:7000 (LEASH_BIND)"), std::string::npos) << message;
  auto c = Parse({"--insecure"});
  unsetenv("LEASH_BIND");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->insecure);

  for (const std::vector<std::string>& ok :
       {std::vector<std::string>{"--bind=tcp://127.0.0.1:7000"},
        {"--bind=tcp://localhost:7000"},
        {"--bind=ipc:///tmp/leash-shard0"},
        {"--bind=tcp://0.0.0.0:7000", "--curve-keys=/etc/leash/keys"},
        {"--bind=tcp://0.0.0.0:7000", "--insecure"}}) {
    auto parsed = Parse(ok);
    EXPECT_TRUE(parsed.ok()) << ok[0] << ": " << parsed.status();
  }
}

TEST(ServerConfigTest, EachBadValueGetsItsOwnError) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--num-shards=0"}, "bad value for --num-shards: '0' (need an integer >= 1)"},
      {{"--shard=2", "--num-shards=2"},
       "bad value for --shard: '2' (need 0 <= --shard < --num-shards = 2)"},
      {{"--shard=-1"}, "bad value for --shard: '-1' (need 0 <= --shard < --num-shards = 1)"},
      {{"--lease-timeout=5ms"},
       "bad value for --lease-timeout: '5ms' (need a duration of at least 10ms, e.g. 10s)"},
      {{"--lease-timeout=soon"}, "bad value for --lease-timeout: 'soon'"},
      {{"--checkpoint-interval=1d"},
       "bad value for --checkpoint-interval: '1d' (need a duration such as 60s, 500ms or 2m; "
       "0: no periodic snapshots)"},
      {{"--max-message-mb=0"},
       "bad value for --max-message-mb: '0' (need an integer in [1, 1048576])"},
      {{"--nonfinite=ignore"}, "bad value for --nonfinite: 'ignore' (use reject or skip-rows)"},
      {{"--max-keys=0"}, "bad value for --max-keys: '0' (need an integer in [1, 2^40])"},
      {{"--max-parked-per-peer=0"},
       "bad value for --max-parked-per-peer: '0' (need an integer >= 1)"},
      {{"--metrics-bind=9100"}, "bad value for --metrics-bind: --metrics-bind '9100'"},
      {{"--max-queued-reply-mb=0"},
       "bad value for --max-queued-reply-mb: '0' (need an integer in [1, 1048576])"},
      {{"--io-threads=0"}, "bad value for --io-threads: '0' (need an integer in [1, 16])"},
      {{"--shm-ring-mb=0"}, "bad value for --shm-ring-mb: '0' (need an integer in [1, 4096])"},
      {{"--shm-ring-mb=4097"},
       "bad value for --shm-ring-mb: '4097' (need an integer in [1, 4096])"},
      {{"--log-level=chatty"}, "bad value for --log-level: 'chatty'"},
      {{"--no-sync=perhaps"}, "bad value for --no-sync: 'perhaps' is not a boolean"},
      {{"--shard=one"}, "bad value for --shard: 'one' is not an integer"},
      {{"--update-threads=65"},
       "bad value for --update-threads: '65' (need an integer in [0, 64]; 0: automatic)"},
      {{"--backup-workers=-1"},
       "bad value for --backup-workers: '-1' (need an integer in [0, 1000000])"},
  };
  for (const auto& c : cases) {
    std::string message = Error(c.args);
    EXPECT_EQ(message.rfind(c.message, 0), 0u)
        << ::testing::PrintToString(c.args) << " gave: " << message;
  }
}

TEST(ServerConfigTest, JobFileSetsTheShardAndFlagsAndEnvironmentOverrideIt) {
  std::string path = WriteJobFile(R"(worker:
  batch: 128
server:
  num-shards: 4
  lease-timeout: 2s
  checkpoint-interval: 30s
  nonfinite: skip-rows
  no-sync: true
  data-dir: /var/lib/leash
)");
  setenv("LEASH_DATA_DIR", "/from/env", 1);
  setenv("LEASH_LEASE_TIMEOUT", "3s", 1);
  auto c = Parse({"--config", path, "--shard=3", "--lease-timeout=4s"});
  unsetenv("LEASH_LEASE_TIMEOUT");
  unsetenv("LEASH_DATA_DIR");
  std::remove(path.c_str());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_shards, 4);                          // the file
  EXPECT_EQ(c->checkpoint_interval_ms, 30000);          // the file
  EXPECT_EQ(c->nonfinite, NonFinitePolicy::kSkipRows);  // the file
  EXPECT_FALSE(c->sync);                                // the file
  EXPECT_EQ(c->data_dir, "/from/env");                  // the environment over the file
  EXPECT_EQ(c->lease_ms, 4000);                         // the flag over both
  EXPECT_EQ(c->shard, 3);                               // the flag
}

TEST(ServerConfigTest, BadValueFromTheJobFileNamesItsKeyAndFile) {
  std::string path = WriteJobFile("server:\n  num-shards: 2\n  shard: 2\n");
  std::string message = Error({"--config=" + path});
  std::remove(path.c_str());
  EXPECT_EQ(message, "bad value for key server.shard of " + path +
                         ": '2' (need 0 <= --shard < --num-shards = 2)");
}

TEST(ServerConfigTest, UnknownKeyAndWrongTypeAreErrors) {
  std::string path = WriteJobFile("server:\n  lease: 10s\n");
  std::string message = Error({"--config=" + path});
  std::remove(path.c_str());
  EXPECT_NE(message.find("unknown key server.lease at " + path + ":2:3"), std::string::npos)
      << message;

  path = WriteJobFile("server:\n  max-keys: {a: 1}\n");
  message = Error({"--config=" + path});
  std::remove(path.c_str());
  EXPECT_NE(message.find("key server.max-keys at " + path), std::string::npos) << message;
  EXPECT_NE(message.find("must be an integer, not a map"), std::string::npos) << message;
}

TEST(ServerConfigTest, MissingJobFileIsAnError) {
  setenv("LEASH_CONFIG", "/nonexistent/job.yaml", 1);
  std::string message = Error({});
  unsetenv("LEASH_CONFIG");
  EXPECT_NE(message.find("cannot read job file /nonexistent/job.yaml"), std::string::npos)
      << message;
}

TEST(ServerConfigTest, ExampleJobFileIsValid) {
  auto c = Parse({"--config", LEASH_EXAMPLE_JOB, "--shard=1"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_shards, 2);
  EXPECT_EQ(c->shard, 1);
}

TEST(ServerConfigTest, HelpKeepsEveryFlagWithItsDefault) {
  ServerCommandLine line;
  std::string usage = line.cli().Usage();
  for (const char* expected :
       {"--lease-timeout (LEASH_LEASE_TIMEOUT, default '10s')",
        "--checkpoint-interval (LEASH_CHECKPOINT_INTERVAL, default '60s')",
        "--max-keys (LEASH_MAX_KEYS, default '16777216')",
        "--nonfinite (LEASH_NONFINITE, default 'reject')",
        "--bind (LEASH_BIND, default 'tcp://127.0.0.1:7000')",
        "--config (LEASH_CONFIG, default '')", "--log-level (LEASH_LOG_LEVEL, default 'info')"}) {
    EXPECT_NE(usage.find(expected), std::string::npos) << expected << "\n" << usage;
  }
}

}  // namespace
}  // namespace leash::server

namespace leash::server {
namespace {

TEST(ServerConfigTest, SparseFlagsTakeByteSizesReadersAndDirectReads) {
  auto c = Parse({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->memory_budget_bytes, 0u);
  EXPECT_EQ(c->sparse_readers, 32);
  EXPECT_TRUE(c->sparse_direct_reads);
  c = Parse({"--memory-budget=512M", "--sparse-readers=2", "--sparse-direct-reads=false"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->memory_budget_bytes, uint64_t{512} << 20);
  EXPECT_EQ(c->sparse_readers, 2);
  EXPECT_FALSE(c->sparse_direct_reads);
  EXPECT_EQ(*ParseByteSize("4G"), uint64_t{4} << 30);
  EXPECT_EQ(*ParseByteSize("1048576"), uint64_t{1} << 20);
  EXPECT_EQ(*ParseByteSize("64KiB"), uint64_t{64} << 10);
  EXPECT_FALSE(ParseByteSize("4X").ok());
  EXPECT_FALSE(ParseByteSize("99999999999T").ok());
  EXPECT_NE(Error({"--memory-budget=lots"}).find("--memory-budget"), std::string::npos);
  EXPECT_NE(Error({"--memory-budget=1K"}).find("at least 1M"), std::string::npos);
  EXPECT_NE(Error({"--sparse-readers=0"}).find("[1, 256]"), std::string::npos);
}

}  // namespace
}  // namespace leash::server

namespace leash::server {
namespace {

TEST(ServerConfigTest, ReplicationFlagsNeedPeersAndEtcdOnlyWhenReplicated) {
  auto c = Parse({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->replicas, 1);
  EXPECT_EQ(c->replica, 0);
  EXPECT_TRUE(c->peers.empty());
  EXPECT_EQ(c->job, "leash");
  c = Parse({"--replicas=2", "--replica=1", "--peers=tcp://a:7000,tcp://b:7000",
             "--etcd=http://127.0.0.1:2379", "--job=mnist"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->replicas, 2);
  EXPECT_EQ(c->replica, 1);
  EXPECT_EQ(c->peers, (std::vector<std::string>{"tcp://a:7000", "tcp://b:7000"}));
  EXPECT_EQ(c->etcd, "http://127.0.0.1:2379");
  EXPECT_EQ(c->job, "mnist");
  EXPECT_NE(Error({"--replicas=0"}).find("[1, 16]"), std::string::npos);
  EXPECT_NE(Error({"--replicas=2", "--replica=2"}).find("--replica"), std::string::npos);
  EXPECT_NE(Error({"--replicas=2", "--peers=tcp://a:7000", "--etcd=http://e:2379"})
                .find("2 comma-separated endpoints"),
            std::string::npos);
  EXPECT_NE(Error({"--replicas=2", "--peers=tcp://a:7000,tcp://b:7000"}).find("--etcd"),
            std::string::npos);
  EXPECT_EQ(c->etcd_ttl_s, 5);
  EXPECT_EQ(Parse({"--etcd-ttl=2"})->etcd_ttl_s, 2);
  EXPECT_NE(Error({"--etcd-ttl=0"}).find("whole seconds"), std::string::npos);
  EXPECT_EQ(c->durable_log, "off");
  const std::vector<std::string> replicated = {"--replicas=2", "--peers=tcp://a:7000,tcp://b:7000",
                                               "--etcd=http://e:2379"};
  auto with = [&](std::string flag) {
    std::vector<std::string> args = replicated;
    args.push_back(std::move(flag));
    return args;
  };
  for (const char* mode : {"off", "write", "fsync"})
    EXPECT_EQ(Parse(with(std::string("--durable-log=") + mode))->durable_log, mode);
  EXPECT_NE(Error(with("--durable-log=always")).find("use off, write or fsync"), std::string::npos);
  // An unreplicated shard keeps a durable log as a group of one: no peers, no etcd.
  auto solo = Parse({"--durable-log=write"});
  ASSERT_TRUE(solo.ok()) << solo.status();
  EXPECT_EQ(solo->durable_log, "write");
  EXPECT_EQ(solo->replicas, 1);
  EXPECT_TRUE(solo->etcd.empty());
  // Backups that answer: on by default for replicated shards, which =false turns off; an
  // unreplicated shard has none, and asking for them is an error.
  EXPECT_TRUE(c->backup_answers);
  EXPECT_TRUE(Parse(with("--backup-answers"))->backup_answers);
  EXPECT_FALSE(Parse(with("--backup-answers=false"))->backup_answers);
  EXPECT_FALSE(solo->backup_answers);
  EXPECT_NE(Error({"--backup-answers"}).find("add --replicas 2"), std::string::npos);
  // Backups reading entries in place: the same.
  EXPECT_TRUE(c->backups_read_in_place);
  EXPECT_FALSE(Parse(with("--backups-read-in-place=false"))->backups_read_in_place);
  EXPECT_FALSE(solo->backups_read_in_place);
  EXPECT_NE(Error({"--backups-read-in-place"}).find("add --replicas 2"), std::string::npos);
  // A primary copying pushes once: the same.
  EXPECT_TRUE(c->primary_copies_once);
  EXPECT_FALSE(Parse(with("--primary-copies-once=false"))->primary_copies_once);
  EXPECT_FALSE(solo->primary_copies_once);
  EXPECT_NE(Error({"--primary-copies-once"}).find("add --replicas 2"), std::string::npos);
  // The log tail kept for lagging backups: 64 MiB unless told, 0 allowed (only what a backup
  // has yet to acknowledge), bounded above; an unreplicated shard keeps none to size.
  EXPECT_EQ(c->replica_log_mb, 64);
  EXPECT_EQ(Parse(with("--replica-log-mb=8"))->replica_log_mb, 8);
  EXPECT_EQ(Parse(with("--replica-log-mb=0"))->replica_log_mb, 0);
  EXPECT_NE(Error(with("--replica-log-mb=-1")).find("[0, 65536]"), std::string::npos);
  EXPECT_NE(Error(with("--replica-log-mb=65537")).find("--replica-log-mb"), std::string::npos);
  EXPECT_NE(Error({"--replica-log-mb=8"}).find("add --replicas 2"), std::string::npos);
}

}  // namespace
}  // namespace leash::server

// Tests of leash-worker's configuration: defaults, one error per bad value of every flag,
// a job file's worker: section, and environment and flag overrides of it.
#include "config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "support/config_args.h"

namespace leash::worker {
namespace {

Result<WorkerConfig> Parse(const std::vector<std::string>& args) {
  return testing::ParseArgs<WorkerConfig>("leash-worker", ParseWorkerConfig, args);
}

// The message of parsing `args`, which must fail.
std::string Error(const std::vector<std::string>& args) {
  return testing::ErrorOf(Parse(args), args);
}

std::string WriteJobFile(const std::string& text) {
  return testing::WriteJobFile("leash_worker_config_test", text);
}

TEST(WorkerConfigTest, DefaultsAreTheDocumentedOnes) {
  auto c = Parse({"--local"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->local);
  EXPECT_TRUE(c->servers.empty());
  EXPECT_EQ(c->model, ModelKind::kMlp);
  EXPECT_EQ(c->hidden, (std::vector<int64_t>{256, 128}));
  EXPECT_EQ(c->optimizer, OptimizerKind::kMomentum);
  EXPECT_DOUBLE_EQ(c->lr, 0.01);
  EXPECT_DOUBLE_EQ(c->momentum, 0.9);
  EXPECT_EQ(c->batch, 64);
  EXPECT_EQ(c->epochs, 3);
  EXPECT_EQ(c->staleness, 0);
  EXPECT_EQ(c->chunk_size, 1024);
  EXPECT_EQ(c->wire_dtype, DType::kF32);
  EXPECT_EQ(c->data, "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(c->device, "auto");
  EXPECT_EQ(c->curve_client, "client");
  EXPECT_TRUE(c->evaluate);
  EXPECT_TRUE(c->shared_memory);
  EXPECT_EQ(c->shm_ring_mb, 64);
  EXPECT_TRUE(c->pull_in_place);
  EXPECT_EQ(c->stripes, 1);
  EXPECT_FALSE(c->wait_when_done);
  EXPECT_EQ(c->log_level, "info");
}

TEST(WorkerConfigTest, EtcdFindsReplicatedShardsInsteadOfServers) {
  auto c = Parse({"--etcd=http://127.0.0.1:2379,http://10.0.0.2:2379", "--job=mnist"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->servers.empty());
  EXPECT_EQ(c->etcd, (std::vector<std::string>{"http://127.0.0.1:2379", "http://10.0.0.2:2379"}));
  EXPECT_EQ(c->job, "mnist");
  EXPECT_EQ(Parse({"--etcd=http://127.0.0.1:2379"})->job, "leash");  // leash-server's default
  EXPECT_NE(Error({"--etcd=http://127.0.0.1:2379", "--servers=tcp://127.0.0.1:7000"})
                .find("are exclusive"),
            std::string::npos);
  EXPECT_NE(Error({"--etcd=http://127.0.0.1:2379", "--local"}).find("--local trains without"),
            std::string::npos);
  EXPECT_NE(Error({}).find("--etcd for replicated shards"), std::string::npos);
}

TEST(WorkerConfigTest, FlagsAreParsedIntoDomainTypes) {
  auto c = Parse({"--servers", "tcp://a:1, tcp://b:2", "--optimizer=adam", "--wire-dtype=bf16",
                  "--model=cnn", "--hidden=64", "--no-eval", "--no-shm", "--device=cuda:1",
                  "--staleness=2", "--eval-every=5", "--log-level=debug", "--insecure",
                  "--global-batch=192", "--wait-when-done", "--stripes=4", "--pull-in-place=false",
                  "--shm-ring-mb=8"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->servers, (std::vector<std::string>{"tcp://a:1", "tcp://b:2"}));
  EXPECT_EQ(c->optimizer, OptimizerKind::kAdam);
  EXPECT_EQ(c->wire_dtype, DType::kBF16);
  EXPECT_EQ(c->model, ModelKind::kCnn);
  EXPECT_EQ(c->hidden, (std::vector<int64_t>{64}));
  EXPECT_FALSE(c->evaluate);
  EXPECT_FALSE(c->shared_memory);
  EXPECT_FALSE(c->pull_in_place);
  EXPECT_EQ(c->device, "cuda:1");
  EXPECT_EQ(c->staleness, 2);
  EXPECT_EQ(c->eval_every, 5);
  EXPECT_EQ(c->log_level, "debug");
  EXPECT_EQ(c->global_batch, 192);
  EXPECT_EQ(c->stripes, 4);
  EXPECT_EQ(c->shm_ring_mb, 8);
  EXPECT_TRUE(c->insecure);
  EXPECT_TRUE(c->wait_when_done);
}

// Secure by default: shards another host could be on need CURVE keys or --insecure;
// loopback and ipc:// need neither, and --local connects nowhere.
TEST(WorkerConfigTest, RemoteServersWithoutKeysNeedInsecure) {
  std::string message = Error({"--servers=tcp://127.0.0.1:7000,tcp://10.0.0.2:7000"});
  EXPECT_NE(message.find("refusing to connect to tcp://10.0.0.2:7000 (--servers) without CURVE "
                         "keys"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("--curve-keys DIR"), std::string::npos) << message;
  EXPECT_NE(message.find("--insecure"), std::string::npos) << message;
  setenv("LEASH_SERVERS", "tcp://shard-0.leash:7000", 1);
  message = Error({});
  unsetenv("LEASH_SERVERS");
  EXPECT_NE(message.find("tcp://shard-0.leash:7000 (LEASH_SERVERS)"), std::string::npos) << message;

  for (const std::vector<std::string>& ok :
       {std::vector<std::string>{"--servers=tcp://127.0.0.1:7000,tcp://localhost:7001"},
        {"--servers=ipc:///tmp/leash-shard0"},
        {"--servers=tcp://10.0.0.2:7000", "--curve-keys=/etc/leash/keys"},
        {"--servers=tcp://10.0.0.2:7000", "--insecure"},
        {"--servers=tcp://10.0.0.2:7000", "--local"}}) {
    auto c = Parse(ok);
    EXPECT_TRUE(c.ok()) << ok[0] << ": " << c.status();
  }
  setenv("LEASH_INSECURE", "1", 1);
  auto c = Parse({"--servers=tcp://10.0.0.2:7000"});
  unsetenv("LEASH_INSECURE");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->insecure);
}

TEST(WorkerConfigTest, ClickThroughModelFlagsAreParsed) {
  auto c = Parse({"--local", "--model=ctr", "--embedding-dim=8", "--sparse-optimizer=ftrl",
                  "--sparse-lr=0.1", "--embedding-scale=0.01"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model, ModelKind::kCtr);
  EXPECT_EQ(c->embedding_dim, 8);
  EXPECT_EQ(c->sparse_optimizer, OptimizerKind::kFtrl);
  EXPECT_DOUBLE_EQ(c->sparse_lr, 0.1);
  EXPECT_DOUBLE_EQ(c->embedding_scale, 0.01);
  auto d = Parse({"--local"});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->embedding_dim, 16);
  EXPECT_EQ(d->sparse_optimizer, OptimizerKind::kAdagrad);
}

TEST(WorkerConfigTest, NoServersWithoutLocalIsAnError) {
  EXPECT_NE(Error({}).find("no shards given: set --servers"), std::string::npos);
}

// Every flag with a constraint: its bad value gives an error naming the flag, the value
// and what is accepted.
TEST(WorkerConfigTest, EachBadValueGetsItsOwnError) {
  struct Case {
    std::string arg;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"--staleness=-1", "bad value for --staleness: '-1' (need an integer >= 0)"},
      {"--batch=0", "bad value for --batch: '0' (need an integer >= 1)"},
      {"--lr=0", "bad value for --lr: '0' (need a number > 0)"},
      {"--optimizer=rmsprop",
       "bad value for --optimizer: 'rmsprop' (use sgd, momentum, adam or adagrad)"},
      {"--epochs=0", "bad value for --epochs: '0' (need an integer >= 1)"},
      {"--threads=0", "bad value for --threads: '0' (need an integer >= 1)"},
      {"--chunk-size=0", "bad value for --chunk-size: '0' (need an integer >= 1)"},
      {"--accumulate=0", "bad value for --accumulate: '0' (need an integer >= 1)"},
      {"--model=rnn", "bad value for --model: 'rnn' (use mlp, cnn or ctr)"},
      {"--hidden=256,x",
       "bad value for --hidden: '256,x' (need a comma-separated list of positive layer sizes)"},
      {"--hidden=0", "bad value for --hidden: '0'"},
      {"--wire-dtype=int8", "bad value for --wire-dtype: 'int8' (use fp32, fp16 or bf16)"},
      {"--device=gpu", "bad value for --device: 'gpu' (use cpu, cuda, cuda:N or auto)"},
      {"--device=cuda:", "bad value for --device: 'cuda:'"},
      {"--train-limit=-1", "bad value for --train-limit: '-1' (need an integer >= 0)"},
      {"--test-limit=-5", "bad value for --test-limit: '-5' (need an integer >= 0)"},
      {"--step-delay-factor=0.5",
       "bad value for --step-delay-factor: '0.5' (need a number in [1, 1e6))"},
      {"--eval-every=-1", "bad value for --eval-every: '-1' (need an integer >= 0"},
      {"--stripes=0", "bad value for --stripes: '0' (need an integer in [1, 16])"},
      {"--stripes=17", "bad value for --stripes: '17' (need an integer in [1, 16])"},
      {"--shm-ring-mb=0", "bad value for --shm-ring-mb: '0' (need an integer in [1, 4096])"},
      {"--inject-send-delay-ms=-3",
       "bad value for --inject-send-delay-ms: '-3' (need milliseconds in [0, 10000])"},
      {"--metrics-bind=tcp://0.0.0.0:9100",
       "bad value for --metrics-bind: --metrics-bind 'tcp://0.0.0.0:9100'"},
      {"--log-level=chatty", "bad value for --log-level: 'chatty'"},
      {"--batch=many", "bad value for --batch: 'many' is not an integer"},
      {"--lr=fast", "bad value for --lr: 'fast' is not a finite number"},
      {"--local=maybe", "bad value for --local: 'maybe' is not a boolean"},
      {"--embedding-dim=0", "bad value for --embedding-dim: '0' (need an integer in [1, 4096])"},
      {"--sparse-optimizer=momentum",
       "bad value for --sparse-optimizer: 'momentum' (use sgd, adam, adagrad or ftrl)"},
      {"--sparse-lr=-1", "bad value for --sparse-lr: '-1' (need a number >= 0 (0: --lr))"},
      {"--embedding-scale=-0.5", "bad value for --embedding-scale: '-0.5' (need a number >= 0)"},
      {"--no-such-flag=1", "unknown flag --no-such-flag"},
      {"--global-batch=-1",
       "bad value for --global-batch: '-1' (need an integer in [0, 2^31) (0: off))"},
  };
  for (const auto& c : cases) {
    std::string message = Error({"--local", c.arg});
    EXPECT_EQ(message.rfind(c.message, 0), 0u) << c.arg << " gave: " << message;
  }
  // Work in proportion to speed trains one batch per iteration.
  std::string message = Error({"--local", "--global-batch=192", "--accumulate=2"});
  EXPECT_NE(message.find("--accumulate 1"), std::string::npos) << message;
}

TEST(WorkerConfigTest, JobFileSetsTheJob) {
  std::string path = WriteJobFile(R"(# a job
worker:
  servers: [tcp://10.0.0.1:7000, tcp://10.0.0.2:7000]
  curve-keys: /etc/leash/keys
  model: mlp
  hidden: [512, 256, 128]
  optimizer: adam
  lr: 0.001
  weight-decay: 0.0001
  batch: 128
  staleness: 2
  epochs: 10
  wire-dtype: fp16
  data: /data/fashion-mnist
  chunk-size: 512
  no-eval: true
server:
  num-shards: 2
)");
  auto c = Parse({"--config", path});
  std::remove(path.c_str());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->servers, (std::vector<std::string>{"tcp://10.0.0.1:7000", "tcp://10.0.0.2:7000"}));
  EXPECT_EQ(c->curve_keys, "/etc/leash/keys");
  EXPECT_EQ(c->hidden, (std::vector<int64_t>{512, 256, 128}));
  EXPECT_EQ(c->optimizer, OptimizerKind::kAdam);
  EXPECT_DOUBLE_EQ(c->lr, 0.001);
  EXPECT_DOUBLE_EQ(c->weight_decay, 0.0001);
  EXPECT_EQ(c->batch, 128);
  EXPECT_EQ(c->staleness, 2);
  EXPECT_EQ(c->epochs, 10);
  EXPECT_EQ(c->wire_dtype, DType::kF16);
  EXPECT_EQ(c->data, "/data/fashion-mnist");
  EXPECT_EQ(c->chunk_size, 512);
  EXPECT_FALSE(c->evaluate);
}

TEST(WorkerConfigTest, EnvironmentAndFlagsOverrideTheJobFile) {
  std::string path =
      WriteJobFile("worker:\n  local: true\n  batch: 128\n  epochs: 10\n  optimizer: adam\n");
  setenv("LEASH_CONFIG", path.c_str(), 1);
  setenv("LEASH_BATCH", "32", 1);
  setenv("LEASH_OPTIMIZER", "sgd", 1);
  auto c = Parse({"--optimizer=adagrad"});
  unsetenv("LEASH_OPTIMIZER");
  unsetenv("LEASH_BATCH");
  unsetenv("LEASH_CONFIG");
  std::remove(path.c_str());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->local);                             // the file
  EXPECT_EQ(c->epochs, 10);                          // the file
  EXPECT_EQ(c->batch, 32);                           // the environment over the file
  EXPECT_EQ(c->optimizer, OptimizerKind::kAdagrad);  // the flag over both
}

TEST(WorkerConfigTest, BadValueFromTheJobFileNamesItsKeyAndFile) {
  std::string path = WriteJobFile("worker:\n  local: true\n  batch: 0\n");
  std::string message = Error({"--config=" + path});
  std::remove(path.c_str());
  EXPECT_EQ(message, "bad value for key worker.batch of " + path + ": '0' (need an integer >= 1)");
}

TEST(WorkerConfigTest, ServerKeyInTheWorkerSectionIsAnUnknownKey) {
  std::string path = WriteJobFile("worker:\n  local: true\n  num-shards: 2\n");
  std::string message = Error({"--config=" + path});
  std::remove(path.c_str());
  EXPECT_NE(message.find("unknown key worker.num-shards at " + path + ":3:3"), std::string::npos)
      << message;
}

TEST(WorkerConfigTest, WrongTypeInTheJobFileNamesKeyAndFile) {
  std::string path = WriteJobFile("worker:\n  local: true\n  epochs: [1, 2]\n");
  std::string message = Error({"--config=" + path});
  std::remove(path.c_str());
  EXPECT_NE(message.find("key worker.epochs at " + path), std::string::npos) << message;
  EXPECT_NE(message.find("must be an integer, not a sequence"), std::string::npos) << message;
}

TEST(WorkerConfigTest, MissingJobFileIsAnError) {
  std::string message = Error({"--local", "--config=/nonexistent/job.yaml"});
  EXPECT_NE(message.find("cannot read job file /nonexistent/job.yaml"), std::string::npos)
      << message;
}

TEST(WorkerConfigTest, ExampleJobFileIsValid) {
  auto c = Parse({"--config", LEASH_EXAMPLE_JOB});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->servers.size(), 2u);
  EXPECT_EQ(c->staleness, 1);
}

TEST(WorkerConfigTest, HelpKeepsEveryFlagWithItsDefault) {
  WorkerCommandLine line;
  std::string usage = line.cli().Usage();
  for (const char* expected :
       {"--servers (LEASH_SERVERS, default '')", "--staleness (LEASH_STALENESS, default '0')",
        "--lr (LEASH_LR, default '0.01')", "--optimizer (LEASH_OPTIMIZER, default 'momentum')",
        "--hidden (LEASH_HIDDEN, default '256,128')",
        "--wire-dtype (LEASH_WIRE_DTYPE, default 'fp32')",
        "--step-delay-factor (LEASH_STEP_DELAY_FACTOR, default '1')",
        "--curve-client (LEASH_CURVE_CLIENT, default 'client')",
        "--config (LEASH_CONFIG, default '')", "--log-level (LEASH_LOG_LEVEL, default 'info')"}) {
    EXPECT_NE(usage.find(expected), std::string::npos) << expected << "\n" << usage;
  }
}

}  // namespace
}  // namespace leash::worker

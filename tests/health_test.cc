// Integration tests of `leashctl health`, the probe behind the Kubernetes manifests, with
// real leash-server and leashctl processes on loopback: a serving shard is healthy (exit
// 0), an unreachable or stopped one is not (exit 1, naming the endpoint and why), and a
// CURVE shard is healthy only to a leashctl holding an authorized key.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "leash/common/curve_keys.h"
#include "support/process.h"

namespace leash {
namespace {

using namespace std::chrono_literals;
using testing::Endpoint;
using testing::FreePort;
using testing::Process;
using testing::TempDir;

class HealthTest : public ::testing::Test {
 protected:
  // Runs leashctl to completion; returns its exit code and output (stdout and stderr).
  std::pair<int, std::string> Leashctl(std::vector<std::string> args) {
    args.insert(args.begin(), LEASHCTL_BIN);
    return testing::RunToCompletion(std::move(args), dir_.path(), 60s);
  }

  std::unique_ptr<Process> StartShard(const std::string& endpoint,
                                      std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {LEASH_SERVER_BIN, "--bind=" + endpoint,
                                     "--data-dir=" + dir_.path() + "/shard0",
                                     "--checkpoint-interval=0", "--no-sync"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<Process>(argv, dir_.path() + "/shard0.log");
  }

  TempDir dir_;
};

TEST_F(HealthTest, ServingShardIsHealthyAndUnreachableOrStoppedOnesAreNot) {
  const std::string up = Endpoint(FreePort());
  const std::string nobody = Endpoint(FreePort());
  auto shard = StartShard(up);

  auto [code, out] = Leashctl({"--servers=" + up, "--timeout=30", "health"});
  EXPECT_EQ(code, 0) << out << shard->ReadLog();
  EXPECT_NE(out.find(up + ": serving: shard 0 of 1"), std::string::npos) << out;

  // One answers, one does not: unhealthy, and the verdict names the one that failed.
  auto [both, both_out] = Leashctl({"--servers=" + up + "," + nobody, "--timeout=1", "health"});
  EXPECT_EQ(both, 1) << both_out;
  EXPECT_NE(both_out.find(up + ": serving"), std::string::npos) << both_out;
  EXPECT_NE(both_out.find(nobody + ": NOT SERVING: unreachable: no answer within 1 s"),
            std::string::npos)
      << both_out;

  shard->Signal(SIGTERM);
  ASSERT_EQ(shard->Wait(30s), std::optional<int>(0)) << shard->ReadLog();
  auto [stopped, stopped_out] = Leashctl({"--servers=" + up, "--timeout=1", "health"});
  EXPECT_EQ(stopped, 1) << stopped_out;
  EXPECT_NE(stopped_out.find("still recovering its snapshot"), std::string::npos) << stopped_out;

  auto [bad, bad_out] = Leashctl({"--servers=" + up, "--timeout=0", "health"});
  EXPECT_EQ(bad, 2) << bad_out;
  EXPECT_NE(bad_out.find("--timeout"), std::string::npos) << bad_out;
}

TEST_F(HealthTest, CurveShardIsHealthyOnlyWithAnAuthorizedKey) {
  const std::string keys = dir_.path() + "/keys";
  bool created = false;
  ASSERT_TRUE(GenerateCurveKeyPair(keys, "server", false, &created).ok());
  ASSERT_TRUE(GenerateCurveKeyPair(keys, "client", true, &created).ok());
  const std::string endpoint = Endpoint(FreePort());
  auto shard = StartShard(endpoint, {"--curve-keys=" + keys});

  auto [code, out] = Leashctl({"--servers=" + endpoint, "--curve-keys=" + keys, "health"});
  EXPECT_EQ(code, 0) << out << shard->ReadLog();
  EXPECT_NE(out.find("serving"), std::string::npos) << out;

  auto [plain, plain_out] = Leashctl({"--servers=" + endpoint, "--timeout=20", "health"});
  EXPECT_EQ(plain, 1) << plain_out;
  EXPECT_NE(plain_out.find("NOT SERVING"), std::string::npos) << plain_out;
  EXPECT_NE(plain_out.find("--curve-keys"), std::string::npos) << plain_out;
  shard->Signal(SIGTERM);
  EXPECT_EQ(shard->Wait(30s), std::optional<int>(0)) << shard->ReadLog();
}

}  // namespace
}  // namespace leash

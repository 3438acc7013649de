// Tests of the shared command line: job files (sections, keys, types, syntax), the
// precedence defaults < job file < environment < flags, and where a value came from.
#include "leash/common/cli.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace leash {
namespace {

// A job file under the test's temporary directory, removed afterwards.
class JobFile {
 public:
  explicit JobFile(const std::string& text)
      : path_(::testing::TempDir() + "/leash_cli_test_" + std::to_string(getpid()) + "_" +
              std::to_string(counter_++) + ".yaml") {
    std::ofstream(path_) << text;
  }
  ~JobFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

// Sets an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

struct Values {
  std::string servers;
  int64_t batch = 64;
  double lr = 0.01;
  bool local = false;
};

// A program with four flags reading the worker: section.
class CliTest : public ::testing::Test {
 protected:
  CliTest() : cli_("prog", "a test program", "worker") {
    cli_.flags().List("servers", &v_.servers, "");
    cli_.flags().Int("batch", &v_.batch, "");
    cli_.flags().Double("lr", &v_.lr, "");
    cli_.flags().Bool("local", &v_.local, "");
  }
  Status Parse(std::vector<const char*> args) {
    args.insert(args.begin(), "prog");
    return cli_.Parse(static_cast<int>(args.size()), args.data());
  }
  // Parses a job file holding `text` and returns the message ("" when it parsed).
  std::string ParseFile(const std::string& text) {
    JobFile file(text);
    std::string arg = "--config=" + file.path();
    Status st = Parse({arg.c_str()});
    return st.ok() ? "" : st.message();
  }

  Values v_;
  CommandLine cli_;
};

TEST_F(CliTest, JobFileSetsValuesOfItsOwnSection) {
  EXPECT_EQ(ParseFile("worker:\n  batch: 32\n  lr: 1e-3\n  local: true\n"
                      "  servers: [tcp://a:1, tcp://b:2]\n"
                      "server:\n  num-shards: 2\n"),
            "");
  EXPECT_EQ(v_.batch, 32);
  EXPECT_DOUBLE_EQ(v_.lr, 1e-3);
  EXPECT_TRUE(v_.local);
  EXPECT_EQ(v_.servers, "tcp://a:1,tcp://b:2");
}

TEST_F(CliTest, EnvironmentOverridesTheJobFileAndFlagsOverrideBoth) {
  JobFile file("worker:\n  batch: 32\n  lr: 0.5\n  servers: tcp://file:1\n");
  ScopedEnv env_batch("LEASH_BATCH", "16");
  ScopedEnv env_lr("LEASH_LR", "0.25");
  std::string config = "--config=" + file.path();
  ASSERT_TRUE(Parse({config.c_str(), "--lr", "0.125"}).ok());
  EXPECT_EQ(v_.servers, "tcp://file:1");  // only in the file
  EXPECT_EQ(v_.batch, 16);                // file < environment
  EXPECT_DOUBLE_EQ(v_.lr, 0.125);         // environment < flag
  EXPECT_EQ(cli_.Source("servers"), "key worker.servers of " + file.path());
  EXPECT_EQ(cli_.Source("batch"), "LEASH_BATCH");
  EXPECT_EQ(cli_.Source("lr"), "--lr");
  EXPECT_EQ(cli_.Source("local"), "--local (default)");
}

TEST_F(CliTest, JobFileIsFoundThroughLeashConfig) {
  JobFile file("worker:\n  batch: 8\n");
  ScopedEnv env("LEASH_CONFIG", file.path());
  ASSERT_TRUE(Parse({}).ok());
  EXPECT_EQ(v_.batch, 8);
}

TEST_F(CliTest, UnknownKeyIsAnErrorNamingKeyAndFile) {
  std::string message = ParseFile("worker:\n  bacth: 32\n");
  EXPECT_NE(message.find("unknown key worker.bacth"), std::string::npos) << message;
  EXPECT_NE(message.find(".yaml:2:3"), std::string::npos) << message;
}

TEST_F(CliTest, SnakeCaseKeyGetsAHint) {
  cli_.flags().Int("chunk-size", &v_.batch, "");
  std::string message = ParseFile("worker:\n  chunk_size: 32\n");
  EXPECT_NE(message.find("did you mean chunk-size?"), std::string::npos) << message;
}

TEST_F(CliTest, UnknownSectionIsAnError) {
  std::string message = ParseFile("wroker:\n  batch: 32\n");
  EXPECT_NE(message.find("unknown section 'wroker'"), std::string::npos) << message;
}

TEST_F(CliTest, WrongTypeIsAnErrorNamingKeyFileAndExpectedType) {
  std::string message = ParseFile("worker:\n  batch: [1, 2]\n");
  EXPECT_NE(message.find("key worker.batch"), std::string::npos) << message;
  EXPECT_NE(message.find("must be an integer, not a sequence"), std::string::npos) << message;

  message = ParseFile("worker:\n  batch: many\n");
  EXPECT_NE(message.find("bad value for key worker.batch of "), std::string::npos) << message;
  EXPECT_NE(message.find("'many' is not an integer"), std::string::npos) << message;

  message = ParseFile("worker:\n  local: maybe\n");
  EXPECT_NE(message.find("'maybe' is not a boolean"), std::string::npos) << message;

  message = ParseFile("worker:\n  lr:\n");
  EXPECT_NE(message.find("key worker.lr"), std::string::npos) << message;
  EXPECT_NE(message.find("not empty"), std::string::npos) << message;

  message = ParseFile("worker:\n  servers: {a: 1}\n");
  EXPECT_NE(message.find("not a map"), std::string::npos) << message;
}

TEST_F(CliTest, SectionThatIsNotAMapIsAnError) {
  std::string message = ParseFile("worker: 3\n");
  EXPECT_NE(message.find("section worker"), std::string::npos) << message;
  EXPECT_NE(message.find("must be a map"), std::string::npos) << message;
  message = ParseFile("server: [a]\n");
  EXPECT_NE(message.find("section server"), std::string::npos) << message;
}

TEST_F(CliTest, ConfigAndHelpAreNotJobFileKeys) {
  std::string message = ParseFile("worker:\n  config: other.yaml\n");
  EXPECT_NE(message.find("unknown key worker.config"), std::string::npos) << message;
}

TEST_F(CliTest, MissingFileIsAnErrorNamingIt) {
  Status st = Parse({"--config", "/nonexistent/job.yaml"});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cannot read job file /nonexistent/job.yaml"), std::string::npos)
      << st;
}

TEST_F(CliTest, MalformedYamlIsAnErrorWithItsPosition) {
  std::string message = ParseFile("worker:\n  batch: [1,\n");
  EXPECT_NE(message.find("is not valid YAML"), std::string::npos) << message;
  EXPECT_NE(message.find(".yaml:"), std::string::npos) << message;
}

TEST_F(CliTest, EmptyFileAndEmptySectionSetNothing) {
  EXPECT_EQ(ParseFile(""), "");
  EXPECT_EQ(ParseFile("worker:\nserver:\n"), "");
  EXPECT_EQ(v_.batch, 64);
}

TEST_F(CliTest, BadLogLevelIsAnError) {
  Status st = Parse({"--log-level=loud"});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "bad value for --log-level: 'loud' (use trace, debug, info, warn, error or off)");
}

TEST_F(CliTest, UsageListsConfigAndLogLevelAfterTheProgramsFlags) {
  std::string usage = cli_.Usage();
  size_t local = usage.find("--local");
  size_t config = usage.find("--config (LEASH_CONFIG");
  size_t level = usage.find("--log-level (LEASH_LOG_LEVEL, default 'info')");
  ASSERT_NE(local, std::string::npos) << usage;
  ASSERT_NE(config, std::string::npos) << usage;
  ASSERT_NE(level, std::string::npos) << usage;
  EXPECT_LT(local, config);
  EXPECT_LT(config, level);
}

TEST(CommandLineTest, ProgramWithoutJobSectionHasNoConfigFlag) {
  CommandLine cli("tool", "a tool", "", "warn");
  EXPECT_EQ(cli.Usage().find("--config"), std::string::npos);
  const char* argv[] = {"tool", "--config=x.yaml"};
  Status st = cli.Parse(2, argv);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("unknown flag --config"), std::string::npos) << st;
}

TEST(RunPrologueTest, ReturnsTwoForABadValueAndZeroForHelp) {
  CommandLine bad("prog", "", "worker");
  const char* argv[] = {"prog", "--log-level=loud"};
  EXPECT_EQ(RunPrologue(bad, 2, argv, "t1", [] { return Status::Ok(); }), std::optional<int>(2));

  CommandLine help("prog", "", "worker");
  const char* help_argv[] = {"prog", "--help"};
  bool validated = false;
  auto validate = [&] {
    validated = true;
    return Status::Ok();
  };
  EXPECT_EQ(RunPrologue(help, 2, help_argv, "t2", validate), std::optional<int>(0));
  EXPECT_FALSE(validated);

  CommandLine invalid("prog", "", "worker");
  const char* plain[] = {"prog"};
  EXPECT_EQ(RunPrologue(invalid, 1, plain, "t3", [] { return InvalidArgument("no"); }),
            std::optional<int>(2));
}

}  // namespace
}  // namespace leash

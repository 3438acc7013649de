// Tests of flag parsing and environment twins.
#include "leash/common/flags.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace leash {
namespace {

struct Parsed {
  std::string servers = "default";
  int64_t staleness = 0;
  double lr = 0.1;
  bool local = false;
};

Status ParseInto(std::vector<const char*> args, Parsed* p, Flags** keep = nullptr) {
  static Flags* flags = nullptr;
  delete flags;
  flags = new Flags("t", "test");
  flags->String("servers", &p->servers, "");
  flags->Int("staleness", &p->staleness, "");
  flags->Double("lr", &p->lr, "");
  flags->Bool("local", &p->local, "");
  args.insert(args.begin(), "prog");
  if (keep != nullptr) *keep = flags;
  return flags->Parse(static_cast<int>(args.size()), args.data());
}

TEST(FlagsTest, ParsesBothSyntaxesAndBareBooleans) {
  Parsed p;
  ASSERT_TRUE(ParseInto({"--servers", "a,b", "--staleness=3", "--lr", "0.5", "--local"}, &p).ok());
  EXPECT_EQ(p.servers, "a,b");
  EXPECT_EQ(p.staleness, 3);
  EXPECT_DOUBLE_EQ(p.lr, 0.5);
  EXPECT_TRUE(p.local);
}

TEST(FlagsTest, EnvironmentTwinIsReadAndCommandLineWins) {
  Parsed p;
  setenv("LEASH_SERVERS", "from-env", 1);
  setenv("LEASH_STALENESS", "4", 1);
  ASSERT_TRUE(ParseInto({"--staleness", "2"}, &p).ok());
  unsetenv("LEASH_SERVERS");
  unsetenv("LEASH_STALENESS");
  EXPECT_EQ(p.servers, "from-env");
  EXPECT_EQ(p.staleness, 2);
  EXPECT_EQ(Flags::EnvName("checkpoint-interval"), "LEASH_CHECKPOINT_INTERVAL");
}

TEST(FlagsTest, BadInputNamesTheFlag) {
  Parsed p;
  Status st = ParseInto({"--staleness", "three"}, &p);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--staleness"), std::string::npos) << st;
  EXPECT_NE(ParseInto({"--bogus", "1"}, &p).message().find("--bogus"), std::string::npos);
  EXPECT_FALSE(ParseInto({"--lr"}, &p).ok());
  EXPECT_FALSE(ParseInto({"--lr", "nan"}, &p).ok());
  EXPECT_FALSE(ParseInto({"--local=maybe"}, &p).ok());
  setenv("LEASH_STALENESS", "x", 1);
  st = ParseInto({}, &p);
  unsetenv("LEASH_STALENESS");
  EXPECT_NE(st.message().find("LEASH_STALENESS"), std::string::npos) << st;
}

TEST(FlagsTest, HelpAndPositionalArguments) {
  Parsed p;
  Flags* f = nullptr;
  ASSERT_TRUE(ParseInto({"status", "--help"}, &p, &f).ok());
  EXPECT_TRUE(f->help_requested());
  ASSERT_EQ(f->positional().size(), 1u);
  EXPECT_EQ(f->positional()[0], "status");
  EXPECT_NE(f->Usage().find("LEASH_SERVERS"), std::string::npos);
}

TEST(FlagsTest, ParseOrExitCodeGoesOnOrGivesTheExitCode) {
  int64_t n = 0;
  auto run = [&n](std::vector<const char*> args) {
    Flags f("t", "test");
    f.Int("n", &n, "");
    args.insert(args.begin(), "prog");
    return f.ParseOrExitCode(static_cast<int>(args.size()), args.data());
  };
  EXPECT_EQ(run({"--n=3"}), std::nullopt);
  EXPECT_EQ(n, 3);
  testing::internal::CaptureStderr();
  EXPECT_EQ(run({"--n=three"}), 2);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("t: bad value for --n"), std::string::npos) << err;  // the error, named
  EXPECT_NE(err.find("usage: t"), std::string::npos) << err;
  testing::internal::CaptureStdout();
  EXPECT_EQ(run({"--help"}), 0);
  EXPECT_NE(testing::internal::GetCapturedStdout().find("usage: t"), std::string::npos);
}

TEST(FlagsTest, SplitListAndDurations) {
  EXPECT_EQ(SplitList(" a, b ,,c "), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(*ParseDurationMs("250ms"), 250);
  EXPECT_EQ(*ParseDurationMs("10s"), 10000);
  EXPECT_EQ(*ParseDurationMs("2"), 2000);
  EXPECT_EQ(*ParseDurationMs("1.5m"), 90000);
  EXPECT_FALSE(ParseDurationMs("10 parsecs").ok());
  EXPECT_FALSE(ParseDurationMs("-1s").ok());
  EXPECT_FALSE(ParseDurationMs("").ok());
}

}  // namespace
}  // namespace leash

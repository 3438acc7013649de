// Helpers for the tests of the executables' configuration parsers (leash-server's and
// leash-worker's config_test): argv from strings, the message of a parse that must fail,
// and job files written into the test's temporary directory. Thread-compatible.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "leash/common/status.h"

namespace leash::testing {

// `parse(argc, argv)` on `program` followed by `args`.
template <typename Config, typename ParseFn>
Result<Config> ParseArgs(const char* program, ParseFn parse, const std::vector<std::string>& args) {
  std::vector<const char*> argv = {program};
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse(static_cast<int>(argv.size()), argv.data());
}

// The message of `parsed`, which must have failed (a test failure naming `args` if not).
template <typename Config>
std::string ErrorOf(const Result<Config>& parsed, const std::vector<std::string>& args) {
  EXPECT_FALSE(parsed.ok()) << "accepted: " << ::testing::PrintToString(args);
  return parsed.ok() ? "" : parsed.status().message();
}

// Writes `text` to a new file named after `stem` in the test's temporary directory.
inline std::string WriteJobFile(const std::string& stem, const std::string& text) {
  static int counter = 0;
  std::string path = ::testing::TempDir() + "/" + stem + "_" + std::to_string(getpid()) + "_" +
                     std::to_string(counter++) + ".yaml";
  std::ofstream(path) << text;
  return path;
}

}  // namespace leash::testing

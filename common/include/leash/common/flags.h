// Command-line flags, each with an environment-variable twin: `--checkpoint-interval`
// is also read from LEASH_CHECKPOINT_INTERVAL, so one image works under docker compose
// and Kubernetes. A flag on the command line wins over the environment, which wins over
// values Set() before Parse() (a job file's). Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "leash/common/status.h"

namespace leash {

// What a flag holds; kList is a string holding a comma-separated list.
enum class FlagType { kString, kList, kInt, kDouble, kBool };

class Flags {
 public:
  Flags(std::string program, std::string description);

  // Registers a flag; the target holds the default until Parse() runs.
  void String(const std::string& name, std::string* target, const std::string& help);
  void Int(const std::string& name, int64_t* target, const std::string& help);
  void Double(const std::string& name, double* target, const std::string& help);
  void Bool(const std::string& name, bool* target, const std::string& help);
  // A string flag holding a comma-separated list ("a,b,c"); a job file may give a sequence.
  void List(const std::string& name, std::string* target, const std::string& help);

  bool Has(const std::string& name) const { return specs_.count(name) != 0; }
  // The type of a registered flag (Has(name) must hold).
  FlagType TypeOf(const std::string& name) const;
  // Sets a registered flag from `value`, remembering `origin` (e.g. "key worker.batch of
  // job.yaml") as where its value came from. InvalidArgument "bad value for ORIGIN: ..."
  // for a malformed value, or "unknown flag" for a name that was not registered.
  Status Set(const std::string& name, const std::string& value, const std::string& origin);
  // Where the flag's value came from: "--name", its environment variable, the origin of
  // the last Set(), or "--name (default)".
  std::string Source(const std::string& name) const;

  // Reads the environment, then argv (`--name value`, `--name=value`, `--flag` for
  // booleans). InvalidArgument naming the flag for unknown flags, missing or malformed
  // values. Sets help_requested() for --help / -h.
  Status Parse(int argc, const char* const* argv);
  bool help_requested() const { return help_requested_; }
  // Parse() for a program that needs nothing more (the benchmarks): nullopt to go on, or
  // the exit code after --help's usage on stdout (0) or the error, then the usage, on
  // stderr (2).
  std::optional<int> ParseOrExitCode(int argc, const char* const* argv);
  std::string Usage() const;
  const std::vector<std::string>& positional() const { return positional_; }

  // "checkpoint-interval" -> "LEASH_CHECKPOINT_INTERVAL".
  static std::string EnvName(const std::string& flag);

 private:
  struct Spec {
    std::string help;
    std::string default_value;
    bool is_bool = false;
    std::function<Status(const std::string&)> set;
    FlagType type = FlagType::kString;
    std::string source;  // empty: the default
  };

  std::string program_;
  std::string description_;
  std::map<std::string, Spec> specs_;
  std::vector<std::string> order_;
  std::vector<std::string> positional_;
  bool help_requested_ = false;
};

// Splits "a,b,c" into {"a","b","c"}, dropping empty items and surrounding spaces.
std::vector<std::string> SplitList(const std::string& s, char sep = ',');

// Parses a duration such as "500ms", "10s", "2m" or a plain number of seconds.
Result<int64_t> ParseDurationMs(const std::string& s);

}  // namespace leash

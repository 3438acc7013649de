// The command line every Leash executable shares: its flags with their environment twins,
// the --config job file (YAML) of leash-worker and leash-server, --log-level and --help,
// and the prologue that turns them into a validated config, answers --help and sets up
// logging, with exit code 2 for any bad value. Not thread-safe; used from main() only.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "leash/common/flags.h"
#include "leash/common/status.h"

namespace leash {

// The sections a job file may hold, one per program that reads it.
inline constexpr const char* kJobFileSections[] = {"worker", "server"};

// Applies section `section` (e.g. "worker") of the YAML job file at `path` to `flags`:
// each key is a flag's name without "--" and its value a scalar (a sequence for a list
// flag). InvalidArgument naming the file (and the key, line and column where known) for
// a file that cannot be read or parsed, a top-level key other than kJobFileSections, a
// section that is not a map, an unknown key, a value of the wrong type or a malformed
// value. Other programs' sections are checked to be maps, not read.
Status ApplyJobFile(const std::string& path, const std::string& section, Flags& flags);

class CommandLine {
 public:
  // `job_section`: the section of a --config job file this program reads ("worker" or
  // "server"); empty: the program has no --config flag. `default_log_level`: the default
  // of --log-level.
  CommandLine(std::string program, std::string description, std::string job_section,
              std::string default_log_level = "info");

  // Register the program's own flags here before Parse().
  Flags& flags() { return flags_; }
  const std::string& program() const { return program_; }

  // Parses in the order defaults < job file (--config or LEASH_CONFIG) < environment <
  // command line. InvalidArgument naming the flag, variable or file key for a bad value;
  // an unknown --log-level is one too.
  Status Parse(int argc, const char* const* argv);
  bool help_requested() const { return flags_.help_requested(); }
  std::string Usage();
  const std::vector<std::string>& positional() const { return flags_.positional(); }
  const std::string& log_level() const { return log_level_; }
  const std::string& config_path() const { return config_path_; }

  // Where `flag`'s value came from (see Flags::Source).
  std::string Source(const std::string& flag) const { return flags_.Source(flag); }
  // InvalidArgument "bad value for SOURCE: 'VALUE' (ACCEPTED)", naming where the value of
  // `flag` came from; for the config validation after Parse().
  Status BadValue(const std::string& flag, const std::string& value,
                  const std::string& accepted) const;

 private:
  void AddCommonFlags();

  std::string program_;
  std::string job_section_;
  Flags flags_;
  std::string config_path_;
  std::string log_level_;
  bool common_flags_added_ = false;
};

// The shared prologue of a program's main(): parses the command line, answers --help
// (usage on stdout), validates with `validate` (which turns the parsed flags into the
// program's config), then installs the logger `component` at --log-level. Returns the exit
// code main() should return now (0 after --help; 2, with "PROGRAM: message" on stderr,
// for a bad flag, environment variable, job file or config value), or nullopt: run.
std::optional<int> RunPrologue(CommandLine& cli, int argc, const char* const* argv,
                               const std::string& component,
                               const std::function<Status()>& validate);

// The same, returning the config `make` builds, or the exit code to return now.
template <typename Config>
std::variant<Config, int> RunPrologue(CommandLine& cli, int argc, const char* const* argv,
                                      const std::string& component,
                                      const std::function<Result<Config>()>& make) {
  std::optional<Config> config;
  std::optional<int> code = RunPrologue(cli, argc, argv, component, [&]() -> Status {
    Result<Config> made = make();
    if (!made.ok()) return made.status();
    config = std::move(*made);
    return Status::Ok();
  });
  if (code.has_value()) return *code;
  return std::move(*config);
}

}  // namespace leash

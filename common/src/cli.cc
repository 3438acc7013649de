// The shared command line: job files through yaml-cpp (the only yaml-cpp user), the
// --config / --log-level flags and the prologue of the executables. Not thread-safe.
#include "leash/common/cli.h"

#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "leash/common/logging.h"

namespace leash {
namespace {

const char* NodeKind(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Scalar:
      return "a scalar";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Undefined:
      break;
  }
  return "an undefined node";
}

const char* Expected(FlagType type) {
  switch (type) {
    case FlagType::kString:
      return "a string";
    case FlagType::kList:
      return "a string or a sequence of strings";
    case FlagType::kInt:
      return "an integer";
    case FlagType::kDouble:
      return "a number";
    case FlagType::kBool:
      return "true or false";
  }
  return "a value";
}

// "FILE:LINE:COL" of `node` where yaml-cpp knows it, else "FILE".
std::string Where(const std::string& path, const YAML::Node& node) {
  YAML::Mark mark = node.Mark();
  if (mark.is_null()) return path;
  return path + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

// The flag value a job-file entry stands for: a scalar as written, a sequence of scalars
// (list flags only) joined with commas.
Result<std::string> FlagValue(const YAML::Node& value, FlagType type, const std::string& key,
                              const std::string& where) {
  std::string wrong = "key " + key + " at " + where + " must be " + Expected(type) + ", not ";
  if (value.IsScalar()) return value.Scalar();
  if (value.IsSequence() && type == FlagType::kList) {
    std::string joined;
    for (const auto& item : value) {
      if (!item.IsScalar()) {
        return InvalidArgument(wrong + "a sequence holding " + NodeKind(item));
      }
      if (!joined.empty()) joined += ",";
      joined += item.Scalar();
    }
    return joined;
  }
  if (value.IsNull()) {
    return InvalidArgument(wrong + "empty (write \"\" for an empty string, or drop the key)");
  }
  return InvalidArgument(wrong + NodeKind(value));
}

// A hint for a misspelt key: the flag with '_' written as '-', if there is one.
std::string Hint(const std::string& key, const Flags& flags) {
  std::string dashed = key;
  for (char& c : dashed) {
    if (c == '_') c = '-';
  }
  if (dashed != key && flags.Has(dashed)) return " (did you mean " + dashed + "?)";
  return "";
}

bool IsSection(const std::string& key) {
  for (const char* s : kJobFileSections) {
    if (key == s) return true;
  }
  return false;
}

}  // namespace

Status ApplyJobFile(const std::string& path, const std::string& section, Flags& flags) {
  std::ifstream in(path);
  if (!in) {
    return InvalidArgument("cannot read job file " + path +
                           " (--config / LEASH_CONFIG): no such file, or it is not readable");
  }
  std::stringstream text;
  text << in.rdbuf();
  YAML::Node root;
  try {
    root = YAML::Load(text.str());
  } catch (const YAML::Exception& e) {
    return InvalidArgument("job file " + path + ":" + std::to_string(e.mark.line + 1) + ":" +
                           std::to_string(e.mark.column + 1) + " is not valid YAML: " + e.msg);
  }
  if (root.IsNull()) return Status::Ok();  // an empty file sets nothing
  if (!root.IsMap()) {
    return InvalidArgument("job file " + path +
                           " must be a map of sections (worker:, server:), not " + NodeKind(root));
  }
  YAML::Node mine;
  for (const auto& entry : root) {
    if (!entry.first.IsScalar()) {
      return InvalidArgument("job file " + Where(path, entry.first) + ": a key must be a name");
    }
    const std::string name = entry.first.Scalar();
    if (!IsSection(name)) {
      return InvalidArgument("unknown section '" + name + "' at " + Where(path, entry.first) +
                             " (a job file holds the sections worker: and server:)");
    }
    if (!entry.second.IsMap() && !entry.second.IsNull()) {
      return InvalidArgument("section " + name + " at " + Where(path, entry.first) +
                             " must be a map of flag names to values, not " +
                             NodeKind(entry.second));
    }
    if (name == section) mine = entry.second;
  }
  if (!mine.IsDefined() || mine.IsNull()) return Status::Ok();
  for (const auto& entry : mine) {
    const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : "?";
    const std::string qualified = section + "." + key;
    const std::string where = Where(path, entry.first);
    if (!entry.first.IsScalar() || !flags.Has(key) || key == "config" || key == "help") {
      return InvalidArgument("unknown key " + qualified + " at " + where + Hint(key, flags) +
                             ": keys are the flag names without --, see --help");
    }
    LEASH_ASSIGN_OR_RETURN(std::string value,
                           FlagValue(entry.second, flags.TypeOf(key), qualified, where));
    LEASH_RETURN_IF_ERROR(flags.Set(key, value, "key " + qualified + " of " + path));
  }
  return Status::Ok();
}

CommandLine::CommandLine(std::string program, std::string description, std::string job_section,
                         std::string default_log_level)
    : program_(program),
      job_section_(std::move(job_section)),
      flags_(std::move(program), std::move(description)),
      log_level_(std::move(default_log_level)) {}

void CommandLine::AddCommonFlags() {
  if (common_flags_added_) return;
  common_flags_added_ = true;
  if (!job_section_.empty()) {
    flags_.String("config", &config_path_,
                  "YAML job file: this program reads its settings from the file's '" +
                      job_section_ +
                      ":' section (keys are these flags' names); environment "
                      "variables and flags override it (see docs/job-file.md)");
  }
  flags_.String("log-level", &log_level_, "trace, debug, info, warn or error");
}

Status CommandLine::Parse(int argc, const char* const* argv) {
  AddCommonFlags();
  if (!job_section_.empty()) {
    // The job file goes under the environment and the command line, so find it first.
    std::string path;
    std::string origin;
    if (const char* env = std::getenv("LEASH_CONFIG"); env != nullptr && *env != '\0') {
      path = env;
    }
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--config" && i + 1 < argc) {
        path = argv[++i];
      } else if (arg.rfind("--config=", 0) == 0) {
        path = arg.substr(9);
      }
    }
    if (!path.empty()) LEASH_RETURN_IF_ERROR(ApplyJobFile(path, job_section_, flags_));
  }
  LEASH_RETURN_IF_ERROR(flags_.Parse(argc, argv));
  spdlog::level::level_enum level = spdlog::level::from_str(log_level_);
  if (level == spdlog::level::off && log_level_ != "off") {
    return BadValue("log-level", log_level_, "use trace, debug, info, warn, error or off");
  }
  return Status::Ok();
}

std::string CommandLine::Usage() {
  AddCommonFlags();
  return flags_.Usage();
}

Status CommandLine::BadValue(const std::string& flag, const std::string& value,
                             const std::string& accepted) const {
  return InvalidArgument("bad value for " + flags_.Source(flag) + ": '" + value + "' (" + accepted +
                         ")");
}

std::optional<int> RunPrologue(CommandLine& cli, int argc, const char* const* argv,
                               const std::string& component,
                               const std::function<Status()>& validate) {
  auto fail = [&](const Status& st) {
    std::fprintf(stderr, "%s: %s\n", cli.program().c_str(), st.message().c_str());
    return 2;
  };
  if (Status st = cli.Parse(argc, argv); !st.ok()) return fail(st);
  if (cli.help_requested()) {
    std::fputs(cli.Usage().c_str(), stdout);
    return 0;
  }
  if (Status st = validate(); !st.ok()) return fail(st);
  if (Status st = InitLogging(component, cli.log_level()); !st.ok()) return fail(st);
  return std::nullopt;
}

}  // namespace leash

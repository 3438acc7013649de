// Flag parsing with environment twins.
#include "leash/common/flags.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace leash {

Flags::Flags(std::string program, std::string description)
    : program_(std::move(program)), description_(std::move(description)) {}

std::string Flags::EnvName(const std::string& flag) {
  std::string env = "LEASH_";
  for (char c : flag)
    env += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return env;
}

void Flags::String(const std::string& name, std::string* target, const std::string& help) {
  order_.push_back(name);
  specs_[name] = {help,
                  *target,
                  false,
                  [target](const std::string& v) {
                    *target = v;
                    return Status::Ok();
                  },
                  FlagType::kString,
                  {}};
}

void Flags::Int(const std::string& name, int64_t* target, const std::string& help) {
  order_.push_back(name);
  specs_[name] = {help,
                  std::to_string(*target),
                  false,
                  [target](const std::string& v) {
                    errno = 0;
                    char* end = nullptr;
                    long long x = std::strtoll(v.c_str(), &end, 10);
                    if (v.empty() || *end != '\0' || errno == ERANGE)
                      return InvalidArgument("'" + v + "' is not an integer");
                    *target = x;
                    return Status::Ok();
                  },
                  FlagType::kInt,
                  {}};
}

void Flags::Double(const std::string& name, double* target, const std::string& help) {
  order_.push_back(name);
  std::ostringstream def;
  def << *target;
  specs_[name] = {help,
                  def.str(),
                  false,
                  [target](const std::string& v) {
                    char* end = nullptr;
                    double x = std::strtod(v.c_str(), &end);
                    if (v.empty() || *end != '\0' || !std::isfinite(x))
                      return InvalidArgument("'" + v + "' is not a finite number");
                    *target = x;
                    return Status::Ok();
                  },
                  FlagType::kDouble,
                  {}};
}

void Flags::List(const std::string& name, std::string* target, const std::string& help) {
  String(name, target, help);
  specs_[name].type = FlagType::kList;
}

FlagType Flags::TypeOf(const std::string& name) const { return specs_.at(name).type; }

std::string Flags::Source(const std::string& name) const {
  const Spec& spec = specs_.at(name);
  return spec.source.empty() ? "--" + name + " (default)" : spec.source;
}

void Flags::Bool(const std::string& name, bool* target, const std::string& help) {
  order_.push_back(name);
  specs_[name] = {help,
                  *target ? "true" : "false",
                  true,
                  [target](const std::string& v) {
                    if (v == "1" || v == "true" || v == "yes" || v == "on") {
                      *target = true;
                    } else if (v == "0" || v == "false" || v == "no" || v == "off") {
                      *target = false;
                    } else {
                      return InvalidArgument("'" + v + "' is not a boolean (use true or false)");
                    }
                    return Status::Ok();
                  },
                  FlagType::kBool,
                  {}};
}

Status Flags::Set(const std::string& name, const std::string& value, const std::string& origin) {
  auto it = specs_.find(name);
  if (it == specs_.end()) return InvalidArgument("unknown flag --" + name + "; see --help");
  Status s = it->second.set(value);
  if (!s.ok()) return InvalidArgument("bad value for " + origin + ": " + s.message());
  it->second.source = origin;
  return Status::Ok();
}

Status Flags::Parse(int argc, const char* const* argv) {
  for (const auto& name : order_) {
    std::string env = EnvName(name);
    if (const char* v = std::getenv(env.c_str()); v != nullptr && *v != '\0') {
      LEASH_RETURN_IF_ERROR(Set(name, v, env));
    }
  }
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = specs_.find(name);
    if (it == specs_.end()) return InvalidArgument("unknown flag --" + name + "; see --help");
    if (!has_value) {
      if (it->second.is_bool) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return InvalidArgument("flag --" + name + " needs a value");
      }
    }
    LEASH_RETURN_IF_ERROR(Set(name, value, "--" + name));
  }
  return Status::Ok();
}

std::optional<int> Flags::ParseOrExitCode(int argc, const char* const* argv) {
  const Status st = Parse(argc, argv);
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", program_.c_str(), st.message().c_str());
    std::fputs(Usage().c_str(), stderr);
    return 2;
  }
  if (help_requested_) {
    std::fputs(Usage().c_str(), stdout);
    return 0;
  }
  return std::nullopt;
}

std::string Flags::Usage() const {
  std::ostringstream os;
  os << "usage: " << program_ << " [flags]\n"
     << description_ << "\n\nflags (each also read from its environment variable):\n";
  for (const auto& name : order_) {
    const Spec& s = specs_.at(name);
    os << "  --" << name << " (" << EnvName(name) << ", default '" << s.default_value
       << "')\n      " << s.help << "\n";
  }
  return os.str();
}

std::vector<std::string> SplitList(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    size_t b = cur.find_first_not_of(" \t");
    size_t e = cur.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(cur.substr(b, e - b + 1));
    cur.clear();
  };
  for (char c : s) {
    if (c == sep) {
      flush();
    } else {
      cur += c;
    }
  }
  flush();
  return out;
}

Result<int64_t> ParseDurationMs(const std::string& s) {
  char* end = nullptr;
  double x = std::strtod(s.c_str(), &end);
  if (s.empty() || end == s.c_str() || !std::isfinite(x) || x < 0) {
    return InvalidArgument("'" + s + "' is not a duration (e.g. 500ms, 10s, 2m)");
  }
  std::string unit(end);
  double ms;
  if (unit.empty() || unit == "s") {
    ms = x * 1000;
  } else if (unit == "ms") {
    ms = x;
  } else if (unit == "m") {
    ms = x * 60000;
  } else if (unit == "h") {
    ms = x * 3600000;
  } else {
    return InvalidArgument("'" + s + "' has an unknown unit '" + unit + "' (use ms, s, m or h)");
  }
  return static_cast<int64_t>(ms);
}

}  // namespace leash

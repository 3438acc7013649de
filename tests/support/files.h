// Test support, header-only so unit tests beside the code can use it without linking the
// process helpers: snapshots of a directory tree, to show a refused data directory was
// left untouched, and lookups of files by name. Thread-compatible.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace leash::testing {

// Every entry under `dir` (recursively) with its bytes; directories as "<dir>".
inline std::map<std::string, std::string> TreeOf(const std::filesystem::path& dir) {
  std::map<std::string, std::string> tree;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    std::string content = "<dir>";
    if (e.is_regular_file()) {
      std::ifstream in(e.path(), std::ios::binary);
      std::ostringstream ss;
      ss << in.rdbuf();
      content = ss.str();
    }
    tree[std::filesystem::relative(e.path(), dir).string()] = content;
  }
  return tree;
}

// Files directly in `dir` whose names end with `part` (or start with it, for "MANIFEST-").
inline std::vector<std::filesystem::path> FilesNamed(const std::filesystem::path& dir,
                                                     const std::string& part) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(part) || name.starts_with(part)) out.push_back(e.path());
  }
  return out;
}

// Values of `"key": number` in order of appearance in the JSON file at `json_path` (a
// worker's --metrics-out), read with a pattern, not a parser: enough for flat numbers.
inline std::vector<double> JsonNumbers(const std::string& json_path, const std::string& key) {
  std::ifstream f(json_path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  std::vector<double> out;
  std::regex re("\"" + key + "\": ([0-9.eE+-]+)");
  for (auto it = std::sregex_iterator(s.begin(), s.end(), re); it != std::sregex_iterator(); ++it) {
    out.push_back(std::stod((*it)[1]));
  }
  return out;
}

}  // namespace leash::testing

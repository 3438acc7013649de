// Test support, header-only so unit tests beside the code can use it without linking the
// process helpers: snapshots of a directory tree, to show a refused data directory was
// left untouched, and lookups of files by name. Thread-compatible.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
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

}  // namespace leash::testing

// What every fuzz target shares: the invariant check and the seed-writing flag.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

// Aborts (a finding for libFuzzer) when an invariant of the code under test is broken,
// naming the condition, where it is and, if given, what it means: CHECK(x > 0) or
// CHECK(x > 0, "a batch holds a message").
#define CHECK(cond, ...)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "invariant broken: %s (%s) at %s:%d\n", "" __VA_ARGS__, #cond, \
                   __FILE__, __LINE__);                                                   \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

namespace leash::fuzz {

// For LLVMFuzzerInitialize: `<target> --write-seeds=DIR` calls write(DIR) and exits.
inline void WriteSeedsIfAsked(int argc, char** argv, void (*write)(const std::string& dir)) {
  constexpr std::string_view kFlag = "--write-seeds=";
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a.starts_with(kFlag)) {
      write(std::string(a.substr(kFlag.size())));
      std::exit(0);
    }
  }
}

}  // namespace leash::fuzz

// Process-wide spdlog setup for Leash executables. Call once from main().
#pragma once

#include <string>

#include "leash/common/status.h"

namespace leash {

// Installs a stderr logger named `component` at `level` (trace, debug, info, warn,
// error, critical, off). InvalidArgument for an unknown level.
Status InitLogging(const std::string& component, const std::string& level);

}  // namespace leash

// Endpoint checks shared by the executables' configurations: which ZeroMQ endpoints only
// this host can reach, and the secure-by-default rule for the others. Pure functions;
// thread-safe.
#pragma once

#include <string>
#include <vector>

#include "leash/common/status.h"

namespace leash {

// True for endpoints only this host can reach: tcp:// on 127.x, localhost, ::1 or the
// interface lo; ipc:// and inproc://. Anything else (0.0.0.0, *, another address, a host
// name) may be reachable from other hosts.
bool IsLoopbackEndpoint(const std::string& endpoint);

// Secure by default. OK when `curve_keys` is set, when `insecure` is, or when every one
// of `endpoints` is loopback (IsLoopbackEndpoint). Otherwise InvalidArgument naming the
// first endpoint other hosts could reach, `source` (the flag or variable it came from,
// e.g. "--bind"), and the two flags that fix it: --curve-keys and --insecure. `verb` says
// what the program was about to do with it ("listen on", "connect to").
Status CheckSecureEndpoints(const std::vector<std::string>& endpoints,
                            const std::string& curve_keys, bool insecure, const std::string& source,
                            const std::string& verb);

}  // namespace leash

// Endpoint checks: loopback detection and the secure-by-default rule. Thread-safe.
#include "leash/common/endpoint.h"

namespace leash {

bool IsLoopbackEndpoint(const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0) return true;
  auto scheme = endpoint.find("://");
  std::string host = scheme == std::string::npos ? endpoint : endpoint.substr(scheme + 3);
  if (auto colon = host.rfind(':'); colon != std::string::npos) host = host.substr(0, colon);
  return host.rfind("127.", 0) == 0 || host == "localhost" || host == "[::1]" || host == "::1" ||
         host == "lo";
}

Status CheckSecureEndpoints(const std::vector<std::string>& endpoints,
                            const std::string& curve_keys, bool insecure, const std::string& source,
                            const std::string& verb) {
  if (!curve_keys.empty() || insecure) return Status::Ok();
  for (const std::string& e : endpoints) {
    if (IsLoopbackEndpoint(e)) continue;
    return InvalidArgument(
        "refusing to " + verb + " " + e + " (" + source +
        ") without CURVE keys: other hosts can reach it, and anyone on the path could read and "
        "change the model. Add --curve-keys DIR (LEASH_CURVE_KEYS; `leashctl keygen DIR` writes "
        "the keys), or --insecure (LEASH_INSECURE=1) to run unauthenticated and unencrypted on "
        "a network you trust. Loopback and ipc:// endpoints need neither");
  }
  return Status::Ok();
}

}  // namespace leash

// Fixed-size values in the transport's own small binary headers (shared-memory offers and
// trailers, stripe headers): appended and read in the host's byte order, which is
// little-endian on every platform Leash builds for. Private to common/src. Thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace leash::le_bytes {

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}

template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace leash::le_bytes

// CRC32C (Castagnoli), slice-by-8: the checksum of Leash's own records on disk (the RocksDB
// snapshot's, a replica's durable log). RocksDB's own crc32c is not part of its public API.
// Thread-safe (no state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace leash {

// The CRC32C of `n` bytes at `data`, continuing from `crc` (the result of the bytes before;
// 0 to start), so that Crc32c(b, Crc32c(a)) == Crc32c(a + b).
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);
inline uint32_t Crc32c(std::string_view bytes, uint32_t crc = 0) {
  return Crc32c(bytes.data(), bytes.size(), crc);
}

}  // namespace leash

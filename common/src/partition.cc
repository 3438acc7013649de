// Range partitioning of table rows across shards.
#include "leash/common/partition.h"

#include "leash/common/status.h"

namespace leash {

RowRange RangePartitioner::Range(uint64_t rows, int shard) const {
  LEASH_CHECK(shard >= 0 && shard < num_shards_);
  auto s = static_cast<uint64_t>(shard);
  auto n = static_cast<uint64_t>(num_shards_);
  uint64_t base = rows / n;
  uint64_t extra = rows % n;  // the first `extra` shards get one more row
  uint64_t begin = s * base + (s < extra ? s : extra);
  uint64_t len = base + (s < extra ? 1 : 0);
  return {begin, begin + len};
}

int RangePartitioner::Owner(uint64_t rows, uint64_t key) const {
  LEASH_CHECK(key < rows);
  auto n = static_cast<uint64_t>(num_shards_);
  uint64_t base = rows / n;
  uint64_t extra = rows % n;
  uint64_t big = (base + 1) * extra;  // rows held by the shards with one extra row
  if (key < big) return static_cast<int>(key / (base + 1));
  return static_cast<int>(extra + (key - big) / base);
}

void RangePartitioner::Split(uint64_t rows, const std::vector<uint64_t>& keys,
                             std::vector<std::vector<uint64_t>>* out,
                             std::vector<std::vector<size_t>>* positions) const {
  out->assign(static_cast<size_t>(num_shards_), {});
  positions->assign(static_cast<size_t>(num_shards_), {});
  for (size_t i = 0; i < keys.size(); ++i) {
    auto s = static_cast<size_t>(Owner(rows, keys[i]));
    (*out)[s].push_back(keys[i]);
    (*positions)[s].push_back(i);
  }
}

int SparseOwner(uint64_t key, int num_shards) {
  // The finalizer of MurmurHash3 (fmix64): every key bit affects the high bits used below.
  uint64_t h = key;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return static_cast<int>((static_cast<unsigned __int128>(h) * static_cast<uint64_t>(num_shards)) >>
                          64);
}

}  // namespace leash

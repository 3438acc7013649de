// Key partitioning: which shard owns which rows of a table. Rows are split into
// contiguous ranges, one per shard, so dense layers travel as ranges, not key lists.
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace leash {

struct RowRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
  bool operator==(const RowRange&) const = default;
};

class RangePartitioner {
 public:
  explicit RangePartitioner(int num_shards) : num_shards_(num_shards) {}
  int num_shards() const { return num_shards_; }

  // Rows of a table of `rows` rows that shard `shard` owns. Ranges of consecutive shards
  // are adjacent, cover [0, rows) and differ in size by at most one row.
  RowRange Range(uint64_t rows, int shard) const;
  // The shard owning `key` in a table of `rows` rows (key < rows).
  int Owner(uint64_t rows, uint64_t key) const;
  // Splits `keys` by owner; positions[s][i] is the index in `keys` of out[s][i].
  void Split(uint64_t rows, const std::vector<uint64_t>& keys,
             std::vector<std::vector<uint64_t>>* out,
             std::vector<std::vector<size_t>>* positions) const;

 private:
  int num_shards_;
};

// The shard owning key `key` of a sparse table (TableKind::kSparse): a hash of the key
// mapped onto [0, num_shards), so ids whose low bits are skewed still spread evenly. Every
// client and shard must agree on it: changing it moves every row. A shard's own hash maps
// must hash keys differently (the keys one shard holds share this hash's high bits).
int SparseOwner(uint64_t key, int num_shards);

}  // namespace leash

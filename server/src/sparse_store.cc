// MemorySparseStore: the sparse cold tier in memory, with checkpoints as copies. For tests
// and fuzzing. One thread at a time.
#include "leash/server/sparse_store.h"

namespace leash::server {

Status MemorySparseStore::Read(uint32_t table_id, std::span<const uint64_t> keys,
                               size_t record_bytes, uint8_t* out, std::vector<uint8_t>* found) {
  return live_.Read(table_id, keys, record_bytes, out, found);
}

Status MemorySparseStore::Write(uint32_t table_id, std::span<const uint64_t> keys,
                                size_t record_bytes, const uint8_t* records,
                                std::span<const uint64_t> deletes) {
  return live_.Write(table_id, keys, record_bytes, records, deletes);
}

Status MemorySparseStore::Scan(
    uint32_t table_id, uint64_t* cursor, size_t limit, size_t record_bytes,
    const std::function<void(uint64_t key, const uint8_t* record)>& visit, bool* wrapped) {
  return live_.Scan(table_id, cursor, limit, record_bytes, visit, wrapped);
}

Status MemorySparseStore::DropTable(uint32_t table_id) { return live_.DropTable(table_id); }

uint64_t MemorySparseStore::ApproxRows(uint32_t table_id) const {
  return live_.ApproxRows(table_id);
}

namespace {

class MemoryImage final : public SparseStore::Image {
 public:
  explicit MemoryImage(const ps::MemoryRowStore& rows) : rows_(rows) {}
  Status Scan(uint32_t table_id, uint64_t* cursor, size_t limit, size_t record_bytes,
              const std::function<void(uint64_t key, const uint8_t* record)>& visit,
              bool* wrapped) override {
    return rows_.Scan(table_id, cursor, limit, record_bytes, visit, wrapped);
  }

 private:
  ps::MemoryRowStore rows_;
};

}  // namespace

Result<std::unique_ptr<SparseStore::Image>> MemorySparseStore::OpenImage() {
  return std::unique_ptr<Image>(std::make_unique<MemoryImage>(live_));
}

Status MemorySparseStore::Checkpoint(uint64_t sequence) {
  checkpoints_.insert_or_assign(sequence, live_);
  return Status::Ok();
}

Status MemorySparseStore::Restore(std::optional<uint64_t> sequence) {
  if (!sequence) {
    live_ = ps::MemoryRowStore();
    checkpoints_.clear();
    return Status::Ok();
  }
  auto it = checkpoints_.find(*sequence);
  if (it == checkpoints_.end())
    return NotFound("no checkpoint #" + std::to_string(*sequence) + " of the sparse rows");
  live_ = it->second;
  return Status::Ok();
}

Status MemorySparseStore::Prune(uint64_t keep) {
  std::erase_if(checkpoints_, [keep](const auto& c) { return c.first != keep; });
  return Status::Ok();
}

}  // namespace leash::server

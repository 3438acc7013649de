// Chunk leases per epoch. Not thread-safe (one request loop).
#include "leash/ps/coverage.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

namespace leash::ps {
namespace {

void PutU64(std::vector<uint8_t>* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}

bool GetU64(const std::vector<uint8_t>& in, size_t* pos, uint64_t* v) {
  if (*pos > in.size() || in.size() - *pos < 8) return false;
  *v = 0;
  for (int i = 0; i < 8; ++i)
    *v |= static_cast<uint64_t>(in[*pos + static_cast<size_t>(i)]) << (8 * i);
  *pos += 8;
  return true;
}

constexpr uint64_t kMagic = 0x313056434853414cULL;       // "LASHCV01": progress
constexpr uint64_t kMagicExact = 0x323056434853414cULL;  // "LASHCV02": with leases, queue

Status CheckPlan(const DataPlan& plan) {
  if (plan.num_samples == 0 || plan.chunk_size == 0 || plan.epochs == 0) {
    return InvalidArgument("data plan needs samples, chunk size and epochs > 0");
  }
  if (PlanChunks(plan) > kMaxChunks) {
    return InvalidArgument("data plan of " + std::to_string(plan.num_samples) +
                           " samples in chunks of " + std::to_string(plan.chunk_size) + " has " +
                           std::to_string(PlanChunks(plan)) + " chunks, more than the limit of " +
                           std::to_string(kMaxChunks) + "; use a larger --chunk-size");
  }
  return Status::Ok();
}

}  // namespace

Status DataCoverage::SetPlan(const DataPlan& plan) {
  LEASH_RETURN_IF_ERROR(CheckPlan(plan));
  if (plan_) {
    if (*plan_ == plan) return Status::Ok();
    return FailedPrecondition(
        "this job trains " + std::to_string(plan_->num_samples) + " samples in chunks of " +
        std::to_string(plan_->chunk_size) + " for " + std::to_string(plan_->epochs) +
        " epochs (seed " + std::to_string(plan_->seed) + "); this worker asks for " +
        std::to_string(plan.num_samples) + "/" + std::to_string(plan.chunk_size) + "/" +
        std::to_string(plan.epochs) + " (seed " + std::to_string(plan.seed) +
        "): start every worker with the same data, --chunk-size, --epochs and --seed");
  }
  plan_ = plan;
  return Status::Ok();
}

DataCoverage::Epoch& DataCoverage::Open(uint32_t e) {
  auto it = epochs_.find(e);
  if (it != epochs_.end()) return it->second;
  Epoch& ep = epochs_[e];
  uint32_t n = PlanNumChunks(*plan_);
  ep.completed.assign(n, 0);
  std::vector<uint32_t> order(n);
  for (uint32_t i = 0; i < n; ++i) order[i] = i;
  // Each epoch visits the chunks in its own order.
  std::mt19937_64 rng(plan_->seed * 0x9e3779b97f4a7c15ULL + e);
  for (uint32_t i = n; i > 1; --i) std::swap(order[i - 1], order[static_cast<uint32_t>(rng() % i)]);
  ep.pending.assign(order.begin(), order.end());
  return ep;
}

void DataCoverage::Advance() {
  while (plan_ && current_ < plan_->epochs) {
    auto it = epochs_.find(current_);
    if (it == epochs_.end() || it->second.done < PlanNumChunks(*plan_)) return;
    epochs_.erase(it);
    ++current_;
  }
}

ChunkGrant DataCoverage::Next(uint64_t worker, const Speeds* speeds) {
  ChunkGrant g = Lease(worker, speeds);
  CoverageProgress p = Progress();
  g.epochs_done = p.epochs_done;
  g.chunks_done = p.chunks_done;
  g.num_chunks = p.num_chunks;
  return g;
}

bool DataCoverage::HoldBack(const Speeds& speeds) const {
  if (!(speeds.own > 0) || !(speeds.others > 0) || !std::isfinite(speeds.own) ||
      !std::isfinite(speeds.others)) {
    return false;
  }
  double pending = 0;
  double leased = 0;
  for (uint32_t e = current_; e < std::min(current_ + 2, plan_->epochs); ++e) {
    auto it = epochs_.find(e);
    if (it == epochs_.end()) {
      pending += PlanNumChunks(*plan_);  // not opened yet: every chunk pending
      continue;
    }
    pending += static_cast<double>(it->second.pending.size());
    leased += static_cast<double>(it->second.leased.size());
  }
  // Someone else must be training a chunk: that worker asks again when done and takes what
  // is left, so a worker that holds back never leaves the chunks to nobody (a worker that
  // died holding one is evicted, its chunk pending again).
  return leased > 0 && speeds.others / speeds.own > pending + leased / 2;
}

ChunkGrant DataCoverage::Lease(uint64_t worker, const Speeds* speeds) {
  ChunkGrant g;
  if (!plan_) return g;
  Advance();
  if (current_ >= plan_->epochs) {
    g.kind = ChunkGrant::Kind::kFinished;
    return g;
  }
  for (uint32_t e = current_; e < std::min(current_ + 2, plan_->epochs); ++e) {
    auto open = epochs_.find(e);
    if (open == epochs_.end()) continue;
    for (const auto& [c, holder] : open->second.leased) {
      if (holder == worker) return Grant(e, c);  // a resent request: the chunk it holds
    }
  }
  if (speeds != nullptr && HoldBack(*speeds)) {
    ++held_back_;
    return g;  // kWait: the others finish what is left sooner
  }
  for (uint32_t e = current_; e < std::min(current_ + 2, plan_->epochs); ++e) {
    Epoch& ep = Open(e);
    if (ep.pending.empty()) continue;
    uint32_t c = ep.pending.front();
    ep.pending.pop_front();
    ep.leased[c] = worker;
    return Grant(e, c);
  }
  return g;  // everything left is leased to others
}

ChunkGrant DataCoverage::Grant(uint32_t epoch, uint32_t chunk) const {
  ChunkGrant g;
  g.kind = ChunkGrant::Kind::kChunk;
  g.epoch = epoch;
  g.chunk = chunk;
  g.begin = static_cast<uint64_t>(chunk) * plan_->chunk_size;
  g.end = std::min(plan_->num_samples, g.begin + plan_->chunk_size);
  return g;
}

void DataCoverage::Complete(uint32_t epoch, uint32_t chunk) {
  // Next grants chunks of epochs current_ and current_ + 1 only: a report of a later epoch
  // was never granted, and opening it would grow epochs_ past the two a snapshot holds.
  if (!plan_ || epoch < current_ || epoch > current_ + 1 || chunk >= PlanNumChunks(*plan_) ||
      epoch >= plan_->epochs) {
    return;
  }
  Epoch& ep = Open(epoch);
  ep.leased.erase(chunk);
  // A chunk reported by a worker that was evicted meanwhile may also be pending again.
  if (auto it = std::find(ep.pending.begin(), ep.pending.end(), chunk); it != ep.pending.end())
    ep.pending.erase(it);
  if (ep.completed[chunk]++ == 0) ++ep.done;
  Advance();
}

size_t DataCoverage::Release(uint64_t worker) {
  size_t n = 0;
  for (auto& [e, ep] : epochs_) {
    for (auto it = ep.leased.begin(); it != ep.leased.end();) {
      if (it->second == worker) {
        ep.pending.push_front(it->first);
        it = ep.leased.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
  }
  return n;
}

CoverageProgress DataCoverage::Progress() const {
  CoverageProgress p;
  if (!plan_) return p;
  p.epochs = plan_->epochs;
  p.epochs_done = current_;
  p.num_chunks = PlanNumChunks(*plan_);
  for (const auto& [e, ep] : epochs_) {
    if (e == current_) p.chunks_done = ep.done;
    p.chunks_leased += static_cast<uint32_t>(ep.leased.size());
  }
  return p;
}

uint32_t DataCoverage::times_completed(uint32_t epoch, uint32_t chunk) const {
  if (epoch < current_) return 1;  // finished epochs are forgotten; each chunk was trained
  auto it = epochs_.find(epoch);
  if (it == epochs_.end() || chunk >= it->second.completed.size()) return 0;
  return it->second.completed[chunk];
}

std::vector<uint8_t> DataCoverage::Serialize() const { return Encode(false); }

std::vector<uint8_t> DataCoverage::SerializeExact() const { return Encode(true); }

std::vector<uint8_t> DataCoverage::Encode(bool exact) const {
  std::vector<uint8_t> out;
  if (!plan_) return out;
  PutU64(&out, exact ? kMagicExact : kMagic);
  PutU64(&out, plan_->num_samples);
  PutU64(&out, plan_->chunk_size);
  PutU64(&out, plan_->epochs);
  PutU64(&out, plan_->seed);
  PutU64(&out, current_);
  PutU64(&out, epochs_.size());
  for (const auto& [e, ep] : epochs_) {
    PutU64(&out, e);
    PutU64(&out, ep.completed.size());
    for (uint32_t c : ep.completed) PutU64(&out, c);
    if (!exact) continue;
    PutU64(&out, ep.pending.size());
    for (uint32_t c : ep.pending) PutU64(&out, c);
    PutU64(&out, ep.leased.size());
    for (const auto& [c, worker] : ep.leased) {
      PutU64(&out, c);
      PutU64(&out, worker);
    }
  }
  return out;
}

Result<DataCoverage> DataCoverage::Deserialize(const std::vector<uint8_t>& bytes) {
  DataCoverage d;
  if (bytes.empty()) return d;
  size_t pos = 0;
  uint64_t magic, samples, chunk, epochs, seed, current, n;
  auto bad = [] { return DataLoss("the data-coverage record of the snapshot is malformed"); };
  if (!GetU64(bytes, &pos, &magic) || (magic != kMagic && magic != kMagicExact) ||
      !GetU64(bytes, &pos, &samples) || !GetU64(bytes, &pos, &chunk) ||
      !GetU64(bytes, &pos, &epochs) || !GetU64(bytes, &pos, &seed) ||
      !GetU64(bytes, &pos, &current) || !GetU64(bytes, &pos, &n) || n > 2 || chunk == 0 ||
      chunk > UINT32_MAX || epochs > UINT32_MAX || current > epochs) {
    return bad();
  }
  DataPlan plan{samples, static_cast<uint32_t>(chunk), static_cast<uint32_t>(epochs), seed};
  if (!CheckPlan(plan).ok()) return bad();
  d.plan_ = plan;
  d.current_ = static_cast<uint32_t>(current);
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t e, count;
    if (!GetU64(bytes, &pos, &e) || !GetU64(bytes, &pos, &count) || count != PlanNumChunks(plan) ||
        e >= epochs) {
      return bad();
    }
    Epoch& ep = d.Open(static_cast<uint32_t>(e));
    std::deque<uint32_t> pending;
    for (uint64_t c = 0; c < count; ++c) {
      uint64_t times;
      if (!GetU64(bytes, &pos, &times) || times > UINT32_MAX) return bad();
      ep.completed[c] = static_cast<uint32_t>(times);
      if (times > 0) ++ep.done;
    }
    if (magic == kMagicExact) {
      // The queue and the leases as they were; a chunk appears at most once in them.
      std::vector<uint8_t> seen(count, 0);
      uint64_t np, nl, c, worker;
      if (!GetU64(bytes, &pos, &np) || np > count) return bad();
      for (uint64_t k = 0; k < np; ++k) {
        if (!GetU64(bytes, &pos, &c) || c >= count || seen[c]++) return bad();
        pending.push_back(static_cast<uint32_t>(c));
      }
      if (!GetU64(bytes, &pos, &nl) || nl > count) return bad();
      for (uint64_t k = 0; k < nl; ++k) {
        if (!GetU64(bytes, &pos, &c) || !GetU64(bytes, &pos, &worker) || c >= count || seen[c]++) {
          return bad();
        }
        ep.leased[static_cast<uint32_t>(c)] = worker;
      }
    } else {
      for (uint32_t c : ep.pending) {
        if (ep.completed[c] == 0) pending.push_back(c);
      }
    }
    ep.pending = std::move(pending);
  }
  if (pos != bytes.size()) return bad();
  return d;
}

}  // namespace leash::ps

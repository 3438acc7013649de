// Shard request handling: registration, tables, pulls parked under the staleness bound,
// exactly-once pushes, leases and snapshots. Not thread-safe (one request loop).
#include "leash/server/shard.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <variant>

#include "leash/common/finite.h"
#include "leash/ps/table.h"

namespace leash::server {
namespace {

// Removes the rows of `grad` holding NaN or Inf (and their keys from `rows`, which
// becomes an explicit key list). Returns the number of rows removed.
uint64_t DropNonFiniteRows(uint32_t cols, Rows* rows, std::vector<float>* grad) {
  Rows kept;
  kept.explicit_keys = true;
  std::vector<float> g;
  g.reserve(grad->size());
  uint64_t dropped = 0;
  for (size_t i = 0; i < rows->size(); ++i) {
    const float* row = grad->data() + i * cols;
    if (!AllFinite(row, cols)) {
      ++dropped;
      continue;
    }
    kept.keys.push_back(rows->explicit_keys ? rows->keys[i] : rows->begin + i);
    g.insert(g.end(), row, row + cols);
  }
  *rows = std::move(kept);
  *grad = std::move(g);
  return dropped;
}

// Rows the expiry sweep visits per sparse table and tier on each turn, and how often.
constexpr size_t kExpireRowsPerSweep = 4096;
constexpr int64_t kExpireEveryMs = 100;
// Whether the expiry sweep visits the table in this slot of Shard::sparse_ (null for a dense
// table): a sparse table whose rows expire.
bool RowsExpire(const std::unique_ptr<ps::SparseTable>& t) {
  return t != nullptr && t->spec().sparse.expire_after_clocks > 0;
}
// At most one log line about dropped stale pushes per this many milliseconds.
constexpr int64_t kDroppedLogEveryMs = 10000;

// Options of a sparse table that is one of `tables` on a shard with `budget`: its share of
// the tiers' part (RebalanceSparse), so that its admission sketch is sized for it from the
// start.
ps::SparseTableOptions SparseTableShare(uint64_t budget, size_t tables) {
  ps::SparseTableOptions o;
  const uint64_t all = SplitMemoryBudget(budget).tables;
  o.memory_bytes = all == UINT64_MAX ? UINT64_MAX : all / std::max<size_t>(1, tables);
  return o;
}

}  // namespace

MemoryBudgetSplit SplitMemoryBudget(uint64_t budget) {
  MemoryBudgetSplit s;
  if (budget == 0) {
    s.block_cache = uint64_t{64} << 20;
    s.write_buffer = uint64_t{32} << 20;
    s.tables = UINT64_MAX;
    return s;
  }
  s.block_cache = budget / 8;
  s.write_buffer = std::min<uint64_t>(budget / 16, uint64_t{64} << 20);
  s.tables = budget - s.block_cache - s.write_buffer;
  return s;
}

Shard::Shard(ShardOptions options, SnapshotStore* store, NowMs now_ms, SparseStore* sparse)
    : options_(options),
      store_(store),
      now_ms_(std::move(now_ms)),
      clocks_(0, options.backup_workers),
      sparse_store_(sparse),
      rejection_log_(options.rejection_log),
      error_replies_(options.error_replies) {
  if (sparse_store_ == nullptr) {
    own_sparse_store_ = std::make_unique<MemorySparseStore>();
    sparse_store_ = own_sparse_store_.get();
  }
  LEASH_CHECK(options_.num_shards > 0 && options_.shard < options_.num_shards);
  if (options_.boot_id == 0) {
    std::random_device rd;
    options_.boot_id = (static_cast<uint64_t>(rd()) << 32 | rd()) | 1;
  }
  next_snapshot_ms_ = now_ms_() + options_.checkpoint_interval_ms;
  if (options_.update_threads > 1) {
    update_threads_ = std::make_unique<ps::UpdateThreads>(options_.update_threads);
  }
}

Shard::~Shard() = default;

Result<int64_t> Shard::Recover() {
  LEASH_ASSIGN_OR_RETURN(std::optional<ShardSnapshot> snap, store_->Load());
  if (!snap) {
    // Rows a previous run evicted without ever taking a snapshot belong to no snapshot.
    LEASH_RETURN_IF_ERROR(sparse_store_->Restore(std::nullopt));
    spdlog::info("shard {}/{}: {} holds no snapshot, starting empty", options_.shard,
                 options_.num_shards, store_->Describe());
    return int64_t{-1};
  }
  if (snap->shard != options_.shard || snap->num_shards != options_.num_shards) {
    return FailedPrecondition("snapshot in " + store_->Describe() + " is of shard " +
                              std::to_string(snap->shard) + "/" + std::to_string(snap->num_shards) +
                              ", not " + std::to_string(options_.shard) + "/" +
                              std::to_string(options_.num_shards));
  }
  tables_.clear();
  sparse_.clear();
  table_by_name_.clear();
  recovered_replica_stop_ = std::move(snap->replica_stop);
  // Both tiers go back to the instant of the snapshot: the cold store to the checkpoint
  // taken just before it was saved (rows evicted since are discarded).
  const bool has_sparse =
      std::any_of(snap->tables.begin(), snap->tables.end(),
                  [](const TableSnapshot& t) { return t.spec.kind == TableKind::kSparse; });
  if (Status st = sparse_store_->Restore(has_sparse ? std::optional<uint64_t>(snap->sequence)
                                                    : std::nullopt);
      !st.ok()) {
    if (st.code() == StatusCode::kNotFound) return DataLoss(st.message());
    return st;
  }
  for (const TableSnapshot& ts : snap->tables) {
    if (ts.table_id != tables_.size()) return DataLoss("snapshot tables are not numbered 0..n-1");
    if (ts.spec.kind == TableKind::kSparse) {
      const size_t n = static_cast<size_t>(
          std::count_if(snap->tables.begin(), snap->tables.end(),
                        [](const TableSnapshot& x) { return x.spec.kind == TableKind::kSparse; }));
      LEASH_ASSIGN_OR_RETURN(
          auto t, ps::SparseTable::Create(ts.table_id, ts.spec, sparse_store_,
                                          SparseTableShare(options_.memory_budget_bytes, n)));
      table_by_name_[ts.spec.name] = ts.table_id;
      tables_.push_back(nullptr);
      sparse_.push_back(std::move(t));
      continue;
    }
    LEASH_ASSIGN_OR_RETURN(Table t, Table::FromSnapshot(ts));
    table_by_name_[t.name()] = t.id();
    tables_.push_back(std::make_unique<Table>(std::move(t)));
    sparse_.push_back(nullptr);
  }
  RebalanceSparse();
  LEASH_ASSIGN_OR_RETURN(coverage_, DataCoverage::Deserialize(snap->coverage));
  clocks_ = ClockTable(snap->min_clock, options_.backup_workers);
  int64_t now = now_ms_();
  for (const WorkerClock& wc : snap->workers) {
    clocks_.Restore(ToLiveWorker(wc, now));  // a fresh lease to come back
  }
  recovered_clock_ = snap->min_clock;
  last_snapshot_clock_ = snap->min_clock;
  snapshot_sequence_ = snap->sequence;
  snapshot_unix_ms_ = snap->unix_ms;
  spdlog::info("shard {}/{}: recovered snapshot #{} from {} at clock {}: {} tables, {} workers",
               options_.shard, options_.num_shards, snap->sequence, store_->Describe(),
               snap->min_clock, tables_.size(), snap->workers.size());
  return snap->min_clock;
}

void Shard::CountSent(const std::vector<Outgoing>& out, size_t from) {
  for (size_t i = from; i < out.size(); ++i) counters_.bytes_out += MessageBytes(out[i].message);
}

void Shard::Handle(const PeerId& peer, const Message& message, std::vector<Outgoing>* out) {
  if (ps::HasUnstable(message)) {
    // Bytes its sender may still change (ZmqOptions::shm_borrow_all): read from a copy. A
    // replicated primary copies them before they get here; this is for any other way in.
    Message stable = message;
    ps::StabilizeShared(update_threads(), &stable);
    return Handle(peer, stable, out);
  }
  if (IsBatch(message)) return HandleBatch(peer, message, out);
  const size_t first_reply = out->size();
  counters_.bytes_in += MessageBytes(message);
  Status st;
  uint64_t rid = 0;
  bool oversize = false;
  bool names_keys = false;  // a pull or push: the requests whose key lists --max-keys bounds
  uint64_t parked_before = counters_.parked_limit_rejections;
  if (MessageBytes(message) > options_.max_message_bytes) {
    oversize = true;
    rid = PeekRequestId(message);
    st =
        ResourceExhausted("message of " + std::to_string(MessageBytes(message)) +
                          " bytes exceeds this shard's limit of " +
                          std::to_string(options_.max_message_bytes) + " bytes; split the request");
  } else {
    auto decoded = DecodeRequest(message, options_.limits);
    if (!decoded.ok()) {
      rid = PeekRequestId(message);
      st = decoded.status();
      // The header limit, or else the key limit: the codec's only other limit.
      oversize = st.code() == StatusCode::kResourceExhausted && !message.empty() &&
                 message[0].size() > options_.limits.max_header_bytes;
      names_keys = st.code() == StatusCode::kResourceExhausted && !oversize;
    } else {
      rid = decoded->request_id;
      names_keys = std::holds_alternative<PullRequest>(decoded->value) ||
                   std::holds_alternative<PushRequest>(decoded->value);
      st = Dispatch(peer, *decoded, out);
    }
  }
  if (!st.ok()) {
    ++counters_.errors;
    if (st.code() == StatusCode::kResourceExhausted) {
      ++counters_.limit_rejections;
      if (oversize) {
        ++counters_.oversize_rejections;
      } else if (names_keys && counters_.parked_limit_rejections == parked_before) {
        ++counters_.key_limit_rejections;  // the only other limit a pull or push can exceed
      }
    }
    Reject(peer, rid, st, out);
  }
  CountSent(*out, first_reply);
}

void Shard::Reject(const PeerId& peer, uint64_t rid, const Status& st, std::vector<Outgoing>* out) {
  const int64_t now = now_ms_();
  std::string key = peer;
  key.push_back('/');
  key += std::to_string(static_cast<int>(st.code()));
  const KeyedRateLimit::Decision line = rejection_log_.Admit(key, now);
  if (line.allowed) {
    std::string who;
    for (size_t i = 0; i < std::min<size_t>(peer.size(), 8); ++i) {
      who += fmt::format("{:02x}", static_cast<uint8_t>(peer[i]));
    }
    spdlog::warn("shard {}: rejected request {} from peer {}: {}{}", options_.shard, rid, who,
                 st.ToString(),
                 line.suppressed_before == 0
                     ? std::string()
                     : fmt::format(" ({} more like it from this peer not logged; at most {} a "
                                   "minute per peer and reason, all counted)",
                                   line.suppressed_before, options_.rejection_log.per_key));
  } else {
    ++counters_.rejection_lines_suppressed;
  }
  if (error_replies_.Admit(peer, now).allowed) {
    out->push_back({peer, MakeError(rid, st, options_.boot_id)});
  } else {
    ++counters_.error_replies_suppressed;
  }
}

void Shard::HandleBatch(const PeerId& peer, const Message& batch, std::vector<Outgoing>* out) {
  auto messages = UnpackBatch(batch);
  if (!messages.ok()) {
    ++counters_.errors;
    const size_t first_reply = out->size();
    Reject(peer, 0, messages.status(), out);
    CountSent(*out, first_reply);
    return;
  }
  const size_t first = out->size();
  for (const Message& m : *messages) {
    if (IsBatch(m)) {  // no batches inside batches
      ++counters_.errors;
      Reject(peer, 0, InvalidArgument("a batch inside a batch"), out);
      continue;
    }
    Handle(peer, m, out);
  }
  // The replies to this peer go back as one batch, in order, where the first of them was;
  // messages for other peers (pulls the batch's clock released) go as they are.
  std::vector<Message> replies;
  size_t at = out->size();
  for (size_t i = first; i < out->size(); ++i) {
    if ((*out)[i].peer != peer) continue;
    if (replies.empty()) at = i;
    replies.push_back(std::move((*out)[i].message));
  }
  if (replies.size() < 2) {
    if (replies.size() == 1) (*out)[at].message = std::move(replies[0]);
    return;
  }
  std::vector<Outgoing> rest;
  rest.reserve(out->size() - first);
  for (size_t i = first; i < out->size(); ++i) {
    if (i == at) {
      rest.push_back({peer, PackBatch(std::move(replies))});
    } else if ((*out)[i].peer != peer) {
      rest.push_back(std::move((*out)[i]));
    }
  }
  out->resize(first);
  for (Outgoing& o : rest) out->push_back(std::move(o));
}

Status Shard::Dispatch(const PeerId& peer, Decoded<Request>& request, std::vector<Outgoing>* out) {
  uint64_t rid = request.request_id;
  return std::visit(
      [&](auto& m) -> Status {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, RegisterRequest>) return OnRegister(peer, rid, m, out);
        if constexpr (std::is_same_v<T, CreateTableRequest>)
          return OnCreateTable(peer, rid, m, out);
        if constexpr (std::is_same_v<T, PullRequest>) return OnPull(peer, rid, m, out);
        if constexpr (std::is_same_v<T, PushRequest>)
          return OnPush(peer, rid, m, request.payloads, out);
        if constexpr (std::is_same_v<T, ClockRequest>) return OnClock(peer, rid, m, out);
        if constexpr (std::is_same_v<T, HeartbeatRequest>) return OnHeartbeat(peer, rid, m, out);
        if constexpr (std::is_same_v<T, LeaveRequest>) return OnLeave(peer, rid, m, out);
        if constexpr (std::is_same_v<T, CheckpointRequest>) return OnCheckpoint(peer, rid, out);
        if constexpr (std::is_same_v<T, StatsRequest>) return OnStats(peer, rid, out);
        if constexpr (std::is_same_v<T, ChunkRequest>) return OnChunkRequest(peer, rid, m, out);
      },
      request.value);
}

Status Shard::OnRegister(const PeerId& peer, uint64_t rid, const RegisterRequest& m,
                         std::vector<Outgoing>* out) {
  LiveWorker* prior = clocks_.FindAny(m.worker_id);
  bool fresh = prior == nullptr || prior->incarnation != m.incarnation;
  LEASH_ASSIGN_OR_RETURN(int64_t start,
                         clocks_.Register(m.worker_id, m.incarnation, m.name, now_ms_()));
  if (fresh) {
    spdlog::info("shard {}: worker {} '{}' (incarnation {}) joined at clock {}; {} live",
                 options_.shard, m.worker_id, m.name, m.incarnation, start, clocks_.live());
  }
  ReleasePulls(out);  // a replaced incarnation may have been the one holding the minimum back
  out->push_back(
      {peer, EncodeReply(rid, Welcome{options_.shard, options_.num_shards, start,
                                      static_cast<uint32_t>(options_.lease_ms), recovered_clock_,
                                      options_.boot_id, options_.max_message_bytes})});
  return Status::Ok();
}

Status Shard::OnCreateTable(const PeerId& peer, uint64_t rid, const CreateTableRequest& m,
                            std::vector<Outgoing>* out) {
  const TableSpec& spec = m.spec;
  LEASH_RETURN_IF_ERROR(ps::ValidateSpec(spec));
  const std::string& name = spec.name;
  bool created = false;
  uint32_t id;
  if (auto it = table_by_name_.find(name); it != table_by_name_.end()) {
    id = it->second;
    // The existing table may have been recovered from a snapshot: its spec is the one it was
    // created with, so a job restarted with another shape or optimizer is refused here too.
    if (!ps::SameTableSpec(SpecOf(id), spec)) {
      return AlreadyExists(
          "table '" + name + "' already exists on shard " + std::to_string(options_.shard) +
          " as " + ps::DescribeSpec(SpecOf(id)) + "; this request asks for " +
          ps::DescribeSpec(spec) +
          ". Use another table name, the same spec, or a fresh --data-dir for a new job");
    }
  } else if (spec.kind == TableKind::kSparse) {
    id = static_cast<uint32_t>(tables_.size());
    // A crash may have left rows of this id in the cold store after the last snapshot
    // (which did not know the table): they are not this table's.
    LEASH_RETURN_IF_ERROR(sparse_store_->DropTable(id));
    const size_t n =
        1 + static_cast<size_t>(std::count_if(sparse_.begin(), sparse_.end(),
                                              [](const auto& x) { return x != nullptr; }));
    LEASH_ASSIGN_OR_RETURN(
        auto t, ps::SparseTable::Create(id, spec, sparse_store_,
                                        SparseTableShare(options_.memory_budget_bytes, n)));
    spdlog::info("shard {}: created sparse table {} '{}' of {}-wide rows in {}", options_.shard, id,
                 name, spec.cols, sparse_store_->Describe());
    tables_.push_back(nullptr);
    sparse_.push_back(std::move(t));
    table_by_name_[name] = id;
    created = true;
    RebalanceSparse();
    if (auto r = Checkpoint(); !r.ok()) {
      spdlog::error("shard {}: snapshot after creating '{}' failed: {}", options_.shard, name,
                    r.status().ToString());
    }
  } else {
    id = static_cast<uint32_t>(tables_.size());
    RangePartitioner part(static_cast<int>(options_.num_shards));
    RowRange range = part.Range(spec.rows, static_cast<int>(options_.shard));
    LEASH_ASSIGN_OR_RETURN(Table t, Table::Create(id, spec, range, options_.max_table_values));
    spdlog::info("shard {}: created table {} '{}' {} x {}, holding rows [{}, {})", options_.shard,
                 id, name, t.rows(), t.cols(), range.begin, range.end);
    tables_.push_back(std::make_unique<Table>(std::move(t)));
    sparse_.push_back(nullptr);
    table_by_name_[name] = id;
    created = true;
    // Persist the new table at once, so a shard that crashes before its next scheduled
    // snapshot still knows it (values are reproducible from the spec's initializer).
    if (auto r = Checkpoint(); !r.ok()) {
      spdlog::error("shard {}: snapshot after creating '{}' failed: {}", options_.shard, name,
                    r.status().ToString());
    }
  }
  out->push_back({peer, EncodeReply(rid, TableCreated{id, created})});
  return Status::Ok();
}

Result<Table*> Shard::FindTable(uint32_t table_id) {
  if (table_id >= tables_.size()) {
    return NotFound("unknown table " + std::to_string(table_id) + " (this shard has " +
                    std::to_string(tables_.size()) + " tables); create it first");
  }
  return tables_[table_id].get();
}

const TableSpec& Shard::SpecOf(uint32_t table_id) const {
  return tables_[table_id] ? tables_[table_id]->spec() : sparse_[table_id]->spec();
}

Status Shard::CheckSparseRows(const ps::SparseTable& table, const Rows& rows) const {
  if (!rows.explicit_keys) {
    return InvalidArgument("table '" + table.spec().name +
                           "' is sparse: name its rows by key (PullSparse/PushSparse), not by a "
                           "row range");
  }
  if (options_.num_shards == 1) return Status::Ok();
  const int n = static_cast<int>(options_.num_shards);
  for (uint64_t key : rows.keys) {
    if (const int owner = SparseOwner(key, n); owner != static_cast<int>(options_.shard)) {
      return InvalidArgument("key " + std::to_string(key) + " of sparse table '" +
                             table.spec().name + "' belongs to shard " + std::to_string(owner) +
                             " of " + std::to_string(n) + ", not to shard " +
                             std::to_string(options_.shard) +
                             "; send each key to SparseOwner(key, num_shards)");
    }
  }
  return Status::Ok();
}

Result<Message> Shard::MakeSparsePullReply(const PeerId& peer, uint64_t rid, ps::SparseTable& table,
                                           const Rows& rows, DType dtype) {
  const size_t n = rows.size() * table.cols();
  if (n * sizeof(float) > options_.max_message_bytes) {
    return ResourceExhausted("a pull of " + std::to_string(rows.size()) +
                             " rows of sparse table '" + table.spec().name + "' makes a reply of " +
                             std::to_string(n * sizeof(float)) + " bytes, over this shard's " +
                             std::to_string(options_.max_message_bytes) +
                             "-byte message limit; pull fewer keys at a time");
  }
  const int64_t clock = clocks_.MinClock();
  auto read = [&](float* out) -> Status {
    Status st = table.Read(rows.keys, clock, out);
    if (!st.ok()) {
      ++counters_.sparse_store_errors;
      return st.WithContext("pull from sparse table '" + table.spec().name + "'");
    }
    return st;
  };
  Frame payload;
  std::optional<WritableFrame> reserved;
  if (dtype == DType::kF32 && payload_allocator_)
    reserved = payload_allocator_(peer, n * sizeof(float));
  if (reserved) {
    LEASH_RETURN_IF_ERROR(read(reinterpret_cast<float*>(reserved->data)));
    payload = std::move(reserved->frame);
  } else if (dtype == DType::kF32) {
    std::shared_ptr<float[]> values(new float[n]);
    float* data = values.get();
    LEASH_RETURN_IF_ERROR(read(data));
    payload = Frame::Wrap(data, n * sizeof(float), std::move(values));
  } else {
    std::vector<float> values(n);
    LEASH_RETURN_IF_ERROR(read(values.data()));
    payload = EncodeValues(values, dtype);
  }
  ++counters_.pulls_served;
  std::vector<Frame> payloads;
  payloads.push_back(std::move(payload));
  return EncodeReply(rid, PullReply{table.id(), rows.size(), table.cols(), dtype, clock},
                     std::move(payloads));
}

void Shard::RebalanceSparse() {
  const size_t n = static_cast<size_t>(
      std::count_if(sparse_.begin(), sparse_.end(), [](const auto& t) { return t != nullptr; }));
  if (n == 0) return;
  const uint64_t each = SparseTableShare(options_.memory_budget_bytes, n).memory_bytes;
  for (auto& t : sparse_) {
    if (!t) continue;
    if (Status st = t->SetMemoryBudget(each); !st.ok()) {
      ++counters_.sparse_store_errors;
      spdlog::error("shard {}: cannot set the memory budget of sparse table '{}': {}",
                    options_.shard, t->spec().name, st.ToString());
    }
  }
}

uint64_t Shard::memory_used_bytes() const {
  uint64_t used = sparse_store_->MemoryBytes();
  for (const auto& t : sparse_)
    if (t) used += t->memory_bytes();
  return used;
}

Message Shard::MakePullReply(const PeerId& peer, uint64_t rid, const Table& table, const Rows& rows,
                             DType dtype, bool defer_copy) {
  size_t n = rows.size() * table.cols();
  Frame payload;
  std::optional<WritableFrame> reserved;
  if (dtype == DType::kF32 && payload_allocator_)
    reserved = payload_allocator_(peer, n * sizeof(float));
  if (reserved) {
    // Straight into memory the transport sends without copying (shared memory with a
    // worker on this host); a range of rows by the update threads (CopyReplies).
    auto* to = reinterpret_cast<float*>(reserved->data);
    if (auto span = table.RangeValues(rows); span && update_threads_ != nullptr) {
      reply_copies_.push_back({span->data(), to, span->size()});
      if (!defer_copy) CopyReplies();
    } else {
      table.Read(rows, to);
    }
    payload = std::move(reserved->frame);
  } else if (dtype == DType::kF32) {
    // A range of rows is sent from the table's own memory, not copied (Table::ReadFrame:
    // copy on write if an update comes while the transport still holds it).
    payload = table.ReadFrame(rows);
  } else if (auto span = table.RangeValues(rows)) {
    payload = EncodeValues(*span, dtype);  // narrowed straight from the table
  } else {
    std::vector<float> values(n);
    table.Read(rows, values.data());
    payload = EncodeValues(values, dtype);
  }
  ++counters_.pulls_served;
  std::vector<Frame> payloads;
  payloads.push_back(std::move(payload));
  return EncodeReply(rid,
                     PullReply{table.id(), rows.size(), table.cols(), dtype, clocks_.MinClock()},
                     std::move(payloads));
}

Status Shard::OnPull(const PeerId& peer, uint64_t rid, PullRequest& m, std::vector<Outgoing>* out) {
  ps::SparseTable* sparse = FindSparse(m.table_id);
  Table* table = nullptr;
  if (sparse != nullptr) {
    LEASH_RETURN_IF_ERROR(CheckSparseRows(*sparse, m.rows));
  } else {
    LEASH_ASSIGN_OR_RETURN(table, FindTable(m.table_id));
    LEASH_RETURN_IF_ERROR(table->CheckInTable(m.rows));
    LEASH_RETURN_IF_ERROR(table->CheckOwned(m.rows));
  }
  if (m.staleness < 0) return InvalidArgument("staleness must be >= 0");
  if (LiveWorker* w = clocks_.FindAny(m.worker_id)) {
    w->last_seen_ms = now_ms_();
    w->staleness = m.staleness;  // the bound its pushes are held to (ClockTable::TooStale)
  }
  if (clocks_.Allows(m.clock, m.staleness)) {
    if (sparse != nullptr) {
      LEASH_ASSIGN_OR_RETURN(Message reply,
                             MakeSparsePullReply(peer, rid, *sparse, m.rows, m.dtype));
      out->push_back({peer, std::move(reply)});
      return Status::Ok();
    }
    out->push_back({peer, MakePullReply(peer, rid, *table, m.rows, m.dtype)});
    return Status::Ok();
  }
  if (++parked_per_peer_[peer] > options_.max_parked_per_peer) {
    --parked_per_peer_[peer];
    ++counters_.parked_limit_rejections;
    return ResourceExhausted(
        "this connection already has " + std::to_string(options_.max_parked_per_peer) +
        " pulls waiting for the staleness bound; wait for them before sending more");
  }
  ++counters_.pulls_parked;
  parked_.Park(m.clock - m.staleness,
               ParkedPull{peer, rid, m.worker_id, m.table_id, std::move(m.rows), m.dtype});
  return Status::Ok();
}

Status Shard::OnPush(const PeerId& peer, uint64_t rid, PushRequest& m,
                     std::span<const Frame> payloads, std::vector<Outgoing>* out) {
  LEASH_ASSIGN_OR_RETURN(LiveWorker * w, clocks_.Find(m.worker_id, m.incarnation));
  w->last_seen_ms = now_ms_();
  Rows& rows = m.rows;
  ps::SparseTable* sparse = FindSparse(m.table_id);
  Table* table = nullptr;
  if (sparse != nullptr) {
    LEASH_RETURN_IF_ERROR(CheckSparseRows(*sparse, rows));
  } else {
    LEASH_ASSIGN_OR_RETURN(table, FindTable(m.table_id));
    LEASH_RETURN_IF_ERROR(table->CheckInTable(rows));
    LEASH_RETURN_IF_ERROR(table->CheckOwned(rows));
  }
  const uint32_t cols = sparse != nullptr ? sparse->cols() : table->cols();
  const std::string& name = sparse != nullptr ? sparse->spec().name : table->name();
  if (payloads.size() != 1) {
    return InvalidArgument("a push carries exactly one gradient frame after the header, got " +
                           std::to_string(payloads.size()));
  }
  size_t n = rows.size() * cols;
  bool applied = false;
  uint64_t skipped = 0;
  if (m.seq <= w->last_seq) {
    ++counters_.pushes_duplicate;  // a retry of a push already applied: apply nothing, acknowledge
  } else if (clocks_.DropPush(w)) {
    // A backup worker's push for an iteration the minimum had left more than its bound
    // behind at the iteration's first push (all of an iteration's pushes alike). Consumed (a resend
    // is a duplicate), counted and logged, never applied.
    w->last_seq = m.seq;
    NoteStalePushDropped(*w);
  } else {
    // fp32 gradients are applied where the transport put them (its frames are 8-byte
    // aligned); a copy is made only to widen 16-bit values or to drop non-finite rows.
    std::vector<float> grad;
    const float* g = nullptr;
    const Frame& payload = payloads[0];
    // Whether g is known to hold no NaN or Inf: the fp32 payload was checked by the copy
    // that brought it out of shared memory (a same-host push, or a backup's log entry).
    bool finite = false;
    if (m.dtype == DType::kF32 && payload.size() == n * sizeof(float) &&
        reinterpret_cast<uintptr_t>(payload.data()) % alignof(float) == 0) {
      g = reinterpret_cast<const float*>(payload.data());
      finite = payload.finite_f32();
    } else {
      grad.resize(n);
      LEASH_RETURN_IF_ERROR(DecodeValues(payload, m.dtype, n, grad.data())
                                .WithContext("push to table '" + name + "'"));
      g = grad.data();
    }
    // Work in proportion to speed: the gradient is the mean over `samples`; weighted by
    // samples / global_batch, the pushes of one clock add up to the global batch's mean.
    // 0 < scale <= 1, so a value is finite exactly when its scaled value is: the check
    // below reads the gradient as it came, and a dense table scales it as it applies it
    // (no copy of the whole gradient).
    float scale = 1.f;
    if (m.samples > 0 || m.global_batch > 0) {
      if (m.samples == 0 || m.samples > m.global_batch) {
        return InvalidArgument("push to table '" + name + "' weighted by " +
                               std::to_string(m.samples) + " samples of a global batch of " +
                               std::to_string(m.global_batch) +
                               "; need 0 < samples <= global batch");
      }
      scale = static_cast<float>(m.samples) / static_cast<float>(m.global_batch);
    }
    if (finite) {
      ++counters_.pushes_checked_in_copy;
    } else if (!ps::AllFiniteShared(update_threads_.get(), g, n)) {
      ++counters_.nonfinite_pushes;
      if (options_.nonfinite == NonFinitePolicy::kReject) {
        return InvalidArgument("push to table '" + name +
                               "' contains NaN or Inf gradients; it was not applied (check the "
                               "learning rate and data)");
      }
      if (grad.empty()) grad.assign(g, g + n);
      skipped = DropNonFiniteRows(cols, &rows, &grad);
      g = grad.data();
    }
    if (sparse != nullptr) {
      if (scale != 1.f) {
        if (grad.empty()) grad.assign(g, g + rows.size() * cols);  // the frame is not written
        for (float& v : grad) v *= scale;
        g = grad.data();
      }
      // The cold store may fail (disk): nothing is applied then, and the push is not
      // marked seen, so the client's retry applies it once.
      if (Status st = sparse->Apply(rows.keys, g, clocks_.MinClock()); !st.ok()) {
        ++counters_.sparse_store_errors;
        return st.WithContext("push to sparse table '" + name + "'");
      }
    } else if (rows.size() > 0) {
      if (m.clock_step && m.global_batch > 0 && SumsIntoClockStep(*w)) {
        table->Accumulate(w->clock, rows, g, scale, update_threads_.get());
        ++counters_.pushes_summed;
      } else {
        const uint64_t copies = table->copies_on_write();
        table->Apply(rows, g, scale, update_threads_.get());
        counters_.values_copied_on_write += table->copies_on_write() - copies;
      }
    }
    counters_.nonfinite_rows_skipped += skipped;
    w->last_seq = m.seq;
    ++counters_.pushes_applied;
    applied = true;
  }
  if (m.clock_after >= 0 && clocks_.Advance(w, m.clock_after)) ReleasePulls(out);
  out->push_back({peer, EncodeReply(rid, PushReply{applied, skipped})});
  return Status::Ok();
}

void Shard::NoteStalePushDropped(const LiveWorker& w) {
  ++counters_.pushes_dropped_stale;
  const int64_t now = now_ms_();
  if (dropped_logged_ms_ >= 0 && now - dropped_logged_ms_ < kDroppedLogEveryMs) return;
  spdlog::warn(
      "shard {}: dropped {} stale push(es) of backup workers since the last report ({} in all); "
      "the latest from worker {} '{}' at clock {}, more than its staleness bound {} behind the "
      "minimum clock {} (--backup-workers {})",
      options_.shard, counters_.pushes_dropped_stale - dropped_logged_,
      counters_.pushes_dropped_stale, w.worker_id, w.name, w.clock, w.staleness, clocks_.MinClock(),
      options_.backup_workers);
  dropped_logged_ms_ = now;
  dropped_logged_ = counters_.pushes_dropped_stale;
}

Status Shard::OnClock(const PeerId& peer, uint64_t rid, const ClockRequest& m,
                      std::vector<Outgoing>* out) {
  LiveWorker* w = clocks_.FindAny(m.worker_id);
  if (w == nullptr) {
    return NotRegistered(
        "clock from worker " + std::to_string(m.worker_id) +
        ", which is not registered on this shard (evicted or the shard restarted); register again");
  }
  w->last_seen_ms = now_ms_();
  if (clocks_.Advance(w, m.clock)) ReleasePulls(out);
  ClockReply reply{clocks_.MinClock()};
  if (m.samples_per_second != 0 && std::isfinite(m.samples_per_second)) {
    // Work in proportion to speed: each worker's share of the global batch is its speed
    // over the sum of the live workers' speeds. A negative speed: idle, it counts 0.
    w->samples_per_second = std::max(0.f, m.samples_per_second);
    w->speed_reported = true;
    reply.cluster_samples_per_second = clocks_.TotalSamplesPerSecond();
  }
  out->push_back({peer, EncodeReply(rid, reply)});
  return Status::Ok();
}

Status Shard::OnHeartbeat(const PeerId& peer, uint64_t rid, const HeartbeatRequest& m,
                          std::vector<Outgoing>* out) {
  LEASH_ASSIGN_OR_RETURN(LiveWorker * w, clocks_.Find(m.worker_id, m.incarnation));
  w->last_seen_ms = now_ms_();
  out->push_back({peer, EncodeReply(rid, HeartbeatReply{clocks_.MinClock(), options_.boot_id})});
  return Status::Ok();
}

Status Shard::OnLeave(const PeerId& peer, uint64_t rid, const LeaveRequest& m,
                      std::vector<Outgoing>* out) {
  LiveWorker* w = clocks_.FindAny(m.worker_id);
  if (w != nullptr && w->incarnation == m.incarnation) {
    std::string name = w->name;
    clocks_.Remove(m.worker_id);
    coverage_.Release(m.worker_id);
    spdlog::info("shard {}: worker {} '{}' left; {} live, min clock {}", options_.shard,
                 m.worker_id, name, clocks_.live(), clocks_.MinClock());
    ReleasePulls(out);
  }
  out->push_back({peer, EncodeReply(rid, LeaveReply{})});
  return Status::Ok();
}

Status Shard::OnCheckpoint(const PeerId& peer, uint64_t rid, std::vector<Outgoing>* out) {
  LEASH_ASSIGN_OR_RETURN(int64_t clock, Checkpoint());
  out->push_back({peer, EncodeReply(rid, CheckpointReply{clock})});
  return Status::Ok();
}

Status Shard::OnStats(const PeerId& peer, uint64_t rid, std::vector<Outgoing>* out) {
  int64_t now = now_ms_();
  ShardStats st;
  st.shard = options_.shard;
  st.num_shards = options_.num_shards;
  st.min_clock = clocks_.MinClock();
  st.parked_pulls = parked_.size();
  st.pushes_applied = counters_.pushes_applied;
  st.pulls_served = counters_.pulls_served;
  st.errors = counters_.errors;
  st.last_snapshot_clock = last_snapshot_clock_;
  st.recovered_clock = recovered_clock_;
  st.snapshot_age_ms = last_snapshot_ms_ < 0 ? -1 : now - last_snapshot_ms_;
  st.coverage = coverage_.Progress();
  for (const auto& [id, w] : clocks_.workers()) {
    st.workers.push_back({id, w.incarnation, w.name, w.clock,
                          static_cast<uint64_t>(std::max<int64_t>(0, now - w.last_seen_ms))});
  }
  st.memory_budget_bytes = options_.memory_budget_bytes;
  st.memory_used_bytes = memory_used_bytes();
  st.resident_bytes = options_.resident_bytes ? options_.resident_bytes() : 0;
  st.backup_workers = options_.backup_workers;
  st.stale_pushes_dropped = counters_.pushes_dropped_stale;
  st.pushes_summed = counters_.pushes_summed;
  st.clock_steps = counters_.clock_steps;
  if (options_.replication_stats) options_.replication_stats(&st);
  for (size_t id = 0; id < tables_.size(); ++id) {
    if (const Table* t = tables_[id].get()) {
      st.tables.push_back({t->id(), t->name(), t->rows(), t->cols(), t->range().size()});
      continue;
    }
    const ps::SparseTable& t = *sparse_[id];
    const ps::SparseCounters c = t.counters();
    ShardStats::TableStat ts;
    ts.table_id = t.id();
    ts.name = t.spec().name;
    ts.cols = t.cols();
    ts.local_rows = std::max(c.store_rows, c.resident_rows);
    ts.kind = TableKind::kSparse;
    ts.resident_rows = c.resident_rows;
    ts.memory_bytes = c.memory_bytes;
    ts.tier_hits = c.tier_hits;
    ts.tier_misses = c.tier_misses;
    ts.evictions = c.evictions;
    ts.admissions = c.admissions;
    ts.unadmitted_reads = c.unadmitted_reads;
    ts.dropped_gradients = c.dropped_gradients;
    ts.expired_rows = c.expired_rows;
    st.tables.push_back(std::move(ts));
  }
  out->push_back({peer, EncodeReply(rid, std::move(st))});
  return Status::Ok();
}

Status Shard::OnChunkRequest(const PeerId& peer, uint64_t rid, const ChunkRequest& m,
                             std::vector<Outgoing>* out) {
  if (options_.shard != 0) {
    return FailedPrecondition("data chunks are leased by shard 0, not shard " +
                              std::to_string(options_.shard));
  }
  LEASH_ASSIGN_OR_RETURN(LiveWorker * w, clocks_.Find(m.worker_id, m.incarnation));
  w->last_seen_ms = now_ms_();
  const DataPlan& p = m.plan;
  bool first_plan = !coverage_.has_plan();
  LEASH_RETURN_IF_ERROR(coverage_.SetPlan(p));
  if (first_plan) {
    spdlog::info("shard {}: job trains {} samples in {} chunks of {} for {} epochs", options_.shard,
                 p.num_samples, (p.num_samples + p.chunk_size - 1) / p.chunk_size, p.chunk_size,
                 p.epochs);
  }
  if (m.done) coverage_.Complete(m.done->epoch, m.done->chunk);
  const ps::DataCoverage::Speeds speeds{m.samples_per_second, m.others_samples_per_second};
  const uint64_t held_back = coverage_.held_back();
  ChunkGrant grant = coverage_.Next(m.worker_id, &speeds);
  if (coverage_.held_back() != held_back) {
    spdlog::debug(
        "shard {}: worker {} '{}' ({:.0f} samples/s, the others {:.0f}) takes no new chunk: the "
        "others finish what is left sooner",
        options_.shard, w->worker_id, w->name, m.samples_per_second, m.others_samples_per_second);
  }
  out->push_back({peer, EncodeReply(rid, grant)});
  return Status::Ok();
}

bool Shard::SumsIntoClockStep(const LiveWorker& w) const {
  // An iteration the minimum has passed (a backup worker's late push) was stepped already:
  // such a push is applied on its own. An iteration far ahead would hold one more sum of
  // the table for each clock: beyond kMaxClockSteps ahead of the minimum, likewise.
  return w.clock >= clocks_.MinClock() && w.clock < clocks_.MinClock() + kMaxClockSteps;
}

ShardCounters Shard::counters() const {
  ShardCounters c = counters_;
  // Every update this shard shares among threads goes through its own update_threads_.
  c.updates_split = update_threads_ ? update_threads_->split_runs() : 0;
  c.passes_split = update_threads_ ? update_threads_->split_passes() : 0;
  return c;
}

void Shard::ApplyClockSteps() {
  // With no live worker left (the last one left or was evicted before the minimum passed
  // its last iteration) nobody can add to a pending sum or move the minimum: its steps are
  // taken now, so the tables hold every acknowledged push.
  const int64_t before =
      clocks_.live() == 0 ? std::numeric_limits<int64_t>::max() : clocks_.MinClock();
  for (auto& t : tables_) {
    if (t && t->pending() > 0) {
      const uint64_t copies = t->copies_on_write();
      counters_.clock_steps += t->ApplyPendingBefore(before, update_threads_.get());
      counters_.values_copied_on_write += t->copies_on_write() - copies;
    }
  }
}

void Shard::ReleasePulls(std::vector<Outgoing>* out) {
  // Every move of the minimum clock comes here before any pull it allows is answered.
  ApplyClockSteps();
  for (ParkedPull& p : parked_.Release(clocks_.MinClock())) {
    if (auto it = parked_per_peer_.find(p.peer);
        it != parked_per_peer_.end() && --it->second == 0) {
      parked_per_peer_.erase(it);
    }
    // The table and rows were validated when the pull was parked and tables never shrink.
    if (ps::SparseTable* sparse = FindSparse(p.table_id)) {
      auto reply = MakeSparsePullReply(p.peer, p.request_id, *sparse, p.rows, p.dtype);
      if (!reply.ok()) {
        ++counters_.errors;
        out->push_back({p.peer, MakeError(p.request_id, reply.status(), options_.boot_id)});
        continue;
      }
      out->push_back({p.peer, std::move(*reply)});
      continue;
    }
    out->push_back({p.peer, MakePullReply(p.peer, p.request_id, *tables_[p.table_id], p.rows,
                                          p.dtype, /*defer_copy=*/true)});
  }
  // The replies released together are written together: where a clock completes, every
  // worker waits for the last of them.
  CopyReplies();
}

void Shard::CopyReplies() {
  if (reply_copies_.empty()) return;
  reply_copy_starts_.clear();
  size_t total = 0;
  for (const ReplyCopy& c : reply_copies_) {
    reply_copy_starts_.push_back(total);
    total += c.n;
  }
  // The copies laid end to end, each range of their sum copying the parts it covers.
  update_threads_->RunPass(total, [this](size_t b, size_t e) {
    size_t i = static_cast<size_t>(
        std::upper_bound(reply_copy_starts_.begin(), reply_copy_starts_.end(), b) -
        reply_copy_starts_.begin() - 1);
    while (b < e) {
      const ReplyCopy& c = reply_copies_[i];
      const size_t offset = b - reply_copy_starts_[i];
      const size_t n = std::min(e - b, c.n - offset);
      std::memcpy(c.to + offset, c.from + offset, n * sizeof(float));
      b += n;
      ++i;
    }
  });
  reply_copies_.clear();
}

void Shard::Evict(uint64_t worker_id, const char* why, std::vector<Outgoing>* out) {
  LiveWorker* w = clocks_.FindAny(worker_id);
  if (w == nullptr) return;
  spdlog::warn("shard {}: evicting worker {} '{}' at clock {}: {}", options_.shard, worker_id,
               w->name, w->clock, why);
  clocks_.Remove(worker_id);
  if (size_t n = coverage_.Release(worker_id); n > 0) {
    spdlog::warn("shard {}: {} data chunk(s) of evicted worker {} go to other workers",
                 options_.shard, n, worker_id);
  }
  ++counters_.evictions;
  ReleasePulls(out);
}

std::vector<uint64_t> Shard::ExpiredWorkers() const {
  return clocks_.Expired(now_ms_(), options_.lease_ms);
}

void Shard::EvictWorker(uint64_t worker_id, std::vector<Outgoing>* out) {
  const size_t first_reply = out->size();
  Evict(worker_id, "lease expired (no heartbeat)", out);
  CountSent(*out, first_reply);
}

bool Shard::ExpirySweepDue() const {
  // sparse_ holds a null for every dense table: only a sparse table whose rows expire needs
  // sweeps (a replicated primary logs each one, so a sweep for nothing is an entry shipped
  // to every backup ten times a second).
  if (now_ms_() < next_expire_ms_) return false;
  return std::any_of(sparse_.begin(), sparse_.end(), RowsExpire);
}

void Shard::SweepExpiry() {
  // Expiry sweeps a bounded number of rows per turn, so a big table never stalls the loop.
  next_expire_ms_ = now_ms_() + kExpireEveryMs;
  for (auto& t : sparse_) {
    if (!RowsExpire(t)) continue;
    if (Status st = t->Expire(clocks_.MinClock(), kExpireRowsPerSweep); !st.ok()) {
      ++counters_.sparse_store_errors;
      spdlog::warn("shard {}: expiry sweep of sparse table '{}' failed: {}", options_.shard,
                   t->spec().name, st.ToString());
    }
  }
}

void Shard::RenewLeases() {
  const int64_t now = now_ms_();
  for (const auto& [id, w] : clocks_.workers()) clocks_.FindAny(id)->last_seen_ms = now;
}

int64_t Shard::Tick(std::vector<Outgoing>* out) {
  int64_t now = now_ms_();
  if (!options_.replicated) {
    const size_t first_reply = out->size();
    for (uint64_t id : clocks_.Expired(now, options_.lease_ms))
      Evict(id, "lease expired (no heartbeat)", out);
    CountSent(*out, first_reply);
    if (ExpirySweepDue()) SweepExpiry();
  }
  if (options_.checkpoint_interval_ms > 0 && now >= next_snapshot_ms_) {
    auto r = Checkpoint();
    if (!r.ok())
      spdlog::error("shard {}: scheduled snapshot failed: {}", options_.shard,
                    r.status().ToString());
    next_snapshot_ms_ = now + options_.checkpoint_interval_ms;
  }
  int64_t next = options_.lease_ms / 4;
  if (options_.checkpoint_interval_ms > 0) next = std::min(next, next_snapshot_ms_ - now);
  return std::max<int64_t>(1, next);
}

ShardSnapshot Shard::MakeSnapshot() const {
  ShardSnapshot s;
  s.shard = options_.shard;
  s.num_shards = options_.num_shards;
  s.min_clock = clocks_.MinClock();
  s.sequence = snapshot_sequence_ + 1;
  s.unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::system_clock::now().time_since_epoch())
                  .count();
  for (size_t id = 0; id < tables_.size(); ++id) {
    if (tables_[id]) {
      s.tables.push_back(tables_[id]->ToSnapshot());
      continue;
    }
    // A sparse table's rows are in the cold store's checkpoint of the same sequence.
    TableSnapshot t;
    t.table_id = static_cast<uint32_t>(id);
    t.spec = sparse_[id]->spec();
    t.cols = sparse_[id]->cols();
    s.tables.push_back(std::move(t));
  }
  for (const auto& [id, w] : clocks_.workers()) s.workers.push_back(ToWorkerClock(id, w));
  s.coverage = coverage_.Serialize();
  return s;
}

Result<Shard::Image> Shard::MakeImage() {
  Image image;
  image.snapshot = MakeSnapshot();
  // A replica catching up must grant the chunks the primary grants as it applies the log.
  image.snapshot.coverage = coverage_.SerializeExact();
  image.tiers.resize(sparse_.size());
  bool has_sparse = false;
  for (size_t id = 0; id < sparse_.size(); ++id) {
    if (!sparse_[id]) continue;
    has_sparse = true;
    if (auto r = sparse_[id]->FlushDirty(); !r.ok()) {
      return r.status().WithContext("flushing sparse table '" + sparse_[id]->spec().name + "'");
    }
    image.tiers[id] = sparse_[id]->ExportTier();
  }
  if (has_sparse) {
    LEASH_ASSIGN_OR_RETURN(image.rows, sparse_store_->OpenImage());
  }
  return image;
}

Status Shard::ImportSparseTier(uint32_t id, std::span<const uint8_t> layout) {
  ps::SparseTable* t = FindSparse(id);
  if (t == nullptr) return InvalidArgument("table " + std::to_string(id) + " is not sparse");
  return t->ImportTier(layout);
}

Result<int64_t> Shard::Checkpoint(std::string replica_stop) {
  auto t0 = std::chrono::steady_clock::now();
  ShardSnapshot snap = MakeSnapshot();
  snap.replica_stop = std::move(replica_stop);
  // Sparse rows: the changed rows to the cold store, then its checkpoint under the snapshot's
  // sequence, then the snapshot. A crash before the save leaves the previous pair.
  const bool has_sparse =
      std::any_of(sparse_.begin(), sparse_.end(), [](const auto& t) { return t != nullptr; });
  uint64_t flushed = 0;
  if (has_sparse) {
    Status st;
    for (auto& t : sparse_) {
      if (!t) continue;
      auto r = t->FlushDirty();
      if (!r.ok()) {
        st = r.status().WithContext("flushing sparse table '" + t->spec().name + "'");
        break;
      }
      flushed += *r;
    }
    if (st.ok()) st = sparse_store_->Checkpoint(snap.sequence);
    if (!st.ok()) {
      ++counters_.snapshot_failures;
      return st.WithContext("snapshot #" + std::to_string(snap.sequence) + " of sparse rows to " +
                            sparse_store_->Describe());
    }
  }
  if (checkpoint_hooks_.before) {
    if (Status st = checkpoint_hooks_.before(snap); !st.ok()) {
      ++counters_.snapshot_failures;
      return st.WithContext("snapshot #" + std::to_string(snap.sequence));
    }
  }
  if (Status st = store_->Save(snap); !st.ok()) {
    ++counters_.snapshot_failures;
    if (checkpoint_hooks_.after) checkpoint_hooks_.after(false);
    return st.WithContext("snapshot to " + store_->Describe());
  }
  if (checkpoint_hooks_.after) checkpoint_hooks_.after(true);
  if (has_sparse) {
    if (Status st = sparse_store_->Prune(snap.sequence); !st.ok()) {
      spdlog::warn("shard {}: old sparse checkpoints not deleted: {}", options_.shard,
                   st.ToString());
    }
  }
  snapshot_sequence_ = snap.sequence;
  snapshot_unix_ms_ = snap.unix_ms;
  last_snapshot_clock_ = snap.min_clock;
  last_snapshot_ms_ = now_ms_();
  ++counters_.snapshots;
  auto ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (snapshot_observer_) snapshot_observer_(ms / 1e3);
  spdlog::info("shard {}: snapshot #{} at clock {} written to {} in {:.1f} ms{}", options_.shard,
               snap.sequence, snap.min_clock, store_->Describe(), ms,
               has_sparse ? " (" + std::to_string(flushed) + " changed sparse rows)" : "");
  return snap.min_clock;
}

int64_t Shard::max_clock() const {
  int64_t m = clocks_.MinClock();
  for (const auto& [id, w] : clocks_.workers()) m = std::max(m, w.clock);
  return m;
}

Status Serve(Shard& shard, ServerTransport& transport, const std::atomic<bool>& stop,
             const std::function<void(const Shard&)>& after_tick) {
  std::vector<Outgoing> out;
  int64_t wait_ms = shard.Tick(&out);
  Status result;
  // Replies the transport refused: a few lines a minute, with the count of the others.
  KeyedRateLimit dropped_log({.per_key = 5, .total = 5, .window_ms = 60000, .max_keys = 1});
  const auto start = std::chrono::steady_clock::now();
  shard.SetPayloadAllocator([&transport](const PeerId& peer, size_t bytes) {
    return transport.ReservePayload(peer, bytes);
  });
  // Pushes out of a same-host worker's ring are copied (and checked) by the update threads,
  // as they are applied.
  if (ps::UpdateThreads* threads = shard.update_threads()) {
    transport.SetFrameCopier([threads](const void* data, size_t bytes) {
      return ps::CopyCheckingFiniteShared(threads, data, bytes);
    });
  }
  while (!stop.load(std::memory_order_relaxed)) {
    auto in = transport.Receive(std::chrono::milliseconds(std::min<int64_t>(wait_ms, 100)));
    if (!in.ok()) {
      result = in.status();
      break;
    }
    if (in->has_value()) shard.Handle((*in)->peer, (*in)->message, &out);
    wait_ms = shard.Tick(&out);
    for (Outgoing& o : out) {
      Status st = transport.Send(o.peer, std::move(o.message));
      if (st.ok()) continue;
      const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::steady_clock::now() - start)
                              .count();
      if (auto d = dropped_log.Admit("", now); d.allowed) {
        spdlog::warn("shard {}: reply dropped: {}{}", shard.options().shard, st.ToString(),
                     d.suppressed_before == 0
                         ? std::string()
                         : fmt::format(" ({} more since the last line)", d.suppressed_before));
      }
    }
    out.clear();
    if (after_tick) after_tick(shard);
  }
  shard.SetPayloadAllocator(nullptr);  // the transport may go before the shard
  transport.SetFrameCopier(nullptr);   // and the shard before the transport
  auto snap = shard.Checkpoint();
  if (!snap.ok()) {
    spdlog::error("shard {}: final snapshot failed: {}", shard.options().shard,
                  snap.status().ToString());
    if (result.ok()) result = snap.status();
  }
  return result;
}

}  // namespace leash::server

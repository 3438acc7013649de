// A replicated shard's log, its primary and backup roles, catch-up by snapshot and
// failover (replica.h; docs/replication.md, "The log"). Not thread-safe (one loop).
#include "leash/server/replica.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <variant>

#include "durable_log.h"
#include "leash/ps/sparse_table.h"

namespace leash::server {
namespace {

uint64_t RandomBootId() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32 | rd()) | 1;
}

// A worker's record in a snapshot chunk, and back. Every field goes through these two (brace
// lists, so -Wmissing-field-initializers names one left out).
ReplSnapshotMsg::Worker ToWire(const WorkerClock& w) {
  return {
      w.worker_id, w.incarnation,        w.clock,          w.last_seq,           w.name,
      w.staleness, w.samples_per_second, w.speed_reported, w.push_decided_clock, w.push_dropped};
}
WorkerClock FromWire(const ReplSnapshotMsg::Worker& w) {
  return {
      w.worker_id, w.incarnation,        w.clock,          w.last_seq,           w.name,
      w.staleness, w.samples_per_second, w.speed_reported, w.push_decided_clock, w.push_dropped};
}

// A stop record (Replica::StopRecord) is the append a primary would send to bring an empty
// log to this replica's, its frames end to end: a magic, the frame count (u32), then each
// frame's size (u64) and bytes, integers little-endian.
constexpr std::string_view kStopMagic = "leash-replica-stop-1";

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
bool GetLe(std::string_view* in, int bytes, uint64_t* v) {
  if (in->size() < static_cast<size_t>(bytes)) return false;
  *v = 0;
  for (int i = 0; i < bytes; ++i)
    *v |= static_cast<uint64_t>(static_cast<uint8_t>((*in)[static_cast<size_t>(i)])) << (8 * i);
  in->remove_prefix(static_cast<size_t>(bytes));
  return true;
}

std::string EncodeStopRecord(const Message& m) {
  std::string out(kStopMagic);
  PutLe(&out, m.size(), 4);
  for (const Frame& f : m) {
    PutLe(&out, f.size(), 8);
    out.append(f.view());
  }
  return out;
}

Result<Message> DecodeStopRecord(std::string_view in) {
  if (!in.starts_with(kStopMagic)) return InvalidArgument("not a stop record (no magic)");
  in.remove_prefix(kStopMagic.size());
  uint64_t count = 0;
  if (!GetLe(&in, 4, &count)) return InvalidArgument("stop record cut short");
  Message m;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t size = 0;
    if (!GetLe(&in, 8, &size) || size > in.size())
      return InvalidArgument("stop record cut short in frame " + std::to_string(i));
    m.push_back(Frame::Copy(in.data(), static_cast<size_t>(size)));
    in.remove_prefix(static_cast<size_t>(size));
  }
  if (!in.empty()) return InvalidArgument("stop record has bytes past its frames");
  return m;
}

}  // namespace

// ---- catch-up by snapshot: the state of a transfer on each side ---------------------------

// Primary: one snapshot transfer to one backup. The image is the shard at entry `index`
// (dense tables copied, sparse tier layouts, a view of the sparse store), shared with any
// other transfer of the same entry. Chunk 0 is the header; chunk c > 0 starts at starts[c]
// and ends where chunk c + 1 starts; positions are kept from the acknowledged chunk on.
struct Replica::Transfer {
  struct Pos {
    size_t part = 0;      // < arrays.size(): an array; then the sparse tables in order
    uint64_t offset = 0;  // bytes into the array, or the sparse store's key cursor
  };
  struct Array {
    const uint8_t* data = nullptr;
    uint64_t bytes = 0;
  };
  uint64_t id = 0;
  uint64_t term = 0;
  uint64_t index = 0;
  uint64_t index_term = 0;
  uint64_t commit = 0;
  std::shared_ptr<Shard::Image> image;
  std::vector<Array> arrays;
  std::vector<uint32_t> sparse_ids;   // the sparse tables, in table order
  std::vector<size_t> sparse_record;  // their record bytes
  std::map<uint32_t, Pos> starts;
  uint32_t acked = 0;            // the backup holds the chunks before this one
  uint32_t next = 0;             // the next chunk to send
  uint32_t sent_upto = 0;        // every chunk before this one was sent at least once
  std::optional<uint32_t> last;  // the final chunk, once known
  int64_t progress_ms = 0;       // when the backup last acknowledged more, or a resend began
  int64_t ack_ms = 0;            // when the backup last acknowledged anything
  uint64_t bytes_sent = 0;

  size_t parts() const { return arrays.size() + sparse_ids.size(); }
  // Skips empty arrays; `pos` past every part means the end.
  Pos Normalize(Pos pos) const {
    while (pos.part < arrays.size() && pos.offset >= arrays[pos.part].bytes)
      pos = {pos.part + 1, 0};
    return pos;
  }
};

// Backup: the transfer being received. Dense tables are assembled in `snap` (the arrays
// they will be), tier layouts in `tiers`; sparse rows go to the replica's cold tier at once.
struct Replica::Staging {
  struct Array {
    uint8_t* data = nullptr;
    uint64_t bytes = 0;
  };
  uint64_t transfer = 0;
  uint64_t term = 0;
  uint32_t primary = 0;
  uint64_t index = 0;
  uint64_t index_term = 0;
  uint64_t commit = 0;
  ShardSnapshot snap;
  std::vector<std::vector<uint8_t>> tiers;  // by table id (empty for a dense table)
  std::vector<Array> arrays;                // numbered as the primary's
  std::vector<size_t> record_bytes;         // by table id: a sparse table's, else 0
  uint32_t next = 1;                        // the next chunk expected
  uint64_t rows = 0;
};

Replica::~Replica() = default;

Replica::Replica(ReplicaOptions options, ShardOptions shard_options, SnapshotStore* store,
                 NowMs now_ms, Coordinator* coordinator, ShardDirectory* directory,
                 ClientTransport* peers, SparseStore* sparse)
    : options_(options),
      shard_options_(std::move(shard_options)),
      store_(store),
      sparse_(sparse),
      now_ms_(std::move(now_ms)),
      coordinator_(coordinator),
      directory_(directory),
      peers_(peers),
      peers_state_(options.replicas),
      transfers_(options.replicas) {
  LEASH_CHECK(options_.replicas >= 1 && options_.replica < options_.replicas);
  LEASH_CHECK(options_.snapshot_chunk_bytes > 0 && options_.snapshot_window > 0);
  if (options_.replicas == 1) {
    // A group of one keeps no applied entry in memory: no backup will ever ask for one
    // (its log is on disk; 64 MiB of pushes held for nobody otherwise).
    options_.max_log_entries = 0;
    options_.max_log_bytes = 0;
  }
  if (sparse_ == nullptr) {
    // The shards this replica installs share one cold tier, so a snapshot's rows can be
    // staged in it before the shard that reads them exists.
    own_sparse_ = std::make_unique<MemorySparseStore>();
    sparse_ = own_sparse_.get();
  }
  shard_options_.replicated = true;
  shard_options_.replication_stats = [this](ShardStats* st) {
    st->replicas = options_.replicas;
    st->replica = options_.replica;
    st->term = term_;
    st->log_index = last_index();
    st->replication_lag = replication_lag();
    st->replicas_in_sync = static_cast<uint32_t>(in_sync_.size());
    st->durable_log = durable_log_mode();
    st->durable_log_bytes = durable_bytes();
    st->durable_log_failed = durable_broken_;
    FillBackupLag(st);
  };
  if (shard_options_.boot_id == 0) shard_options_.boot_id = RandomBootId();
  boot_id_ = RandomBootId();
  now_ = now_ms_();
  shard_now_ = now_;
  shard_ = std::make_unique<Shard>(
      shard_options_, store_, [this] { return shard_now_; }, sparse_);
  AttachShard();
}

void Replica::ResetShard() {
  shard_ = std::make_unique<Shard>(
      shard_options_, store_, [this] { return shard_now_; }, sparse_);
  AttachShard();
}

void Replica::AttachShard() {
  shard_->set_snapshot_observer(snapshot_observer_);
  shard_->SetPayloadAllocator([this](const PeerId& peer, size_t bytes) {
    return role_ == ReplicaRole::kPrimary && payload_allocator_ ? payload_allocator_(peer, bytes)
                                                                : std::optional<WritableFrame>();
  });
  // Every snapshot this replica's shard saves begins a durable log file: first where the
  // snapshot's state stands in the log, then what follows it.
  shard_->set_checkpoint_hooks(
      {[this](const ShardSnapshot& snap) -> Status {
         if (durable_ == nullptr || durable_broken_) return Status::Ok();
         // Where the state stands: after the entry being applied if a request of its own
         // takes the snapshot (a table's creation, a checkpoint request: the last thing it
         // does), else after the last entry applied.
         uint64_t at = applied_index_;
         if (applying_ != nullptr) {
           if (IsBatch(applying_->message)) {
             return FailedPrecondition(
                 "a snapshot in the middle of a logged batch is not taken with a durable log "
                 "(its state is between two entries; the log holds the batch); send the "
                 "checkpoint request on its own");
           }
           at = applying_->index;
         }
         LEASH_CHECK(at >= base_index_);
         durable_state_bytes_ = 0;
         for (const TableSnapshot& t : snap.tables) {
           durable_state_bytes_ += t.values.size() * sizeof(float);
           for (const auto& slot : t.slots) durable_state_bytes_ += slot.size() * sizeof(float);
         }
         if (Status st =
                 durable_->Begin({snap.sequence, snap.unix_ms}, CouldLead(), LogSince(at + 1));
             !st.ok()) {
           BreakDurable(st);
         }
         return Status::Ok();
       },
       [this](bool saved) {
         if (durable_ == nullptr || durable_broken_) return;
         if (!saved) return durable_->Abort();
         if (Status st = durable_->Commit(); !st.ok()) return BreakDurable(st);
         MarkPersisted(CouldLead());
       }});
}

size_t Replica::EntryBytes(const ReplEntryWire& e) {
  size_t n = 0;
  for (const Frame& f : e.message) n += f.size();
  return n;
}

uint64_t Replica::TermAt(uint64_t index) const {
  if (index == base_index_) return base_term_;
  if (index < base_index_ || index > last_index()) return 0;
  return log_[index - base_index_ - 1].term;
}

const ReplEntryWire& Replica::EntryAt(uint64_t index) const {
  LEASH_CHECK(index > base_index_ && index <= last_index());
  return log_[index - base_index_ - 1];
}

ReplEntryWire* Replica::LoggedEntry(uint64_t index) {
  if (index <= base_index_ || index > last_index()) return nullptr;
  return &log_[index - base_index_ - 1];
}

uint64_t Replica::replication_lag() const {
  if (role_ != ReplicaRole::kPrimary) return 0;
  uint64_t low = last_index();
  for (uint32_t r : in_sync_)
    if (r != options_.replica) low = std::min(low, peers_state_[r].match_index);
  return last_index() - low;
}

std::vector<BackupProgress> Replica::backups() const {
  std::vector<BackupProgress> v;
  const bool primary = role_ == ReplicaRole::kPrimary;
  const int64_t now = primary ? now_ms_() : 0;
  for (uint32_t r = 0; r < options_.replicas; ++r) {
    if (r == options_.replica) continue;
    const Peer& p = peers_state_[r];
    BackupProgress b{r, std::binary_search(in_sync_.begin(), in_sync_.end(), r), p.match_index};
    if (primary) {
      const uint64_t first = std::max(p.match_index, base_index_) + 1;
      if (first <= last_index()) b.ms_behind = now - EntryAt(first).now_ms;
      b.ms_since_ack = p.last_ack_ms > 0 ? now - p.last_ack_ms : -1;
    }
    v.push_back(b);
  }
  return v;
}

void Replica::FillBackupLag(ShardStats* st) const {
  st->commit_index = commit_index_;
  if (role_ != ReplicaRole::kPrimary) return;
  for (const BackupProgress& p : backups()) {
    ShardStats::Backup b;
    b.replica = p.replica;
    b.in_sync = p.in_sync;
    b.match_index = p.match_index;
    b.entries_behind = last_index() - std::min(p.match_index, last_index());
    b.ms_behind = p.ms_behind;
    b.ms_since_ack = p.ms_since_ack;
    // Counted over the entries the log still holds (a stats request, not the hot path).
    for (uint64_t i = std::max(p.match_index, base_index_) + 1; i <= last_index(); ++i) {
      for (const Frame& f : EntryAt(i).message) b.bytes_behind += f.size();
    }
    st->backups.push_back(b);
  }
}

namespace {

// A logged request a backup may answer: pushes and clocks of one worker, alone or as a batch
// (leash-worker sends an iteration's pushes and clock as one), with their request ids, the
// worker and the pushes' incarnation.
struct Answerable {
  uint64_t worker = 0;
  std::optional<uint64_t> incarnation;  // none: clocks only
  std::vector<uint64_t> rids;           // sorted
};

std::optional<Answerable> PushesAndClocks(const Message& message, const WireLimits& limits) {
  std::vector<Message> parts;
  if (IsBatch(message)) {
    auto unpacked = UnpackBatch(message);
    if (!unpacked.ok()) return std::nullopt;
    parts = std::move(*unpacked);
  } else {
    parts.push_back(message);
  }
  Answerable a;
  for (const Message& m : parts) {
    const RequestPeek::Kind kind = PeekRequest(m, limits).kind;
    if (kind != RequestPeek::kPush && kind != RequestPeek::kClock) return std::nullopt;
    // Malformed: the shard answers it with an error, and so does the primary.
    auto decoded = DecodeRequest(m, limits);
    if (!decoded.ok()) return std::nullopt;
    uint64_t worker = 0;
    if (const auto* p = std::get_if<PushRequest>(&decoded->value)) {
      worker = p->worker_id;
      if (a.incarnation && *a.incarnation != p->incarnation) return std::nullopt;
      a.incarnation = p->incarnation;
    } else if (const auto* c = std::get_if<ClockRequest>(&decoded->value)) {
      worker = c->worker_id;
    }
    if (worker == 0 || (a.worker != 0 && a.worker != worker)) return std::nullopt;
    a.worker = worker;
    a.rids.push_back(decoded->request_id);
  }
  if (a.rids.empty()) return std::nullopt;
  std::sort(a.rids.begin(), a.rids.end());
  return a;
}

// `reply` (one reply, or a batch of them) split into the replies to requests `rids` and the
// rest (a pull of the same worker its clock released), each one message or none.
std::pair<std::optional<Message>, std::optional<Message>> SplitReplies(
    Message reply, const std::vector<uint64_t>& rids) {
  auto mine = [&](const Message& m) {
    return std::binary_search(rids.begin(), rids.end(), PeekRequestId(m));
  };
  if (!IsBatch(reply)) {
    if (mine(reply)) return {std::move(reply), std::nullopt};
    return {std::nullopt, std::move(reply)};
  }
  auto parts = UnpackBatch(reply);
  if (!parts.ok()) return {std::nullopt, std::move(reply)};
  std::vector<Message> in, out;
  for (Message& m : *parts) (mine(m) ? in : out).push_back(std::move(m));
  auto pack = [](std::vector<Message> v) -> std::optional<Message> {
    if (v.empty()) return std::nullopt;
    if (v.size() == 1) return std::move(v[0]);
    return PackBatch(std::move(v));
  };
  return {pack(std::move(in)), pack(std::move(out))};
}

}  // namespace

// ---- workers' requests ------------------------------------------------------------------

namespace {

// Whether a request of this kind changes replicated state (and so is logged).
bool PeekChangesState(const RequestPeek& p, const Shard& shard, const ShardOptions& options) {
  switch (p.kind) {
    case RequestPeek::kRegister:
    case RequestPeek::kCreateTable:
    case RequestPeek::kPush:
    case RequestPeek::kClock:
    case RequestPeek::kLeave:
    case RequestPeek::kChunkRequest:
      return true;
    case RequestPeek::kPull:
      // A sparse pull creates rows and moves them between tiers; under backup workers a pull
      // sets the bound its worker's pushes are held to. Dense pulls only read.
      return shard.sparse_table(p.table_id) != nullptr || options.backup_workers > 0;
    default:
      return false;  // heartbeats, stats, checkpoints (each replica's own), garbage
  }
}

}  // namespace

bool Replica::ChangesState(const Message& message) const {
  if (IsBatch(message)) {
    auto parts = UnpackBatch(message);
    if (!parts.ok()) return false;  // the shard answers it with an error and changes nothing
    for (const Message& m : *parts)
      if (ChangesState(m)) return true;
    return false;
  }
  return PeekChangesState(PeekRequest(message, shard_options_.limits), *shard_, shard_options_);
}

void Replica::Handle(const PeerId& peer, const Message& message, std::vector<Outgoing>* out,
                     const std::string& user) {
  now_ = now_ms_();
  // The header is verified once here to route the message, and again by the shard.
  const bool batch = IsBatch(message);
  const RequestPeek peek = batch ? RequestPeek{} : PeekRequest(message, shard_options_.limits);
  if (peek.kind == RequestPeek::kReplication) {
    if (!options_.replica_user.empty() && user != options_.replica_user) {
      // Authenticated, but not with the replicas' key: a worker's key cannot append to the
      // log, vote itself a term or acknowledge entries. Nothing is answered.
      ++replication_refused_;
      if (refused_logged_ms_ < 0 || now_ - refused_logged_ms_ >= 60000) {
        refused_logged_ms_ = now_;
        spdlog::warn(
            "shard {}: refused a replication message from client key '{}': only the replicas' "
            "own key (server.key) may send them ({} refused so far; logged at most once a "
            "minute)",
            shard_options_.shard, user.empty() ? "(none)" : user, replication_refused_);
      }
      return;
    }
    if (ps::HasUnstable(message)) {
      // From a replica that does not lend (ZmqOptions::shm_borrow_all borrowed its frames):
      // copied now, as any other client's; a log holds only bytes nobody can change.
      Message stable = message;
      ps::StabilizeShared(shard_->update_threads(), &stable);
      OnReplication(peer, stable, out);
    } else {
      OnReplication(peer, message, out);
    }
    (void)Persist();  // a term or whether it may lead, changed on the way
    if (role_ == ReplicaRole::kPrimary) {
      AdvanceCommit();
      Release(out);
    }
    return;
  }
  if (role_ != ReplicaRole::kPrimary) {
    // A worker's heartbeat on its connection to this backup: where to answer it (it is still
    // told this replica is a backup, which a client's backup connection ignores).
    if (options_.backup_answers && peek.kind == RequestPeek::kHeartbeat)
      NoteWorkerLink(peer, message);
    std::string where =
        primary_ ? "replica " + std::to_string(*primary_) + " (term " + std::to_string(term_) + ")"
                 : std::string("not known yet (an election is under way)");
    out->push_back(
        {peer, MakeError(PeekRequestId(message),
                         Unavailable("replica " + std::to_string(options_.replica) + " of shard " +
                                     std::to_string(shard_options_.shard) +
                                     " is a backup; the primary is " + where +
                                     ": follow the shard directory"),
                         shard_options_.boot_id)});
    return;
  }
  if (batch ? ChangesState(message) : PeekChangesState(peek, *shard_, shard_options_)) {
    Log(ReplEntryWire::kInput, peer, 0, message);
    if (role_ != ReplicaRole::kPrimary) return;  // its durable log failed
  } else {
    // Read-only: served from the primary's state, which holds every entry logged so far;
    // the reply waits for those entries to commit, so no reply shows a value a failover
    // could take back.
    scratch_.clear();
    SetShardNow(now_);
    shard_->Handle(peer, message, &scratch_);
    for (Outgoing& o : scratch_) held_.push_back({last_index(), std::move(o)});
    scratch_.clear();
  }
  AdvanceCommit();
  Release(out);
}

void Replica::Log(ReplEntryWire::Kind kind, const PeerId& peer, uint64_t worker_id,
                  const Message& message) {
  if (role_ != ReplicaRole::kPrimary) return;  // stepped down on the way (its durable log)
  ReplEntryWire e;
  e.term = term_;
  e.index = last_index() + 1;
  e.now_ms = std::max(now_, shard_now_);  // the shard's clock never goes back
  e.kind = kind;
  e.peer = peer;
  e.worker_id = worker_id;
  e.message = message;  // the frames are shared, not copied
  const uint64_t index = e.index;
  log_bytes_ += EntryBytes(e);
  log_.push_back(std::move(e));
  // A push's frames may still lie in its worker's ring (Frame::unstable): the copy for a
  // same-host backup is made from there, and is what this replica applies and keeps
  // (CopyIntoRing). What is written to a durable log is what is applied: a copy first.
  if (durable_ != nullptr) ps::StabilizeShared(shard_->update_threads(), &log_.back().message);
  // A backup that may answer acknowledges the entry to its worker as soon as it holds it, so
  // this replica's durable log must hold it first (a primary that restarts with its log may
  // lead again); otherwise it is written after shipping, while the backups receive it.
  if (options_.backup_answers && durable_ != nullptr && !Persist()) return;
  // Shipped before it is applied here: the backups receive and acknowledge the entry while
  // this replica applies it (the update is most of an entry's cost), instead of after.
  ReplicateAll();
  // Frames no backup's ring took (none on this host, no room, a backup being sent a
  // snapshot): copied out now, as the transport would have; whatever the role now, since
  // the entry stays in the log (a replica that leads again applies it).
  if (!log_.empty() && log_.back().index == index)
    ps::StabilizeShared(shard_->update_threads(), &log_.back().message);
  // On disk before it is applied and so before any reply it releases can go out.
  if (!Persist()) return;  // this replica stepped down
  scratch_.clear();
  Apply(log_.back(), &scratch_);
  applied_index_ = log_.back().index;
  // With backups that answer, the replies to the entry's own pushes and clocks are held apart
  // (`own`): its backup may send them instead (OnAck).
  std::optional<Answerable> answerable;
  if (options_.backup_answers && kind == ReplEntryWire::kInput)
    answerable = PushesAndClocks(message, shard_options_.limits);
  for (Outgoing& o : scratch_) {
    if (!answerable || o.peer != peer) {
      held_.push_back({applied_index_, std::move(o), false});
      continue;
    }
    auto [own, rest] = SplitReplies(std::move(o.message), answerable->rids);
    if (own) {
      held_.push_back({applied_index_, {peer, std::move(*own)}, true, answerable->rids.size()});
    }
    if (rest) held_.push_back({applied_index_, {peer, std::move(*rest)}, false});
  }
  scratch_.clear();
}

void Replica::Apply(const ReplEntryWire& e, std::vector<Outgoing>* out) {
  SetShardNow(e.now_ms);
  switch (e.kind) {
    case ReplEntryWire::kInput:
      applying_ = &e;
      shard_->Handle(e.peer, e.message, out);
      applying_ = nullptr;
      break;
    case ReplEntryWire::kEvict:
      shard_->EvictWorker(e.worker_id, out);
      break;
    case ReplEntryWire::kExpirySweep:
      shard_->SweepExpiry();
      break;
    case ReplEntryWire::kNoop:
      break;
  }
}

void Replica::ApplyCommitted(std::vector<Outgoing>* out, const std::vector<Answer>& answered) {
  // Backups never apply past the commit index: a new primary might not hold those entries.
  auto next = answered.begin();
  while (applied_index_ < commit_index_ && applied_index_ < last_index()) {
    scratch_.clear();
    const ReplEntryWire& e = EntryAt(applied_index_ + 1);
    Apply(e, &scratch_);
    ++applied_index_;
    while (next != answered.end() && next->index < applied_index_) ++next;
    if (out == nullptr || next == answered.end() || next->index != applied_index_) continue;
    // Answered here (the primary was told, and drops its own reply): the reply to the
    // entry's own request, which this replica's state, the same as the primary's, makes the
    // same; the shard's other replies (pulls it released) are the primary's to send.
    for (Outgoing& o : scratch_) {
      if (o.peer != e.peer) continue;
      auto own = SplitReplies(std::move(o.message), next->rids).first;
      if (!own) continue;
      out->push_back({next->peer, std::move(*own)});
      backup_answered_ += next->rids.size();
    }
  }
  scratch_.clear();  // the rest: a backup answers nobody else
}

std::optional<Replica::Answer> Replica::AnswerOf(uint64_t index, const ReplEntryWire& e) const {
  if (e.kind != ReplEntryWire::kInput) return std::nullopt;
  std::optional<Answerable> a = PushesAndClocks(e.message, shard_options_.limits);
  if (!a) return std::nullopt;
  auto it = worker_links_.find(a->worker);
  if (it == worker_links_.end()) return std::nullopt;
  const WorkerLink& link = it->second;
  if (now_ - link.seen_ms > shard_options_.lease_ms) return std::nullopt;  // gone quiet
  if (a->incarnation && *a->incarnation != link.incarnation) return std::nullopt;
  return Answer{index, link.peer, std::move(a->rids)};
}

void Replica::NoteWorkerLink(const PeerId& peer, const Message& heartbeat) {
  auto decoded = DecodeRequest(heartbeat, shard_options_.limits);
  if (!decoded.ok()) return;
  const auto* hb = std::get_if<HeartbeatRequest>(&decoded->value);
  if (hb == nullptr || hb->worker_id == 0) return;
  worker_links_[hb->worker_id] = {hb->incarnation, peer, now_};
  // Workers gone for good are forgotten (the map stays as large as the live workers).
  std::erase_if(worker_links_, [&](const auto& kv) {
    return now_ - kv.second.seen_ms > 2 * shard_options_.lease_ms;
  });
}

bool Replica::BackupMayAnswer(uint32_t r, uint64_t last) const {
  if (!options_.backup_answers || options_.durable_log_fsync) return false;
  if (in_sync_.size() != 2 || !std::binary_search(in_sync_.begin(), in_sync_.end(), r))
    return false;
  // What the backup acknowledges to workers must outlive this replica's restart too.
  return durable_ == nullptr || durable_broken_ || (persisted_last_ >= last && dirty_from_ > last);
}

// ---- the primary ------------------------------------------------------------------------

void Replica::ReplicateAll() {
  for (uint32_t r = 0; r < options_.replicas; ++r) {
    if (r == options_.replica) continue;
    if (peers_state_[r].next_index <= last_index()) SendAppend(r);
  }
}

void Replica::SendAppend(uint32_t r) {
  Peer& p = peers_state_[r];
  if (transfers_[r] != nullptr || p.next_index <= base_index_) return SendSnapshot(r);
  ReplAppendMsg m;
  m.term = term_;
  m.primary = options_.replica;
  m.prev_index = p.next_index - 1;
  m.prev_term = TermAt(m.prev_index);
  m.commit = commit_index_;
  const uint64_t last =
      std::min<uint64_t>(last_index(), m.prev_index + options_.max_entries_per_append);
  for (uint64_t i = p.next_index; i <= last; ++i) m.entries.push_back(EntryAt(i));
  p.next_index = last + 1;
  p.sent_ms = now_;
  m.backup_answers = BackupMayAnswer(r, last);
  CopyIntoRing(r, &m);
  // Frames still in a worker's ring that no ring of this backup took (another host, no room):
  // the logged entry is copied out first, and that copy sent, so the backup gets the bytes
  // this replica applies.
  for (ReplEntryWire& e : m.entries) {
    ReplEntryWire* logged = ps::HasUnstable(e.message) ? LoggedEntry(e.index) : nullptr;
    if (logged == nullptr) continue;
    ps::StabilizeShared(shard_->update_threads(), &logged->message);
    for (size_t f = 0; f < e.message.size() && f < logged->message.size(); ++f)
      if (e.message[f].unstable()) e.message[f] = logged->message[f];
  }
  (void)peers_->Send(static_cast<int>(r), EncodeReplication(std::move(m)));
}

void Replica::CopyIntoRing(uint32_t r, ReplAppendMsg* m) {
  ClientSharedMemory* shm = peers_->shared_memory();
  if (shm == nullptr || !shm->ActiveWith(static_cast<int>(r))) return;
  for (ReplEntryWire& e : m->entries) {
    // The logged entry, whose frames the shard applies (entries resent after a compaction
    // are not there any more: only the copy is made then).
    ReplEntryWire* logged = LoggedEntry(e.index);
    for (size_t f = 0; f < e.message.size(); ++f) {
      Frame& frame = e.message[f];
      // nullopt below the ring's smallest frame or without room: the transport decides.
      std::optional<WritableFrame> w = shm->ReservePayload(static_cast<int>(r), frame.size());
      if (!w) continue;
      // Shared by the shard's update threads, as its update of the entry is.
      const bool finite =
          ps::CopyAllFiniteShared(shard_->update_threads(), w->data, frame.data(), frame.size());
      if (logged != nullptr && logged->message[f].unstable()) {
        // Still in the worker's ring, which may change: the ring's copy is the entry's bytes
        // from now on, applied here as in place on the backup, and kept until the entry is
        // compacted (its room held until then). One copy of the push instead of two.
        logged->message[f] = Frame::CopiedCheckingFinite(w->frame, finite);
        lent_through_ = std::max(lent_through_, e.index);
        ++frames_copied_once_;
      } else if (logged != nullptr && finite && !logged->message[f].finite_f32()) {
        logged->message[f] = Frame::CopiedCheckingFinite(frame, finite);
      }
      // The ring's copy holds the same bytes: the append says they were found finite, and a
      // backup reading them in place need not check them again (Frame::LentFinite).
      frame = Frame::CopiedCheckingFinite(w->frame, finite);
    }
  }
}

void Replica::SendSnapshot(uint32_t r) {
  Peer& p = peers_state_[r];
  std::unique_ptr<Transfer>& t = transfers_[r];
  if (t != nullptr && now_ - t->ack_ms >= options_.snapshot_timeout_ms) {
    spdlog::warn(
        "shard {}: replica {} acknowledged nothing of snapshot transfer {} for {} ms; "
        "dropped (a new one starts when it answers)",
        shard_options_.shard, r, t->id, now_ - t->ack_ms);
    t.reset();
    p.snapshot_ms = now_;
    return;
  }
  if (t == nullptr) {
    if (p.boot_id == 0 || now_ - p.last_ack_ms > options_.snapshot_timeout_ms) {
      // Not heard from lately (down, or not started yet): no image is made for it; an empty
      // append asks it to answer, and its answer starts the transfer.
      ReplAppendMsg probe;
      probe.term = term_;
      probe.primary = options_.replica;
      probe.prev_index = base_index_;
      probe.prev_term = base_term_;
      probe.commit = commit_index_;
      p.sent_ms = now_;
      (void)peers_->Send(static_cast<int>(r), EncodeReplication(std::move(probe)));
      return;
    }
    if (p.snapshot_ms >= 0 && now_ - p.snapshot_ms < options_.snapshot_every_ms) return;
    if (!StartSnapshot(r)) return;
  }
  // Nothing acknowledged for a while: chunks (or their acknowledgements) were lost; send
  // again from where the backup stands.
  if (t->next > t->acked && now_ - t->progress_ms >= options_.resend_ms) {
    t->next = t->acked;
    t->progress_ms = now_;
  }
  while (t != nullptr && t->next < t->acked + options_.snapshot_window &&
         (!t->last || t->next <= *t->last)) {
    SendChunk(r, t->next++);  // drops the transfer if the store cannot be read
  }
  p.sent_ms = now_;
}

bool Replica::StartSnapshot(uint32_t r) {
  Peer& p = peers_state_[r];
  p.snapshot_ms = now_;
  std::shared_ptr<Shard::Image> image;
  for (const auto& other : transfers_) {
    if (other != nullptr && other->term == term_ && other->index == applied_index_) {
      image = other->image;  // the same entry's image: one copy for both
      break;
    }
  }
  if (image == nullptr) {
    auto made = shard_->MakeImage();
    if (!made.ok()) {
      spdlog::error(
          "shard {}: no snapshot for replica {} (it stays behind; tried again in {} ms): {}",
          shard_options_.shard, r, options_.snapshot_every_ms, made.status().ToString());
      return false;
    }
    image = std::make_shared<Shard::Image>(std::move(*made));
  }
  auto t = std::make_unique<Transfer>();
  t->id = RandomBootId();
  t->term = term_;
  t->index = applied_index_;
  t->index_term = TermAt(applied_index_);
  t->commit = commit_index_;
  t->image = image;
  uint64_t bytes = 0;
  for (const TableSnapshot& ts : image->snapshot.tables) {
    if (ts.spec.kind == TableKind::kSparse) {
      const std::vector<uint8_t>& tier = image->tiers.at(ts.table_id);
      t->arrays.push_back({tier.data(), tier.size()});
      t->sparse_ids.push_back(ts.table_id);
      t->sparse_record.push_back(ps::RowLayout::For(ts.spec).bytes());
    } else {
      t->arrays.push_back(
          {reinterpret_cast<const uint8_t*>(ts.values.data()), ts.values.size() * sizeof(float)});
      for (const auto& s : ts.slots)
        t->arrays.push_back({reinterpret_cast<const uint8_t*>(s.data()), s.size() * sizeof(float)});
    }
  }
  for (const auto& a : t->arrays) bytes += a.bytes;
  t->starts[1] = t->Normalize({});
  if (t->parts() == 0) t->last = 0;  // no tables: the header is everything
  t->progress_ms = now_;
  t->ack_ms = now_;
  spdlog::info(
      "shard {}: replica {} catches up from a snapshot at entry {} (term {}): {} KiB of "
      "arrays and the rows of {} sparse table(s), in chunks of at most {} KiB",
      shard_options_.shard, r, t->index, term_, (bytes + 1023) >> 10, t->sparse_ids.size(),
      options_.snapshot_chunk_bytes >> 10);
  p.sent_ms = now_;
  p.next_index = applied_index_ + 1;  // the log after the snapshot follows its installation
  transfers_[r] = std::move(t);
  return true;
}

void Replica::SendChunk(uint32_t r, uint32_t chunk) {
  Transfer& t = *transfers_[r];
  ReplSnapshotMsg m;
  m.term = term_;
  m.primary = options_.replica;
  m.index = t.index;
  m.index_term = t.index_term;
  m.commit = t.commit;
  m.shard = shard_options_.shard;
  m.num_shards = shard_options_.num_shards;
  m.transfer = t.id;
  m.chunk = chunk;
  std::vector<Frame> frames;
  if (chunk == 0) {
    const ShardSnapshot& snap = t.image->snapshot;
    m.min_clock = snap.min_clock;
    for (const WorkerClock& w : snap.workers) m.workers.push_back(ToWire(w));
    m.coverage = snap.coverage;
    for (const TableSnapshot& ts : snap.tables) {
      const uint64_t tier =
          ts.spec.kind == TableKind::kSparse ? t.image->tiers.at(ts.table_id).size() : 0;
      m.tables.push_back({ts.table_id, EncodeTableSpec(ts.spec), ts.row_begin, ts.row_end, ts.cols,
                          static_cast<uint32_t>(ts.slots.size()), ts.optimizer_steps, tier,
                          ts.pending_clocks});
    }
    m.last = t.last && *t.last == 0;
  } else {
    auto start = t.starts.find(chunk);
    LEASH_CHECK(start != t.starts.end());  // chunks are sent in order from the acknowledged one
    const Transfer::Pos pos = start->second;
    Transfer::Pos end;
    LEASH_CHECK(pos.part < t.parts());
    m.part_id = static_cast<uint32_t>(pos.part);
    m.offset = pos.offset;
    if (pos.part < t.arrays.size()) {
      // Bytes of an array: a frame sharing the image's memory, no copy.
      const Transfer::Array& a = t.arrays[pos.part];
      const uint64_t n = std::min<uint64_t>(options_.snapshot_chunk_bytes, a.bytes - pos.offset);
      m.part = ReplSnapshotMsg::kBytes;
      frames.push_back(Frame::Wrap(a.data + pos.offset, n, t.image));
      end = t.Normalize({pos.part, pos.offset + n});
    } else {
      // Sparse rows from the image's view of the store: keys, then their records.
      const size_t k = pos.part - t.arrays.size();
      const uint32_t table = t.sparse_ids[k];
      const size_t rb = t.sparse_record[k];
      const size_t limit = std::max<size_t>(1, options_.snapshot_chunk_bytes / (8 + rb));
      std::vector<uint64_t> keys;
      std::vector<uint8_t> records;
      uint64_t cursor = pos.offset;
      bool wrapped = false;
      Status st = t.image->rows->Scan(
          table, &cursor, limit, rb,
          [&](uint64_t key, const uint8_t* record) {
            keys.push_back(key);
            records.insert(records.end(), record, record + rb);
          },
          &wrapped);
      if (!st.ok()) {
        spdlog::error("shard {}: snapshot transfer to replica {} stopped: {}", shard_options_.shard,
                      r, st.ToString());
        transfers_[r].reset();  // a new one starts later
        return;
      }
      std::vector<uint8_t> bytes(keys.size() * 8 + records.size());
      if (!keys.empty()) {
        std::memcpy(bytes.data(), keys.data(), keys.size() * 8);
        std::memcpy(bytes.data() + keys.size() * 8, records.data(), records.size());
      }
      m.part = ReplSnapshotMsg::kRows;
      m.part_id = table;
      frames.push_back(Frame::Own(std::move(bytes)));
      end = wrapped ? Transfer::Pos{pos.part + 1, 0} : Transfer::Pos{pos.part, cursor};
    }
    t.starts[chunk + 1] = end;
    if (end.part >= t.parts()) t.last = chunk;
    m.last = t.last && *t.last == chunk;
    t.bytes_sent += frames.back().size();
  }
  t.sent_upto = std::max(t.sent_upto, chunk + 1);
  (void)peers_->Send(static_cast<int>(r), EncodeReplication(std::move(m), std::move(frames)));
}

void Replica::OnSnapshotAck(const ReplAckMsg& m) {
  std::unique_ptr<Transfer>& t = transfers_[m.replica];
  if (t == nullptr || t->id != m.transfer) return;  // one that ended
  t->ack_ms = now_;
  if (!m.ok) {
    if (t->acked == 0) return SendSnapshot(m.replica);  // the header was lost: sent again
    // It no longer holds what it acknowledged (it dropped the transfer): start again.
    spdlog::info("shard {}: replica {} lost snapshot transfer {}; starting again",
                 shard_options_.shard, m.replica, t->id);
    t.reset();  // a new one starts snapshot_every_ms after this one did
    return SendSnapshot(m.replica);
  }
  if (m.chunk > t->acked) {
    t->acked = std::min(m.chunk, t->sent_upto);
    t->progress_ms = now_;
    t->starts.erase(t->starts.begin(), t->starts.lower_bound(t->acked));
    t->next = std::max(t->next, t->acked);
  }
  SendSnapshot(m.replica);
}

void Replica::OnAck(const ReplAckMsg& m) {
  if (m.replica >= options_.replicas || m.replica == options_.replica) return;
  if (m.term > term_) return StepDown(m.term, "a backup knows a newer term");
  if (role_ != ReplicaRole::kPrimary || m.term < term_) return;  // stale
  Peer& p = peers_state_[m.replica];
  if (p.retired_boots.count(m.boot_id) > 0) return;  // from before the replica restarted
  if (m.boot_id != p.boot_id) {
    // The replica restarted (or is new): what it held before is gone.
    if (p.boot_id != 0) {
      p.retired_boots.insert(p.boot_id);
      // Frames its old process read in place in this replica's ring died with it, unreturned:
      // a new segment, so that the ring's room is whole again.
      if (ClientSharedMemory* shm = peers_->shared_memory();
          shm != nullptr && shm->ActiveWith(m.replica)) {
        shm->RenewLink(m.replica);
        spdlog::info(
            "shard {}: replica {} restarted; its shared-memory link renewed (a new segment: "
            "room its old process held is given up)",
            shard_options_.shard, m.replica);
      }
    }
    p.boot_id = m.boot_id;
    p.match_index = 0;
    p.next_index = std::min(p.next_index, last_index() + 1);
    transfers_[m.replica].reset();  // what it had received is gone too
  }
  p.last_ack_ms = now_;
  if (m.transfer != 0) return OnSnapshotAck(m);
  if (m.ok && !m.answered.empty()) {
    // The backup sent these entries' workers their replies itself: this replica's go.
    std::erase_if(held_, [&](const Held& h) {
      const bool left = h.own && std::binary_search(m.answered.begin(), m.answered.end(), h.index);
      if (left) replies_left_to_backup_ += h.replies;
      return left;
    });
  }
  if (m.ok) {
    if (transfers_[m.replica] != nullptr && m.last_index >= transfers_[m.replica]->index) {
      const Transfer& t = *transfers_[m.replica];
      spdlog::info("shard {}: replica {} installed the snapshot at entry {} ({} chunks, {} KiB)",
                   shard_options_.shard, m.replica, t.index, t.sent_upto,
                   (t.bytes_sent + 1023) >> 10);
      transfers_[m.replica].reset();  // installed: the log from there follows
    }
    if (m.last_index > p.match_index) {
      p.match_index = std::min(m.last_index, last_index());
      p.progress_ms = now_;
    }
    if (p.match_index == last_index()) {
      p.progress_ms = now_;
      // A backup that caught up joins the in-sync set now: under a steady stream of
      // requests the log may have grown again by the next Tick.
      if (!std::binary_search(in_sync_.begin(), in_sync_.end(), m.replica)) UpdateInSync();
      if (role_ != ReplicaRole::kPrimary) return;
    }
    p.next_index = std::max(p.next_index, p.match_index + 1);
    if (p.next_index <= last_index()) SendAppend(m.replica);
    return;
  }
  if (m.needs_snapshot || m.last_index > last_index()) return SendSnapshot(m.replica);
  p.next_index = std::max(m.last_index, p.match_index) + 1;
  SendAppend(m.replica);
}

bool Replica::UpdateInSync() {
  std::vector<uint32_t> want;
  want.push_back(options_.replica);
  for (uint32_t r = 0; r < options_.replicas; ++r) {
    if (r == options_.replica) continue;
    const Peer& p = peers_state_[r];
    const bool member = std::binary_search(in_sync_.begin(), in_sync_.end(), r);
    if (member) {
      // Stays while it holds the whole log or moved forward lately.
      if (p.match_index >= last_index() || now_ - p.progress_ms <= options_.backup_timeout_ms)
        want.push_back(r);
    } else if (p.boot_id != 0 && p.match_index >= last_index() && last_index() > 0 &&
               p.match_index >= commit_index_) {
      want.push_back(r);  // caught up: from now on it holds every acknowledged entry
    }
  }
  std::sort(want.begin(), want.end());
  if (want == in_sync_) return true;
  if (now_ < next_in_sync_try_ms_) return false;
  Status st = coordinator_->SetInSync(term_, want);
  if (!st.ok()) {
    if (st.code() == StatusCode::kFailedPrecondition) {
      StepDown(term_, "the coordinator says this term is over");
      return false;
    }
    // Unreachable coordinator: the set cannot shrink, so nothing is acknowledged without
    // the backups it names; tried again shortly, said once in a while.
    next_in_sync_try_ms_ = now_ + options_.campaign_ms;
    if (in_sync_warned_ms_ < 0 || now_ - in_sync_warned_ms_ >= 10000) {
      spdlog::warn("shard {}: in-sync set not updated (acknowledgements wait for it): {}",
                   shard_options_.shard, st.ToString());
      in_sync_warned_ms_ = now_;
    }
    return false;
  }
  for (uint32_t r : want) {
    if (!std::binary_search(in_sync_.begin(), in_sync_.end(), r))
      spdlog::info("shard {}: replica {} is in sync (term {})", shard_options_.shard, r, term_);
  }
  for (uint32_t r : in_sync_) {
    if (!std::binary_search(want.begin(), want.end(), r)) {
      spdlog::warn("shard {}: replica {} fell behind (holds {} of {}); acknowledging without it",
                   shard_options_.shard, r, peers_state_[r].match_index, last_index());
    }
  }
  in_sync_ = std::move(want);
  return true;
}

void Replica::AdvanceCommit() {
  if (role_ != ReplicaRole::kPrimary) return;
  // Who fences a primary that may have been deposed: with backups in the in-sync set,
  // they do (a new primary comes from that set and refuses this term, so nothing commits
  // without it); alone in the set, only its lease does, so it acknowledges nothing while
  // the lease may have expired. Training goes on with backups while the coordinator is
  // down.
  if (in_sync_.size() == 1 && !coordinator_->LeaseValid()) return;
  uint64_t c = last_index();
  for (uint32_t r : in_sync_)
    if (r != options_.replica) c = std::min(c, peers_state_[r].match_index);
  if (c < term_start_index_ || c <= commit_index_) return;
  commit_index_ = c;
}

void Replica::Release(std::vector<Outgoing>* out) {
  if (held_.empty() || held_.front().index > commit_index_) return;
  // With fsync, what this primary wrote is on its disk before any reply goes (one
  // fdatasync for every entry written since the last).
  if (durable_ != nullptr && !durable_broken_) {
    if (Status st = durable_->MakeDurable(); !st.ok()) return BreakDurable(st);
  }
  while (!held_.empty() && held_.front().index <= commit_index_) {
    out->push_back(std::move(held_.front().reply));
    held_.pop_front();
  }
}

void Replica::Compact() {
  // Keep the log within its bounds: drop applied (and, on a primary, committed) entries.
  const uint64_t keep_after = std::min(applied_index_, commit_index_);
  // Entries whose frames lie in place in the primary's shared-memory ring (Frame::lent) hold
  // its room: once applied they go, with every applied entry before them. This replica, as
  // a later primary, then sends a lagging one a snapshot where it would have sent those.
  const uint64_t lent_upto = std::min(keep_after, lent_through_);
  while ((log_.size() > options_.max_log_entries || log_bytes_ > options_.max_log_bytes ||
          base_index_ < lent_upto) &&
         base_index_ < keep_after) {
    base_term_ = log_.front().term;
    base_index_ = log_.front().index;
    log_bytes_ -= EntryBytes(log_.front());
    log_.pop_front();
  }
}

void Replica::BecomePrimary(uint64_t term) {
  term_ = term;
  in_sync_ = {options_.replica};
  if (directory_ != nullptr) {
    if (auto view = directory_->View(); view.ok() && shard_options_.shard < view->shards.size()) {
      const ShardView& s = view->shards[shard_options_.shard];
      for (uint32_t r : s.in_sync) {
        if (r == options_.replica || r >= options_.replicas) continue;
        // A member whose lease is gone (the primary just lost, a dead or cut-off backup)
        // cannot acknowledge: kept, it would hold every commit for backup_timeout_ms
        // before being removed. Leaving it out only takes away its right to lead.
        const bool live = std::any_of(s.live.begin(), s.live.end(),
                                      [r](const ReplicaAddress& a) { return a.replica == r; });
        if (live) in_sync_.push_back(r);
      }
      std::sort(in_sync_.begin(), in_sync_.end());
    }
  }
  // The set is written at once: from now on only its members may follow this primary.
  if (Status st = coordinator_->SetInSync(term_, in_sync_); !st.ok()) {
    // It holds the primary key of this term (workers are sent here), so unless the term is
    // over it must try again: nobody else can lead while the key lives.
    const bool over = st.code() == StatusCode::kFailedPrecondition;
    spdlog::warn("shard {}: replica {} won term {} but could not set the in-sync set ({}): {}",
                 shard_options_.shard, options_.replica, term_,
                 over ? "the term is over" : "trying again", st.ToString());
    if (over) {
      won_term_.reset();
    } else {
      won_term_ = term;
    }
    return;
  }
  won_term_.reset();
  role_ = ReplicaRole::kPrimary;
  primary_ = options_.replica;
  ++terms_led_;
  // Its log becomes the shard's: what it holds past the commit index is applied now (the
  // workers' resends of those requests find them applied: exactly once).
  ApplyCommitted();
  while (applied_index_ < last_index()) {
    scratch_.clear();
    Apply(EntryAt(applied_index_ + 1), &scratch_);
    ++applied_index_;
  }
  scratch_.clear();
  SetShardNow(std::max(now_, shard_now_));
  shard_->RenewLeases();  // the heartbeats went to the old primary
  for (auto& t : transfers_) t.reset();
  for (Peer& p : peers_state_) {
    p.next_index = last_index() + 1;
    p.match_index = 0;
    p.progress_ms = now_;
    p.sent_ms = -1;
  }
  spdlog::info("shard {}: replica {} leads in term {} from entry {} (commit {}), in sync: {}",
               shard_options_.shard, options_.replica, term_, last_index(), commit_index_,
               in_sync_.size());
  // The term's first entry: nothing commits before every in-sync backup holds it, so they
  // all hold this primary's log (their divergent, unapplied tails truncated) first.
  term_start_index_ = last_index() + 1;
  Log(ReplEntryWire::kNoop, {}, 0, {});
  if (role_observer_) role_observer_(role_, term_);
}

void Replica::StepDown(uint64_t term, const char* why) {
  const bool was_primary = role_ == ReplicaRole::kPrimary;
  term_ = std::max(term_, term);
  role_ = ReplicaRole::kBackup;
  if (staging_ != nullptr && staging_->term < term_) AbandonStaging(why);
  if (!was_primary) return;
  for (auto& t : transfers_) t.reset();
  spdlog::warn("shard {}: replica {} stops leading (term {}): {}; {} replies not sent",
               shard_options_.shard, options_.replica, term_, why, held_.size());
  held_.clear();  // never acknowledged: the workers send them again to the new primary
  primary_.reset();
  caught_up_ = false;
  // It applied entries the new primary may lack: its state must come from a snapshot.
  if (applied_index_ > commit_index_) needs_snapshot_ = true;
  (void)Persist();  // that it may not lead now is on disk before anything else happens
  if (role_observer_) role_observer_(role_, term_);
}

void Replica::Resign() { GiveUpTerm("stopping"); }

void Replica::GiveUpTerm(const char* why) {
  if (role_ != ReplicaRole::kPrimary) return;
  const uint64_t term = term_;
  StepDown(term, why);
  if (Status st = coordinator_->Resign(term); !st.ok()) {
    spdlog::warn(
        "shard {}: replica {} could not give up term {} in the coordinator ({}); a backup takes "
        "over when this replica's lease expires",
        shard_options_.shard, options_.replica, term, st.ToString());
    return;
  }
  spdlog::info("shard {}: replica {} resigned as primary of term {}; {}", shard_options_.shard,
               options_.replica, term,
               options_.replicas > 1 ? "a backup takes over"
                                     : "a group of one: it serves again when started");
}

// ---- stopping and starting again --------------------------------------------------------

bool Replica::CouldLead() const {
  // It may lead again only as it may now: a primary, or a backup that has held everything
  // its primary committed (not one whose state is being replaced or must be).
  const bool could_lead = role_ == ReplicaRole::kPrimary || (caught_up_ && !needs_snapshot_);
  return could_lead && has_state() && staging_ == nullptr && applied_index_ >= base_index_;
}

Message Replica::LogSince(uint64_t from) const {
  ReplAppendMsg m;
  m.term = term_;
  m.primary = options_.replica;  // whose log it is
  m.prev_index = from - 1;
  m.prev_term = TermAt(from - 1);
  m.commit = commit_index_;
  for (uint64_t i = from; i <= last_index(); ++i) m.entries.push_back(EntryAt(i));
  return EncodeReplication(m);
}

std::string Replica::StopRecord() const {
  if (!CouldLead()) return {};
  return EncodeStopRecord(LogSince(applied_index_ + 1));
}

// ---- the durable log ----------------------------------------------------------------------

uint64_t Replica::durable_records() const {
  return durable_ == nullptr ? 0 : durable_->records_written();
}
uint64_t Replica::durable_bytes() const {
  return durable_ == nullptr ? 0 : durable_->bytes_written();
}
uint64_t Replica::durable_syncs() const { return durable_ == nullptr ? 0 : durable_->syncs(); }
double Replica::durable_sync_seconds() const {
  return durable_ == nullptr ? 0 : durable_->sync_seconds();
}

void Replica::MarkPersisted(bool could_lead) {
  persisted_last_ = last_index();
  dirty_from_ = UINT64_MAX;
  persisted_term_ = term_;
  persisted_could_lead_ = could_lead;
}

bool Replica::Persist() {
  if (durable_ == nullptr) return true;
  if (durable_broken_) return false;
  const bool could_lead = CouldLead();
  // From the first entry the file does not hold as the log now has it.
  const uint64_t from = std::max(std::min(dirty_from_, persisted_last_ + 1), base_index_ + 1);
  if (from > last_index() && term_ == persisted_term_ && could_lead == persisted_could_lead_)
    return true;
  if (Status st = durable_->Append(could_lead, LogSince(from)); !st.ok()) {
    BreakDurable(st);
    return false;
  }
  MarkPersisted(could_lead);
  return true;
}

void Replica::BreakDurable(const Status& st) {
  if (durable_broken_) return;
  durable_broken_ = true;
  durable_->Abort();
  spdlog::error(
      "shard {}: replica {}'s durable log in {} failed: {}. It acknowledges nothing more and "
      "will not lead; the other replicas go on without it. Free the disk (or fix the "
      "directory) and restart it: it starts empty and is caught up.",
      shard_options_.shard, options_.replica, durable_->dir(), st.ToString());
  GiveUpTerm("its durable log failed");
}

Result<bool> Replica::Restore() {
  if (!options_.durable_log_dir.empty() && durable_ == nullptr) {
    LEASH_ASSIGN_OR_RETURN(
        durable_, DurableLog::Open(options_.durable_log_dir, options_.durable_log_fsync
                                                                 ? DurableLog::Sync::kFsync
                                                                 : DurableLog::Sync::kWrite));
  }
  LEASH_ASSIGN_OR_RETURN(bool clean, RestoreAfterCleanStop());
  if (clean || durable_ == nullptr) return clean;  // its snapshot began a durable log file
  LEASH_ASSIGN_OR_RETURN(bool logged, RestoreFromDurableLog());
  if (logged) return true;
  // Empty: a file for the empty state (the first snapshot follows with its own).
  LEASH_RETURN_IF_ERROR(durable_->Begin({}, CouldLead(), LogSince(last_index() + 1)));
  LEASH_RETURN_IF_ERROR(durable_->Commit());
  MarkPersisted(CouldLead());
  return false;
}

Result<bool> Replica::RestoreFromDurableLog() {
  const uint32_t shard = shard_options_.shard;
  LEASH_RETURN_IF_ERROR(shard_->Recover().status());  // the store's snapshot, if any
  const auto [sequence, unix_ms] = shard_->snapshot_id();
  auto start_empty = [&](const std::string& why) -> Result<bool> {
    if (options_.replicas == 1) return KeepSnapshotAlone(why);
    spdlog::warn(
        "shard {}: replica {} does not use its durable log in {}: {}; it starts empty and "
        "catches up from the primary",
        shard, options_.replica, durable_->dir(), why);
    ResetShard();
    return false;
  };
  Result<std::vector<DurableLogRecord>> records = durable_->Read({sequence, unix_ms});
  if (!records.ok()) {
    if (records.status().code() == StatusCode::kNotFound && sequence == 0) {
      ResetShard();
      return false;  // a first start
    }
    if (records.status().code() == StatusCode::kNotFound && options_.replicas == 1) {
      LEASH_ASSIGN_OR_RETURN(bool logged_before, GroupRemembered(0));
      if (!logged_before) {
        // An unreplicated shard's first start with --durable-log: its snapshots are all
        // there is, and its log begins now.
        spdlog::info(
            "shard {}: no durable log in {} yet; the shard starts from its snapshot #{} and "
            "logs every update from here",
            shard, durable_->dir(), sequence);
        LEASH_RETURN_IF_ERROR(TakeLogBack(0, 0, 0, 0, {}, "snapshot"));
        return true;
      }
    }
    return start_empty(records.status().message());
  }
  // The records replayed: the first is where the snapshot stands, each later one the log
  // from its prev_index on as it then was.
  uint64_t term = 0, base = 0, base_term = 0, commit = 0;
  bool could_lead = false;
  std::deque<ReplEntryWire> log;
  for (size_t i = 0; i < records->size(); ++i) {
    auto decoded = DecodeReplication((*records)[i].append, shard_options_.limits);
    const std::string which = "record " + std::to_string(i);
    if (!decoded.ok()) return start_empty(which + ": " + decoded.status().message());
    auto* m = std::get_if<ReplAppendMsg>(&decoded->value);
    if (m == nullptr || m->primary != options_.replica) {
      return start_empty(which + " is not this replica's log");
    }
    if (i == 0) {
      base = m->prev_index;
      base_term = m->prev_term;
    } else if (m->prev_index < base || m->prev_index > base + log.size()) {
      return start_empty(which + " does not continue the log before it");
    }
    log.resize(static_cast<size_t>(m->prev_index - base));
    for (size_t k = 0; k < m->entries.size(); ++k) {
      if (m->entries[k].index != m->prev_index + 1 + k || m->entries[k].term > m->term)
        return start_empty(which + " holds entries out of order");
      log.push_back(std::move(m->entries[k]));
    }
    term = std::max(term, m->term);
    commit = std::max(commit, m->commit);
    could_lead = (*records)[i].could_lead;
  }
  if (records->empty()) return start_empty("its file is empty");
  if (!could_lead) {
    return start_empty("it could not lead when it stopped (it was being caught up)");
  }
  LEASH_ASSIGN_OR_RETURN(bool remembered, GroupRemembered(term));
  if (!remembered && options_.replicas == 1) {
    return KeepSnapshotAlone("its group file does not remember the log's term " +
                             std::to_string(term));
  }
  if (!remembered) {
    spdlog::info(
        "shard {}: replica {} does not use its durable log (term {}): the coordinator does not "
        "remember the group (a new etcd or a new job); it starts empty",
        shard, options_.replica, term);
    ResetShard();
    return false;
  }
  // A snapshot at once, which begins a new file from here.
  LEASH_RETURN_IF_ERROR(TakeLogBack(term, base, base_term, commit, std::move(log), "durable log"));
  spdlog::info(
      "shard {}: replica {} starts again from its durable log: term {}, state at entry {}, {} "
      "entries of log past it, commit {} ({} records replayed); it may lead if the in-sync set "
      "lists it",
      shard, options_.replica, term_, applied_index_, log_.size(), commit_index_, records->size());
  return true;
}

Result<bool> Replica::KeepSnapshotAlone(const std::string& why) {
  // A group of one has nobody to catch it up: starting empty would throw its snapshot away.
  // It keeps the snapshot's state, as an unreplicated shard without the log would, loses
  // what was acknowledged after it, and says so.
  spdlog::warn(
      "shard {}: the durable log in {} cannot be used ({}); the shard starts from its "
      "snapshot #{} alone, and updates acknowledged after that snapshot are lost",
      shard_options_.shard, durable_->dir(), why, shard_->snapshot_id().first);
  LEASH_RETURN_IF_ERROR(TakeLogBack(0, 0, 0, 0, {}, "snapshot"));
  return true;
}

Status Replica::TakeLogBack(uint64_t term, uint64_t base, uint64_t base_term, uint64_t commit,
                            std::deque<ReplEntryWire> log, const char* from) {
  term_ = term;
  base_index_ = applied_index_ = base;
  base_term_ = base_term;
  commit_index_ = std::min<uint64_t>(commit, base + log.size());
  log_ = std::move(log);
  log_bytes_ = 0;
  for (const ReplEntryWire& e : log_) log_bytes_ += EntryBytes(e);
  caught_up_ = true;
  needs_snapshot_ = false;
  role_ = ReplicaRole::kBackup;
  primary_.reset();
  SetShardNow(now_);
  ApplyCommitted();
  if (Result<int64_t> c = shard_->Checkpoint(); !c.ok()) {
    return c.status().WithContext("replica " + std::to_string(options_.replica) + " of shard " +
                                  std::to_string(shard_options_.shard) + " restored its " + from);
  }
  return Status::Ok();
}

Result<bool> Replica::GroupRemembered(uint64_t term) {
  // A log means something only to a coordinator that remembers this group: its in-sync set,
  // and terms that only grow. A new etcd (compose `down` and `up`, a new job) knows neither:
  // the replica then starts empty, as the others do, in a new job.
  if (directory_ == nullptr) return true;
  const uint32_t shard = shard_options_.shard;
  Result<ClusterView> view = directory_->WaitForChange(0, std::chrono::seconds(10));
  if (!view.ok() && view.status().code() != StatusCode::kNotFound) {
    return view.status().WithContext("replica " + std::to_string(options_.replica) + " of shard " +
                                     std::to_string(shard) +
                                     " checking the coordinator before using its log");
  }
  const ShardView* sv = view.ok() && shard < view->shards.size() ? &view->shards[shard] : nullptr;
  return sv != nullptr && (sv->primary ? sv->term >= term : !sv->in_sync.empty());
}

Result<bool> Replica::RestoreAfterCleanStop() {
  const uint32_t shard = shard_options_.shard;
  Result<std::string> stored = store_->LoadReplicaStop();
  if (!stored.ok()) {
    spdlog::warn(
        "shard {}: replica {} cannot read its stop record in {} ({}); it starts empty "
        "and catches up from the primary",
        shard, options_.replica, store_->Describe(), stored.status().ToString());
    return false;
  }
  if (stored->empty()) return false;
  const std::string& record = *stored;
  auto unusable = [&](const std::string& why) -> Result<bool> {
    spdlog::warn(
        "shard {}: replica {} does not use the stop record in {}: {}; it starts empty "
        "and catches up from the primary",
        shard, options_.replica, store_->Describe(), why);
    return false;
  };
  Result<Message> frames = DecodeStopRecord(record);
  if (!frames.ok()) return unusable(frames.status().message());
  auto decoded = DecodeReplication(*frames, shard_options_.limits);
  if (!decoded.ok()) return unusable(decoded.status().message());
  auto* m = std::get_if<ReplAppendMsg>(&decoded->value);
  if (m == nullptr) return unusable("it is not a log");
  if (m->primary != options_.replica) {
    return unusable("it is replica " + std::to_string(m->primary) + "'s, not this one's");
  }
  for (size_t i = 0; i < m->entries.size(); ++i) {
    if (m->entries[i].index != m->prev_index + 1 + i || m->entries[i].term > m->term)
      return unusable("its entries are out of order");
  }
  {
    LEASH_ASSIGN_OR_RETURN(bool remembered, GroupRemembered(m->term));
    if (!remembered) {
      spdlog::info(
          "shard {}: replica {} does not use its stop record (term {}): the "
          "coordinator does not remember the group (a new etcd or a new job); it "
          "starts empty",
          shard, options_.replica, m->term);
      return false;
    }
  }
  LEASH_RETURN_IF_ERROR(shard_->Recover().status());
  if (shard_->recovered_replica_stop() != record) {
    // Not the snapshot the record was read from: the store changed in between. Start empty.
    ResetShard();
    return unusable("the snapshot changed while it was read");
  }
  // The record is used up: the snapshot TakeLogBack writes without it goes in its place
  // before anything else happens, so that a later crash does not bring this log back.
  LEASH_RETURN_IF_ERROR(TakeLogBack(
      m->term, m->prev_index, m->prev_term, m->commit,
      {std::make_move_iterator(m->entries.begin()), std::make_move_iterator(m->entries.end())},
      "clean stop"));
  spdlog::info(
      "shard {}: replica {} starts where it stopped cleanly: term {}, state at entry {}, {} "
      "entries of log past it, commit {}; it may lead if the in-sync set lists it",
      shard, options_.replica, term_, applied_index_, log_.size(), commit_index_);
  return true;
}

// ---- backups ----------------------------------------------------------------------------

void Replica::OnReplication(const PeerId& /*peer*/, const Message& message,
                            std::vector<Outgoing>* out) {
  auto decoded = DecodeReplication(message, shard_options_.limits);
  if (!decoded.ok()) {
    spdlog::warn("shard {}: replica {} ignored a malformed replication message: {}",
                 shard_options_.shard, options_.replica, decoded.status().ToString());
    return;
  }
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, ReplAppendMsg>) OnAppend(m, out);
        if constexpr (std::is_same_v<T, ReplAckMsg>) OnAck(m);
        if constexpr (std::is_same_v<T, ReplSnapshotMsg>) OnSnapshot(m, decoded->payloads);
      },
      decoded->value);
}

void Replica::SendAck(bool ok, uint64_t last, std::vector<uint64_t> answered) {
  if (!primary_) return;
  // What it acknowledges is on disk first (with a durable log); if that fails, nothing is.
  if (!Persist()) return;
  if (durable_ != nullptr) {
    if (Status st = durable_->MakeDurable(); !st.ok()) return BreakDurable(st);
  }
  ReplAckMsg a{term_, options_.replica, ok, last, needs_snapshot_, boot_id_, 0, 0};
  a.answered = std::move(answered);
  (void)peers_->Send(static_cast<int>(*primary_), EncodeReplication(a));
}

void Replica::OnAppend(const ReplAppendMsg& m, std::vector<Outgoing>* out) {
  if (m.primary >= options_.replicas || m.primary == options_.replica) return;
  if (m.term < term_) {
    // Fencing: a deposed primary gathers no acknowledgements.
    ReplAckMsg a{term_, options_.replica, false, 0, false, boot_id_, 0, 0};
    (void)peers_->Send(static_cast<int>(m.primary), EncodeReplication(a));
    return;
  }
  if (m.term > term_ || role_ == ReplicaRole::kPrimary) StepDown(m.term, "a newer primary");
  primary_ = m.primary;
  if (needs_snapshot_) return SendAck(false, applied_index_);
  // The primary's log must hold ours up to prev_index. Below our snapshot base only the
  // base entry's term can be checked (same index and term: the same log up to it).
  uint64_t from = m.prev_index;  // entries[i] has index from + 1 + i
  if (m.prev_index < base_index_) {
    const uint64_t reach = m.prev_index + m.entries.size();
    if (reach < base_index_) return SendAck(false, base_index_);
    if (m.entries[base_index_ - m.prev_index - 1].term != base_term_) {
      needs_snapshot_ = true;  // our applied state is off its log
      return SendAck(false, applied_index_);
    }
  } else if (m.prev_index > last_index()) {
    return SendAck(false, last_index());
  } else if (TermAt(m.prev_index) != m.prev_term) {
    if (m.prev_index <= applied_index_) {
      needs_snapshot_ = true;
      return SendAck(false, applied_index_);
    }
    return SendAck(false, applied_index_);
  }
  for (size_t i = 0; i < m.entries.size(); ++i) {
    const ReplEntryWire& e = m.entries[i];
    const uint64_t index = from + 1 + i;
    if (e.index != index) {
      spdlog::warn("shard {}: replication append with entry {} where {} belongs; ignored",
                   shard_options_.shard, e.index, index);
      return;
    }
    if (index <= base_index_) continue;
    if (index <= last_index()) {
      if (TermAt(index) == e.term) continue;  // held already (a resend or a duplicate)
      if (index <= applied_index_) {
        needs_snapshot_ = true;
        return SendAck(false, applied_index_);
      }
      // A divergent tail no primary acknowledged: dropped (never applied).
      dirty_from_ = std::min(dirty_from_, index);
      while (last_index() >= index) {
        log_bytes_ -= EntryBytes(log_.back());
        log_.pop_back();
      }
    }
    log_bytes_ += EntryBytes(e);
    if (std::any_of(e.message.begin(), e.message.end(), [](const Frame& f) { return f.lent(); })) {
      lent_through_ = index;
      ++entries_lent_;
    }
    log_.push_back(e);
  }
  const uint64_t matched = std::max(base_index_, m.prev_index + m.entries.size());
  uint64_t commit = std::min(m.commit, matched);
  std::vector<Answer> answered;
  if (m.backup_answers && options_.backup_answers) {
    // The primary's only in-sync backup: whatever it holds of the primary's log is committed
    // (a new primary is one of the two, and both hold it; the primary's durable log, if any,
    // held it before it was sent). So it applies it now, and answers the workers of this
    // append's pushes and clocks that are connected here; the primary, told so with this
    // acknowledgement, drops its own replies to them.
    commit = matched;
    for (uint64_t i = std::max(applied_index_, from) + 1; i <= matched; ++i) {
      if (i <= base_index_) continue;
      if (std::optional<Answer> a = AnswerOf(i, EntryAt(i))) answered.push_back(std::move(*a));
    }
  }
  if (commit > commit_index_) commit_index_ = commit;
  if (matched >= m.commit) caught_up_ = true;
  // Acknowledged before the committed entries are applied: the primary waits for the
  // acknowledgement, not for this replica's copy of the update.
  std::vector<uint64_t> indices;
  indices.reserve(answered.size());
  for (const Answer& a : answered) indices.push_back(a.index);
  SendAck(true, matched, std::move(indices));
  if (durable_broken_) answered.clear();  // nothing acknowledged: the primary answers
  ApplyCommitted(out, answered);
  Compact();
}

// `next_chunk` 0: it holds nothing of that transfer (ok false); acknowledgements that
// arrive late or twice are told from that by ok.
void Replica::SendChunkAck(uint32_t primary, uint64_t transfer, uint32_t next_chunk) {
  ReplAckMsg a{term_,           options_.replica, next_chunk > 0, applied_index_,
               needs_snapshot_, boot_id_,         transfer,       next_chunk};
  (void)peers_->Send(static_cast<int>(primary), EncodeReplication(a));
}

void Replica::OnSnapshot(const ReplSnapshotMsg& m, std::span<const Frame> payloads) {
  if (m.primary >= options_.replicas || m.primary == options_.replica) return;
  if (m.term < term_) {
    ReplAckMsg a{term_, options_.replica, false, 0, false, boot_id_, 0, 0};
    (void)peers_->Send(static_cast<int>(m.primary), EncodeReplication(a));
    return;
  }
  if (m.term > term_ || role_ == ReplicaRole::kPrimary) StepDown(m.term, "a newer primary");
  primary_ = m.primary;
  if (m.shard != shard_options_.shard || m.num_shards != shard_options_.num_shards) {
    spdlog::error("shard {}/{}: replica {} was sent a snapshot of shard {}/{}; ignored",
                  shard_options_.shard, shard_options_.num_shards, options_.replica, m.shard,
                  m.num_shards);
    return;
  }
  if (staging_ == nullptr || staging_->transfer != m.transfer) {
    // Installed already (its acknowledgement was lost, or this chunk is a late duplicate),
    // or past it: a backup applies committed entries only, which every later primary holds.
    if (!needs_snapshot_ && m.index <= applied_index_ &&
        (m.index < base_index_ || TermAt(m.index) == m.index_term)) {
      return SendAck(true, m.index);
    }
    if (m.chunk != 0) return SendChunkAck(m.primary, m.transfer, 0);  // from the header, please
    if (staging_ != nullptr) AbandonStaging("a newer snapshot transfer began");
    if (!BeginStaging(m)) return;
  } else if (m.chunk != staging_->next) {
    return SendChunkAck(m.primary, m.transfer, staging_->next);  // a duplicate or a gap
  } else {
    if (Status st = StageChunk(m, payloads[0]); !st.ok()) {
      spdlog::error("shard {}: snapshot transfer {} from replica {} unusable (dropped): {}",
                    shard_options_.shard, m.transfer, m.primary, st.ToString());
      AbandonStaging("an unusable chunk");
      return SendChunkAck(m.primary, m.transfer, 0);
    }
    ++staging_->next;
  }
  if (!m.last) return SendChunkAck(m.primary, m.transfer, staging_->next);
  if (Status st = InstallStaging(); !st.ok()) {
    spdlog::error("shard {}: snapshot from replica {} not installed: {}", shard_options_.shard,
                  m.primary, st.ToString());
    const uint64_t transfer = staging_->transfer;
    AbandonStaging("it could not be installed");
    return SendChunkAck(m.primary, transfer, 0);
  }
  SendAck(true, base_index_);
}

bool Replica::BeginStaging(const ReplSnapshotMsg& m) {
  auto s = std::make_unique<Staging>();
  s->transfer = m.transfer;
  s->term = m.term;
  s->primary = m.primary;
  s->index = m.index;
  s->index_term = m.index_term;
  s->commit = m.commit;
  ShardSnapshot& snap = s->snap;
  snap.shard = shard_options_.shard;
  snap.num_shards = shard_options_.num_shards;
  snap.min_clock = m.min_clock;
  snap.sequence = m.index;
  snap.coverage = m.coverage;
  for (const auto& w : m.workers) snap.workers.push_back(FromWire(w));
  s->tiers.resize(m.tables.size());
  s->record_bytes.assign(m.tables.size(), 0);
  for (const auto& t : m.tables) {
    auto spec = DecodeTableSpec(t.spec);
    const bool dense = spec.ok() && spec->kind != TableKind::kSparse;
    if (!spec.ok() || t.table_id != snap.tables.size() || t.row_end < t.row_begin ||
        (dense && t.cols != spec->cols) || (!dense && t.slots != 0)) {
      spdlog::error("shard {}: snapshot header from replica {} unusable: table {} {}",
                    shard_options_.shard, m.primary, t.table_id,
                    spec.ok() ? "does not add up" : spec.status().ToString());
      return false;
    }
    TableSnapshot ts;
    ts.table_id = t.table_id;
    ts.spec = std::move(*spec);
    ts.row_begin = t.row_begin;
    ts.row_end = t.row_end;
    ts.cols = t.cols;
    ts.optimizer_steps = t.optimizer_steps;
    ts.pending_clocks = t.pending_clocks;
    snap.tables.push_back(std::move(ts));
  }
  // The arrays' memory, once the table list no longer moves.
  for (size_t i = 0; i < snap.tables.size(); ++i) {
    TableSnapshot& ts = snap.tables[i];
    const auto& t = m.tables[i];
    if (ts.spec.kind == TableKind::kSparse) {
      s->tiers[i].resize(t.tier_bytes);
      s->arrays.push_back({s->tiers[i].data(), t.tier_bytes});
      s->record_bytes[i] = ps::RowLayout::For(ts.spec).bytes();
      continue;
    }
    const size_t n = (t.row_end - t.row_begin) * t.cols;
    ts.values.resize(n);
    ts.slots.resize(t.slots);
    for (auto& slot : ts.slots) slot.resize(n);
    s->arrays.push_back({reinterpret_cast<uint8_t*>(ts.values.data()), n * sizeof(float)});
    for (auto& slot : ts.slots)
      s->arrays.push_back({reinterpret_cast<uint8_t*>(slot.data()), n * sizeof(float)});
  }
  // This replica's state is replaced: the old one goes now (its memory is not held twice),
  // with its sparse rows in the cold tier, which receives the snapshot's. Its own last
  // snapshot and the cold tier's checkpoints stay as they were until the new one installs.
  const size_t tables = std::max(shard_->num_tables(), snap.tables.size());
  ResetShard();
  for (size_t id = 0; id < tables; ++id) {
    if (Status st = sparse_->DropTable(static_cast<uint32_t>(id)); !st.ok()) {
      spdlog::error("shard {}: cannot clear the cold tier for a snapshot: {}", shard_options_.shard,
                    st.ToString());
      return false;
    }
  }
  state_dropped_ = true;
  needs_snapshot_ = true;
  caught_up_ = false;
  (void)Persist();
  log_.clear();
  log_bytes_ = 0;
  staging_ = std::move(s);
  spdlog::info("shard {}: replica {} receives a snapshot at entry {} from replica {} (term {})",
               shard_options_.shard, options_.replica, m.index, m.primary, m.term);
  return true;
}

Status Replica::StageChunk(const ReplSnapshotMsg& m, const Frame& frame) {
  Staging& s = *staging_;
  if (m.part == ReplSnapshotMsg::kBytes) {
    if (m.part_id >= s.arrays.size() || m.offset > s.arrays[m.part_id].bytes ||
        frame.size() > s.arrays[m.part_id].bytes - m.offset) {
      return InvalidArgument("chunk " + std::to_string(m.chunk) + " of " +
                             std::to_string(frame.size()) + " bytes at " +
                             std::to_string(m.offset) + " does not fit array " +
                             std::to_string(m.part_id));
    }
    if (frame.size() > 0)
      std::memcpy(s.arrays[m.part_id].data + m.offset, frame.data(), frame.size());
    return Status::Ok();
  }
  const size_t rb = m.part_id < s.record_bytes.size() ? s.record_bytes[m.part_id] : 0;
  if (rb == 0 || frame.size() % (8 + rb) != 0) {
    return InvalidArgument("chunk " + std::to_string(m.chunk) + " holds rows of table " +
                           std::to_string(m.part_id) + " that is not sparse, or a partial row");
  }
  const size_t n = frame.size() / (8 + rb);
  std::vector<uint64_t> keys(n);
  if (n > 0) std::memcpy(keys.data(), frame.data(), n * 8);
  s.rows += n;
  return sparse_->Write(m.part_id, keys, rb, frame.data() + n * 8, {});
}

Status Replica::InstallStaging() {
  Staging& s = *staging_;
  const bool has_sparse =
      std::any_of(s.record_bytes.begin(), s.record_bytes.end(), [](size_t b) { return b > 0; });
  // As a shard's own snapshot: the cold tier's checkpoint of that number, then the snapshot;
  // Recover puts both back as the state.
  if (has_sparse) LEASH_RETURN_IF_ERROR(sparse_->Checkpoint(s.snap.sequence));
  // The durable log starts again at the installed snapshot, which is where the log stands.
  const bool could_lead = caught_up_;
  if (durable_ != nullptr && !durable_broken_) {
    ReplAppendMsg base{term_, options_.replica, s.index, s.index_term, std::min(s.commit, s.index),
                       {}};
    if (Status st =
            durable_->Begin({s.snap.sequence, s.snap.unix_ms}, could_lead, EncodeReplication(base));
        !st.ok()) {
      BreakDurable(st);
    }
  }
  if (Status st = store_->Save(s.snap); !st.ok()) {
    if (durable_ != nullptr && !durable_broken_) durable_->Abort();
    return st;
  }
  if (durable_ != nullptr && !durable_broken_) {
    if (Status st = durable_->Commit(); !st.ok()) BreakDurable(st);
  }
  auto shard = std::make_unique<Shard>(
      shard_options_, store_, [this] { return shard_now_; }, sparse_);
  LEASH_RETURN_IF_ERROR(shard->Recover().status());
  for (size_t id = 0; id < s.tiers.size(); ++id) {
    if (s.record_bytes[id] == 0) continue;
    LEASH_RETURN_IF_ERROR(shard->ImportSparseTier(static_cast<uint32_t>(id), s.tiers[id]));
  }
  if (has_sparse) {
    if (Status st = sparse_->Prune(s.snap.sequence); !st.ok()) {
      spdlog::warn("shard {}: old sparse checkpoints not deleted: {}", shard_options_.shard,
                   st.ToString());
    }
  }
  shard_ = std::move(shard);
  AttachShard();
  log_.clear();
  log_bytes_ = 0;
  base_index_ = s.index;
  base_term_ = s.index_term;
  applied_index_ = s.index;
  commit_index_ = std::min(s.commit, s.index);
  needs_snapshot_ = false;
  state_dropped_ = false;
  ++snapshots_installed_;
  spdlog::info("shard {}: replica {} installed a snapshot at entry {} (term {}; {} sparse rows)",
               shard_options_.shard, options_.replica, s.index, s.term, s.rows);
  staging_.reset();
  if (durable_ != nullptr && !durable_broken_) MarkPersisted(could_lead);
  return Status::Ok();
}

void Replica::AbandonStaging(const std::string& why) {
  spdlog::info("shard {}: replica {} drops snapshot transfer {} at chunk {}: {}",
               shard_options_.shard, options_.replica, staging_->transfer, staging_->next, why);
  staging_.reset();
  ++snapshots_abandoned_;
}

void Replica::CheckTermAlone() {
  if (now_ < next_term_check_ms_) return;
  next_term_check_ms_ = now_ + options_.campaign_ms;
  // The same set again, fenced by the term: it fails only if the term is over.
  Status st = coordinator_->SetInSync(term_, in_sync_);
  if (st.code() != StatusCode::kFailedPrecondition) return;  // current, or no answer
  // Its lease ended (a pause, or cut off from the coordinator for the TTL) and the primary
  // key with it. Alone in the in-sync set, it held every acknowledged entry and nobody else
  // may lead: it stays eligible and campaigns for a new term, its log and applied state
  // kept (the entries past the commit index become the new term's, as at any failover).
  // Without this it would believe itself primary forever, acknowledging nothing, while the
  // directory named no primary.
  StepDown(term_, "its lease ended while it was alone in the in-sync set; campaigning again");
  caught_up_ = true;
  needs_snapshot_ = false;
  last_campaign_ms_ = -1;
}

void Replica::MaybeCampaign() {
  if (needs_snapshot_ || durable_broken_) return;
  if (last_campaign_ms_ >= 0 && now_ - last_campaign_ms_ < options_.campaign_ms) return;
  last_campaign_ms_ = now_;
  if (won_term_) return BecomePrimary(*won_term_);  // its in-sync set, written again
  if (directory_ == nullptr) return;
  auto view = directory_->View();
  if (!view.ok() || shard_options_.shard >= view->shards.size()) return;
  const ShardView& s = view->shards[shard_options_.shard];
  if (s.primary) {
    // Heard of through the directory; its appends will say the same.
    if (!primary_ || s.term > term_) primary_ = s.primary->replica;
    no_primary_since_ms_ = -1;
    return;
  }
  if (no_primary_since_ms_ < 0) no_primary_since_ms_ = now_;
  const bool listed = std::binary_search(s.in_sync.begin(), s.in_sync.end(), options_.replica);
  // A replica listed in sync that restarted lost its log: it may lead only once a primary
  // has caught it up again (or while no entry was ever acknowledged).
  if (!s.in_sync.empty() && !(listed && caught_up_)) {
    WarnCannotLead(s, listed);
    return;
  }
  auto won = coordinator_->Campaign();
  if (!won.ok()) {
    spdlog::warn("shard {}: replica {} could not campaign: {}", shard_options_.shard,
                 options_.replica, won.status().ToString());
    return;
  }
  if (*won) BecomePrimary(**won);
}

void Replica::WarnCannotLead(const ShardView& s, bool listed) {
  // Not during an ordinary failover (a member takes over within the lease TTL).
  if (now_ - no_primary_since_ms_ < 10000) return;
  if (cannot_lead_warned_ms_ >= 0 && now_ - cannot_lead_warned_ms_ < 30000) return;
  cannot_lead_warned_ms_ = now_;
  std::string members, missing;
  for (uint32_t r : s.in_sync) {
    members += (members.empty() ? "" : ", ") + std::to_string(r);
    const bool live = std::any_of(s.live.begin(), s.live.end(),
                                  [r](const ReplicaAddress& a) { return a.replica == r; });
    if (!live && r != options_.replica)
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  spdlog::warn(
      "shard {} has had no primary for {} s, and replica {} may not lead: {}. Only a replica of "
      "the in-sync "
      "set [{}] holds every acknowledged update; {}. A replica stopped cleanly (SIGTERM) starts "
      "again with its log and may lead; one that was killed has only its last snapshot. "
      "(logged every 30 s while this lasts)",
      shard_options_.shard, (now_ - no_primary_since_ms_) / 1000, options_.replica,
      listed ? "it started without the log it held (killed, not stopped cleanly)"
             : "it is not in the in-sync set",
      members,
      missing.empty()
          ? std::string("all of them run, and none that started without its log may lead (see "
                        "docs/replication.md, \"Stopping and starting again\")")
          : "waiting for replica(s) " + missing + " to start again");
}

int64_t Replica::Tick(std::vector<Outgoing>* out) {
  now_ = now_ms_();
  int64_t wait = options_.heartbeat_ms;
  if (role_ == ReplicaRole::kPrimary) {
    SetShardNow(std::max(now_, shard_now_));
    // Evictions and expiry sweeps are the primary's decisions, logged like inputs.
    for (uint64_t id : shard_->ExpiredWorkers()) Log(ReplEntryWire::kEvict, {}, id, {});
    if (shard_->ExpirySweepDue()) Log(ReplEntryWire::kExpirySweep, {}, 0, {});
    for (uint32_t r = 0; r < options_.replicas; ++r) {
      if (r == options_.replica) continue;
      Peer& p = peers_state_[r];
      // Lost appends show as a gap at the backup, which answers with where it stands; lost
      // acks are repaired by the next append. A backup silent for resend_ms is sent the
      // entries it has not acknowledged again.
      if (p.match_index < last_index() && p.next_index > p.match_index + 1 &&
          now_ - std::max(p.last_ack_ms, p.sent_ms) >= options_.resend_ms) {
        p.next_index = p.match_index + 1;
      }
      if (p.next_index <= last_index() || p.sent_ms < 0 ||
          now_ - p.sent_ms >= options_.heartbeat_ms) {
        SendAppend(r);
      }
    }
    if (role_ == ReplicaRole::kPrimary && UpdateInSync()) AdvanceCommit();
    if (role_ == ReplicaRole::kPrimary && in_sync_.size() == 1 && !coordinator_->LeaseValid())
      CheckTermAlone();
    Release(out);
    Compact();
    if (role_ == ReplicaRole::kPrimary) {
      scratch_.clear();
      wait = std::min(wait, shard_->Tick(&scratch_));  // snapshots only (replicated)
      scratch_.clear();
    }
  } else {
    MaybeCampaign();
    if (role_ != ReplicaRole::kPrimary && !state_dropped_) {
      scratch_.clear();
      shard_->Tick(&scratch_);  // this replica's own snapshots, on the log's clock
      scratch_.clear();
    }
    wait = std::min(wait, options_.campaign_ms);
  }
  // The durable log is cut by a snapshot once it holds durable_log_max_bytes, or twice the
  // state.
  if (durable_ != nullptr && !durable_broken_ && durable_->has_current() &&
      durable_->current_bytes() >
          std::max(options_.durable_log_max_bytes, 2 * durable_state_bytes_) &&
      has_state() && staging_ == nullptr && now_ >= next_durable_cut_ms_) {
    if (Result<int64_t> c = shard_->Checkpoint(); !c.ok()) {
      next_durable_cut_ms_ = now_ + 1000;
      spdlog::warn(
          "shard {}: replica {}'s durable log holds {} MiB and the snapshot that would cut it "
          "failed (tried again in 1 s): {}",
          shard_options_.shard, options_.replica, durable_->current_bytes() >> 20,
          c.status().ToString());
    }
  }
  (void)Persist();
  return std::max<int64_t>(1, wait);
}

Status ServeReplica(Replica& replica, ServerTransport& transport, const std::atomic<bool>& stop,
                    const std::function<void(const Replica&)>& after_tick) {
  std::vector<Outgoing> out;
  // As Serve: the primary's pull replies go straight into a same-host worker's shared memory.
  replica.SetPayloadAllocator([&transport](const PeerId& peer, size_t bytes) {
    return transport.ReservePayload(peer, bytes);
  });
  // Frames out of a same-host peer's ring (a worker's pushes, or the primary's log entries
  // on a backup) are copied and checked by the update threads of the shard they go to.
  if (replica.shard().update_threads() != nullptr) {
    transport.SetFrameCopier([&replica](const void* data, size_t bytes) {
      return ps::CopyCheckingFiniteShared(replica.shard().update_threads(), data, bytes);
    });
  }
  auto send = [&] {
    for (Outgoing& o : out) (void)transport.Send(o.peer, std::move(o.message));
    out.clear();
  };
  int64_t wait_ms = replica.Tick(&out);
  Status result;
  while (!stop.load(std::memory_order_relaxed)) {
    send();
    auto in = transport.Receive(std::chrono::milliseconds(std::min<int64_t>(wait_ms, 100)));
    if (!in.ok()) {
      result = in.status();
      break;
    }
    if (in->has_value()) replica.Handle((*in)->peer, (*in)->message, &out, (*in)->user);
    wait_ms = replica.Tick(&out);
    if (after_tick) after_tick(replica);
  }
  send();                             // what the last round released
  transport.SetFrameCopier(nullptr);  // the transport may outlive the replica
  // Taken before resigning, while a primary's log is still the shard's: kept with the final
  // snapshot, it lets this replica start again with its log (RestoreAfterCleanStop).
  std::string record = replica.StopRecord();
  replica.Resign();
  if (replica.has_state()) {  // not a replica midway through catching up
    auto snap = replica.mutable_shard().Checkpoint(std::move(record));
    if (!snap.ok() && result.ok()) result = snap.status();
  }
  return result;
}

}  // namespace leash::server

// A replicated shard's log, its primary and backup roles, catch-up by snapshot and
// failover (replica.h; docs/replication.md, "The log"). Not thread-safe (one loop).
#include "leash/server/replica.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <variant>

namespace leash::server {
namespace {

uint64_t RandomBootId() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32 | rd()) | 1;
}

// A float array of the snapshot as a payload frame sharing the snapshot's storage.
Frame FloatsFrame(const std::shared_ptr<ShardSnapshot>& owner, const std::vector<float>& v) {
  return Frame::Wrap(v.data(), v.size() * sizeof(float), owner);
}

Result<std::vector<float>> FrameFloats(const Frame& f, size_t count, const char* what) {
  if (f.size() != count * sizeof(float)) {
    return InvalidArgument(std::string("snapshot ") + what + " frame of " +
                           std::to_string(f.size()) + " bytes, expected " +
                           std::to_string(count * sizeof(float)));
  }
  std::vector<float> v(count);
  if (count > 0) std::memcpy(v.data(), f.data(), f.size());
  return v;
}

}  // namespace

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
      peers_state_(options.replicas) {
  LEASH_CHECK(options_.replicas > 1 && options_.replica < options_.replicas);
  shard_options_.replicated = true;
  shard_options_.replication_stats = [this](ShardStats* st) {
    st->replicas = options_.replicas;
    st->replica = options_.replica;
    st->term = term_;
    st->log_index = last_index();
    st->replication_lag = replication_lag();
    st->replicas_in_sync = static_cast<uint32_t>(in_sync_.size());
  };
  if (shard_options_.boot_id == 0) shard_options_.boot_id = RandomBootId();
  boot_id_ = RandomBootId();
  now_ = now_ms_();
  shard_now_ = now_;
  shard_ = std::make_unique<Shard>(
      shard_options_, store_, [this] { return shard_now_; }, sparse_);
}

Replica::~Replica() = default;

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

uint64_t Replica::replication_lag() const {
  if (role_ != ReplicaRole::kPrimary) return 0;
  uint64_t low = last_index();
  for (uint32_t r : in_sync_)
    if (r != options_.replica) low = std::min(low, peers_state_[r].match_index);
  return last_index() - low;
}

std::vector<BackupProgress> Replica::backups() const {
  std::vector<BackupProgress> v;
  for (uint32_t r = 0; r < options_.replicas; ++r) {
    if (r == options_.replica) continue;
    v.push_back(
        {r, std::binary_search(in_sync_.begin(), in_sync_.end(), r), peers_state_[r].match_index});
  }
  return v;
}

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

void Replica::Handle(const PeerId& peer, const Message& message, std::vector<Outgoing>* out) {
  now_ = now_ms_();
  // The header is verified once here to route the message, and again by the shard.
  const bool batch = IsBatch(message);
  const RequestPeek peek = batch ? RequestPeek{} : PeekRequest(message, shard_options_.limits);
  if (peek.kind == RequestPeek::kReplication) {
    OnReplication(peer, message);
    if (role_ == ReplicaRole::kPrimary) {
      AdvanceCommit();
      Release(out);
    }
    return;
  }
  if (role_ != ReplicaRole::kPrimary) {
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
  ReplEntryWire e;
  e.term = term_;
  e.index = last_index() + 1;
  e.now_ms = std::max(now_, shard_now_);  // the shard's clock never goes back
  e.kind = kind;
  e.peer = peer;
  e.worker_id = worker_id;
  e.message = message;  // the frames are shared, not copied
  log_bytes_ += EntryBytes(e);
  log_.push_back(std::move(e));
  scratch_.clear();
  Apply(log_.back(), &scratch_);
  applied_index_ = log_.back().index;
  for (Outgoing& o : scratch_) held_.push_back({applied_index_, std::move(o)});
  scratch_.clear();
  ReplicateAll();
}

void Replica::Apply(const ReplEntryWire& e, std::vector<Outgoing>* out) {
  SetShardNow(e.now_ms);
  switch (e.kind) {
    case ReplEntryWire::kInput:
      shard_->Handle(e.peer, e.message, out);
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

void Replica::ApplyCommitted() {
  // Backups never apply past the commit index: a new primary might not hold those entries.
  while (applied_index_ < commit_index_ && applied_index_ < last_index()) {
    scratch_.clear();
    Apply(EntryAt(applied_index_ + 1), &scratch_);
    ++applied_index_;
  }
  scratch_.clear();  // a backup answers nobody
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
  if (p.next_index <= base_index_) return SendSnapshot(r);
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
  (void)peers_->Send(static_cast<int>(r), EncodeReplication(std::move(m)));
}

void Replica::SendSnapshot(uint32_t r) {
  Peer& p = peers_state_[r];
  if (p.snapshot_ms >= 0 && now_ - p.snapshot_ms < options_.snapshot_every_ms) return;
  auto snap = std::make_shared<ShardSnapshot>(shard_->Snapshot());
  for (const TableSnapshot& t : snap->tables) {
    if (t.spec.kind == TableKind::kSparse) {
      // The cold tier is not shipped yet: such a backup catches up from the log only.
      spdlog::warn(
          "shard {}: replica {} is too far behind to catch up from the log, and a snapshot of "
          "sparse table '{}' cannot be shipped; raise the log bound or restart it while the "
          "log still holds what it lacks",
          shard_options_.shard, r, t.spec.name);
      p.snapshot_ms = now_;
      return;
    }
  }
  ReplSnapshotMsg m;
  m.term = term_;
  m.primary = options_.replica;
  m.index = applied_index_;
  m.index_term = TermAt(applied_index_);
  m.commit = commit_index_;
  m.shard = snap->shard;
  m.num_shards = snap->num_shards;
  m.min_clock = snap->min_clock;
  for (const WorkerClock& w : snap->workers)
    m.workers.push_back({w.worker_id, w.incarnation, w.clock, w.last_seq, w.name});
  m.coverage = snap->coverage;
  std::vector<Frame> frames;
  for (const TableSnapshot& t : snap->tables) {
    m.tables.push_back({t.table_id, EncodeTableSpec(t.spec), t.row_begin, t.row_end, t.cols,
                        static_cast<uint32_t>(t.slots.size()), t.optimizer_steps});
    frames.push_back(FloatsFrame(snap, t.values));
    for (const auto& s : t.slots) frames.push_back(FloatsFrame(snap, s));
  }
  spdlog::info("shard {}: replica {} catches up from a snapshot at entry {} (term {})",
               shard_options_.shard, r, m.index, term_);
  p.snapshot_ms = now_;
  p.sent_ms = now_;
  p.next_index = applied_index_ + 1;
  (void)peers_->Send(static_cast<int>(r), EncodeReplication(std::move(m), std::move(frames)));
}

void Replica::OnAck(const ReplAckMsg& m) {
  if (m.replica >= options_.replicas || m.replica == options_.replica) return;
  if (m.term > term_) return StepDown(m.term, "a backup knows a newer term");
  if (role_ != ReplicaRole::kPrimary || m.term < term_) return;  // stale
  Peer& p = peers_state_[m.replica];
  if (p.retired_boots.count(m.boot_id) > 0) return;  // from before the replica restarted
  if (m.boot_id != p.boot_id) {
    // The replica restarted (or is new): what it held before is gone.
    if (p.boot_id != 0) p.retired_boots.insert(p.boot_id);
    p.boot_id = m.boot_id;
    p.match_index = 0;
    p.next_index = std::min(p.next_index, last_index() + 1);
  }
  p.last_ack_ms = now_;
  if (m.ok) {
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
  while (!held_.empty() && held_.front().index <= commit_index_) {
    out->push_back(std::move(held_.front().reply));
    held_.pop_front();
  }
}

void Replica::Compact() {
  // Keep the log within its bounds: drop applied (and, on a primary, committed) entries.
  const uint64_t keep_after = std::min(applied_index_, commit_index_);
  while ((log_.size() > options_.max_log_entries || log_bytes_ > options_.max_log_bytes) &&
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
      for (uint32_t r : view->shards[shard_options_.shard].in_sync)
        if (r != options_.replica && r < options_.replicas) in_sync_.push_back(r);
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
  if (!was_primary) return;
  spdlog::warn("shard {}: replica {} stops leading (term {}): {}; {} replies not sent",
               shard_options_.shard, options_.replica, term_, why, held_.size());
  held_.clear();  // never acknowledged: the workers send them again to the new primary
  primary_.reset();
  caught_up_ = false;
  // It applied entries the new primary may lack: its state must come from a snapshot.
  if (applied_index_ > commit_index_) needs_snapshot_ = true;
  if (role_observer_) role_observer_(role_, term_);
}

// ---- backups ----------------------------------------------------------------------------

void Replica::OnReplication(const PeerId& /*peer*/, const Message& message) {
  auto decoded = DecodeReplication(message, shard_options_.limits);
  if (!decoded.ok()) {
    spdlog::warn("shard {}: replica {} ignored a malformed replication message: {}",
                 shard_options_.shard, options_.replica, decoded.status().ToString());
    return;
  }
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, ReplAppendMsg>) OnAppend(m);
        if constexpr (std::is_same_v<T, ReplAckMsg>) OnAck(m);
        if constexpr (std::is_same_v<T, ReplSnapshotMsg>) OnSnapshot(m, decoded->payloads);
      },
      decoded->value);
}

void Replica::SendAck(bool ok, uint64_t last) {
  if (!primary_) return;
  ReplAckMsg a{term_, options_.replica, ok, last, needs_snapshot_, boot_id_};
  (void)peers_->Send(static_cast<int>(*primary_), EncodeReplication(a));
}

void Replica::OnAppend(const ReplAppendMsg& m) {
  if (m.primary >= options_.replicas || m.primary == options_.replica) return;
  if (m.term < term_) {
    // Fencing: a deposed primary gathers no acknowledgements.
    ReplAckMsg a{term_, options_.replica, false, 0, false, boot_id_};
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
      while (last_index() >= index) {
        log_bytes_ -= EntryBytes(log_.back());
        log_.pop_back();
      }
    }
    log_bytes_ += EntryBytes(e);
    log_.push_back(e);
  }
  const uint64_t matched = std::max(base_index_, m.prev_index + m.entries.size());
  const uint64_t commit = std::min(m.commit, matched);
  if (commit > commit_index_) commit_index_ = commit;
  if (matched >= m.commit) caught_up_ = true;
  ApplyCommitted();
  Compact();
  SendAck(true, matched);
}

void Replica::OnSnapshot(const ReplSnapshotMsg& m, std::span<const Frame> payloads) {
  if (m.primary >= options_.replicas || m.primary == options_.replica) return;
  if (m.term < term_) {
    ReplAckMsg a{term_, options_.replica, false, 0, false, boot_id_};
    (void)peers_->Send(static_cast<int>(m.primary), EncodeReplication(a));
    return;
  }
  if (m.term > term_ || role_ == ReplicaRole::kPrimary) StepDown(m.term, "a newer primary");
  primary_ = m.primary;
  if (!needs_snapshot_ && m.index >= base_index_ && m.index <= applied_index_ &&
      TermAt(m.index) == m.index_term) {
    return SendAck(true, m.index);  // a duplicate of one installed already
  }
  if (m.shard != shard_options_.shard || m.num_shards != shard_options_.num_shards) {
    spdlog::error("shard {}/{}: replica {} was sent a snapshot of shard {}/{}; ignored",
                  shard_options_.shard, shard_options_.num_shards, options_.replica, m.shard,
                  m.num_shards);
    return;
  }
  ShardSnapshot snap;
  snap.shard = m.shard;
  snap.num_shards = m.num_shards;
  snap.min_clock = m.min_clock;
  snap.sequence = m.index;
  snap.coverage = m.coverage;
  for (const auto& w : m.workers)
    snap.workers.push_back({w.worker_id, w.incarnation, w.clock, w.last_seq, w.name});
  size_t f = 0;
  for (const auto& t : m.tables) {
    TableSnapshot ts;
    ts.table_id = t.table_id;
    auto spec = DecodeTableSpec(t.spec);
    if (!spec.ok()) {
      spdlog::error("shard {}: snapshot from replica {} unusable: {}", shard_options_.shard,
                    m.primary, spec.status().ToString());
      return;
    }
    ts.spec = std::move(*spec);
    ts.row_begin = t.row_begin;
    ts.row_end = t.row_end;
    ts.cols = t.cols;
    ts.optimizer_steps = t.optimizer_steps;
    const size_t n = (t.row_end - t.row_begin) * t.cols;
    auto values = FrameFloats(payloads[f++], n, "values");
    if (!values.ok()) {
      spdlog::error("shard {}: {}", shard_options_.shard, values.status().ToString());
      return;
    }
    ts.values = std::move(*values);
    for (uint32_t s = 0; s < t.slots; ++s) {
      auto slot = FrameFloats(payloads[f++], n, "optimizer state");
      if (!slot.ok()) {
        spdlog::error("shard {}: {}", shard_options_.shard, slot.status().ToString());
        return;
      }
      ts.slots.push_back(std::move(*slot));
    }
    snap.tables.push_back(std::move(ts));
  }
  if (Status st = store_->Save(snap); !st.ok()) {
    spdlog::error("shard {}: snapshot from replica {} not saved: {}", shard_options_.shard,
                  m.primary, st.ToString());
    return;
  }
  auto shard = std::make_unique<Shard>(
      shard_options_, store_, [this] { return shard_now_; }, sparse_);
  if (auto r = shard->Recover(); !r.ok()) {
    spdlog::error("shard {}: snapshot from replica {} not installed: {}", shard_options_.shard,
                  m.primary, r.status().ToString());
    return;
  }
  shard_ = std::move(shard);
  log_.clear();
  log_bytes_ = 0;
  base_index_ = m.index;
  base_term_ = m.index_term;
  applied_index_ = m.index;
  commit_index_ = std::min(m.commit, m.index);
  needs_snapshot_ = false;
  spdlog::info("shard {}: replica {} installed a snapshot at entry {} (term {})",
               shard_options_.shard, options_.replica, m.index, m.term);
  SendAck(true, m.index);
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
  if (needs_snapshot_) return;
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
    return;
  }
  const bool listed = std::binary_search(s.in_sync.begin(), s.in_sync.end(), options_.replica);
  // A replica listed in sync that restarted lost its log: it may lead only once a primary
  // has caught it up again (or while no entry was ever acknowledged).
  if (!s.in_sync.empty() && !(listed && caught_up_)) return;
  auto won = coordinator_->Campaign();
  if (!won.ok()) {
    spdlog::warn("shard {}: replica {} could not campaign: {}", shard_options_.shard,
                 options_.replica, won.status().ToString());
    return;
  }
  if (*won) BecomePrimary(**won);
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
    if (role_ != ReplicaRole::kPrimary) {
      scratch_.clear();
      shard_->Tick(&scratch_);  // this replica's own snapshots, on the log's clock
      scratch_.clear();
    }
    wait = std::min(wait, options_.campaign_ms);
  }
  return std::max<int64_t>(1, wait);
}

Status ServeReplica(Replica& replica, ServerTransport& transport, const std::atomic<bool>& stop,
                    const std::function<void(const Replica&)>& after_tick) {
  std::vector<Outgoing> out;
  int64_t wait_ms = replica.Tick(&out);
  Status result;
  while (!stop.load(std::memory_order_relaxed)) {
    for (Outgoing& o : out) (void)transport.Send(o.peer, std::move(o.message));
    out.clear();
    auto in = transport.Receive(std::chrono::milliseconds(std::min<int64_t>(wait_ms, 100)));
    if (!in.ok()) {
      result = in.status();
      break;
    }
    if (in->has_value()) replica.Handle((*in)->peer, (*in)->message, &out);
    wait_ms = replica.Tick(&out);
    if (after_tick) after_tick(replica);
  }
  auto snap = replica.mutable_shard().Checkpoint();
  if (!snap.ok() && result.ok()) result = snap.status();
  return result;
}

}  // namespace leash::server

// One replica of a replicated shard (--replicas R > 1): a Shard fed from a replicated log.
// With R = 1 and a durable log, a group of one (server/src/solo_group.h): the same log, on
// disk only.
// The primary orders every input that changes the shard's state into the log, applies it,
// ships it to the backups and releases its replies only once every backup of the in-sync
// set holds it; backups apply the log up to the commit index the primary sends, with the
// primary's clock values, so every replica's state is the same bit for bit. Elections and
// the in-sync set go through a Coordinator (coordinator.h). docs/replication.md, "The log".
// Not thread-safe: one serving loop owns a Replica (ServeReplica), like a Shard.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "leash/common/coordinator.h"
#include "leash/common/transport.h"
#include "leash/common/wire.h"
#include "leash/server/shard.h"
#include "leash/server/snapshot.h"

namespace leash::server {

struct ReplicaOptions {
  uint32_t replica = 0;   // this replica, 0..replicas-1
  uint32_t replicas = 2;  // R (1: a group of one, with a durable log)
  // Applied and committed entries kept, for backups that fall behind, at most this many and
  // (their messages' frames) this many bytes; a backup further behind catches up from a
  // snapshot. The byte bound keeps a replica's memory flat: 65536 pushes of an MLP's
  // gradients (about 0.5 MB each) held 3.6 GB per replica within a minute of the soak.
  // A group of one (replicas 1) keeps none: both bounds are 0 there.
  size_t max_log_entries = 65536;
  size_t max_log_bytes = size_t{64} << 20;
  size_t max_entries_per_append = 256;
  // An in-sync backup that has not caught up with the log for this long leaves the in-sync
  // set (the primary then acknowledges without it).
  int64_t backup_timeout_ms = 1000;
  // Entries a backup has not acknowledged are sent again after this long.
  int64_t resend_ms = 100;
  // An append, empty if need be, goes to every backup at least this often (the commit
  // index; a backup's sign that the primary lives).
  int64_t heartbeat_ms = 50;
  // How often a backup asks the coordinator to lead while the shard has no primary.
  int64_t campaign_ms = 100;
  // Snapshot transfers to one backup start at most this often.
  int64_t snapshot_every_ms = 500;
  // Bytes of table data or sparse rows in one snapshot chunk. A few MiB: a chunk stays far
  // below what a transport queues per peer, the serving loop copies one in about a
  // millisecond (pushes wait no longer for it), and per-message costs stay negligible.
  size_t snapshot_chunk_bytes = size_t{4} << 20;
  // Chunks sent ahead of the backup's acknowledgement (what the network holds at once).
  uint32_t snapshot_window = 4;
  // A transfer the backup has acknowledged nothing of for this long is dropped (its image
  // released); a new one starts when the backup answers again.
  int64_t snapshot_timeout_ms = 10000;
  // The replica's log on disk as it runs (leash-server --durable-log; durable_log.h): every
  // entry is written there before this replica acknowledges it, so that a replica killed
  // (every replica of the shard at once, even) starts again with its log and may lead.
  // Empty: none (a replica killed starts empty and is caught up). Opened by Restore().
  std::string durable_log_dir;
  bool durable_log_fsync = false;  // fdatasync before each acknowledgement: survives a power cut
  // Once the current file holds this many bytes, or twice the dense tables' bytes (their
  // values and optimizer state) if that is more, a snapshot is taken and the file starts
  // again from it over the spare (the log of a parameter server is its gradient traffic;
  // a pair of small files is reused while its pages are in memory).
  uint64_t durable_log_max_bytes = uint64_t{64} << 20;
  // With CURVE: the authenticated user (Inbound::user) of the replicas' own key. Replication
  // messages from any other user (a worker's key) are refused, counted and logged at most
  // once a minute. Empty (no CURVE): not checked; nobody is authenticated then.
  std::string replica_user;
  // Backups that answer (docs/replication.md, "Backups that answer"): while a primary has
  // exactly one in-sync backup, that backup sends the workers the replies to their pushes and
  // clocks itself once it holds them, and the primary drops its own; an acknowledgement then
  // takes worker -> primary -> backup -> worker, one hop less. Needs the worker connected to
  // the backup too (leash::Client does that when the directory says the backup answers). Not
  // with durable_log_fsync: there the primary answers once its own disk holds the entry.
  bool backup_answers = false;
};

enum class ReplicaRole { kBackup, kPrimary };

class DurableLog;  // durable_log.h

// What the primary knows of one backup.
struct BackupProgress {
  uint32_t replica = 0;
  bool in_sync = false;
  uint64_t match_index = 0;   // it holds the primary's log up to here
  int64_t ms_behind = 0;      // age of the oldest entry it lacks (0: holds the whole log)
  int64_t ms_since_ack = -1;  // since its last acknowledgement this term (-1: none yet)
};

class Replica {
 public:
  using NowMs = std::function<int64_t()>;
  // `shard_options.replicated` is set here. `store` (outliving the replica) receives the
  // shard's snapshots and the ones a primary ships; `coordinator` and `directory` (the
  // same shard's, joined by the caller) and `peers` (one connection per replica, index =
  // replica; sends only) outlive it too, and `sparse` (the cold tier; null: in memory).
  // `now_ms` is the steady clock.
  Replica(ReplicaOptions options, ShardOptions shard_options, SnapshotStore* store, NowMs now_ms,
          Coordinator* coordinator, ShardDirectory* directory, ClientTransport* peers,
          SparseStore* sparse = nullptr);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  // Handles one message from `peer`: a worker's request (a primary serves it; a backup
  // answers Unavailable naming the primary) or a message of another replica. Replies that
  // may go out now are appended to `out`. `user` is the connection's authenticated user
  // (Inbound::user), checked against ReplicaOptions::replica_user for replication messages.
  void Handle(const PeerId& peer, const Message& message, std::vector<Outgoing>* out,
              const std::string& user = {});
  // Elections, evictions, resends, heartbeats, the in-sync set and the commit index; replies
  // released by a commit go to `out`. Returns the milliseconds until it wants to run again.
  int64_t Tick(std::vector<Outgoing>* out);
  // Stopping: a primary steps down and gives its term up in the coordinator, so that a
  // backup takes over now rather than when the lease expires. Replies not yet committed are
  // never sent; the workers resend those requests to the successor. No-op on a backup.
  void Resign();
  // A clean stop (docs/replication.md, "Stopping and starting again"): what this replica
  // keeps with its final snapshot so that it starts again with the log it held, and may lead
  // if the in-sync set still lists it: its term, the index and term of the entry its state
  // has applied, the commit index and the entries it holds past the applied one. Empty when
  // it could not lead now either (catching up, or started without its log and not caught up
  // since). Call before Resign(); the snapshot must be of the state as it is now.
  std::string StopRecord() const;
  // Before serving: if the store's snapshot carries a stop record of this replica, takes the
  // snapshot's state, the term and the log back, and at once writes a snapshot without the
  // record, so that a crash later cannot bring back a log this replica has moved past. True
  // then; false (and this replica starts empty, to be caught up) when there is none or it
  // cannot be used (logged). Errors of the store's snapshot, or of that write.
  Result<bool> RestoreAfterCleanStop();
  // Before serving, what leash-server calls: RestoreAfterCleanStop; failing that, with a
  // durable log (ReplicaOptions::durable_log_dir), the store's snapshot and the log file
  // that follows it, used as a stop record is (the replica may lead if the in-sync set
  // lists it and it could lead when it stopped); failing both it starts empty (and begins
  // a durable log for the empty state). True if it took its state and log back. Errors:
  // the durable log's directory, the store's snapshot, writes that must succeed.
  Result<bool> Restore();
  // Records and bytes written to the durable log, and whether it failed (nothing is
  // acknowledged by this replica after a failed write; it leads no more).
  uint64_t durable_records() const;
  uint64_t durable_bytes() const;
  bool durable_failed() const { return durable_broken_; }
  // --durable-log: off without ReplicaOptions::durable_log_dir, else write or fsync.
  DurableLogMode durable_log_mode() const {
    if (options_.durable_log_dir.empty()) return DurableLogMode::kOff;
    return options_.durable_log_fsync ? DurableLogMode::kFsync : DurableLogMode::kWrite;
  }
  // fdatasyncs of the durable log (--durable-log fsync) and the seconds they took in all.
  uint64_t durable_syncs() const;
  double durable_sync_seconds() const;
  // Whether its coordinator lease is known valid now (renewed within the TTL; etcd reachable).
  bool coordinator_lease_valid() const { return coordinator_->LeaseValid(); }
  // Terms this replica has led (became primary), since it started.
  uint64_t terms_led() const { return terms_led_; }

  const ReplicaOptions& options() const { return options_; }
  ReplicaRole role() const { return role_; }
  uint64_t term() const { return term_; }
  // The replica this one takes for the primary (itself when primary), if it knows one.
  std::optional<uint32_t> primary() const { return primary_; }
  uint64_t last_index() const { return base_index_ + log_.size(); }
  // Entries held and their messages' bytes (bounded by max_log_entries and max_log_bytes
  // beyond what is not yet applied and committed).
  size_t log_entries() const { return log_.size(); }
  size_t log_bytes() const { return log_bytes_; }
  uint64_t commit_index() const { return commit_index_; }
  uint64_t applied_index() const { return applied_index_; }
  // The primary's log index less the lowest match of its in-sync backups (0 elsewhere).
  uint64_t replication_lag() const;
  // A primary's in-sync set, as it last wrote it to the coordinator (itself included).
  const std::vector<uint32_t>& in_sync() const { return in_sync_; }
  // What this replica knows of each other one; ms_behind and ms_since_ack on a primary only.
  std::vector<BackupProgress> backups() const;
  // Replies held until their entries commit.
  size_t held_replies() const { return held_.size(); }
  // Backups that answer: replies to pushes and clocks a backup sent workers itself, and a
  // primary's replies it dropped because its backup said it sent them (a batch's each).
  uint64_t backup_answered() const { return backup_answered_; }
  uint64_t replies_left_to_backup() const { return replies_left_to_backup_; }
  // Log entries this replica received read in place from its primary's shared-memory ring
  // (the primary lends them, ZmqOptions::shm_lend): applied without a copy.
  uint64_t entries_lent() const { return entries_lent_; }
  // A primary: pushed frames it copied once, from its worker's shared-memory ring (read in
  // place: ZmqOptions::shm_borrow_all) straight into a backup's, and applied from there,
  // where it would copy them out first and then into the backup's ring.
  uint64_t frames_copied_once() const { return frames_copied_once_; }
  bool needs_snapshot() const { return needs_snapshot_; }
  // False from the start of a snapshot transfer to this replica (its old state dropped) until
  // one is installed; it writes no snapshots of its own meanwhile.
  bool has_state() const { return !state_dropped_; }
  // Snapshot transfers this replica received in part and dropped (a newer transfer or term).
  uint64_t snapshots_abandoned() const { return snapshots_abandoned_; }
  // Snapshot transfers this replica installed.
  uint64_t snapshots_installed() const { return snapshots_installed_; }
  // Replication messages refused because their connection was not a replica's
  // (ReplicaOptions::replica_user).
  uint64_t replication_refused() const { return replication_refused_; }
  const Shard& shard() const { return *shard_; }
  Shard& mutable_shard() { return *shard_; }
  // Told each snapshot's duration, as Shard::set_snapshot_observer, by whichever Shard this
  // replica holds: installing a snapshot replaces it, and the observer moves to the new one.
  void set_snapshot_observer(Shard::SnapshotObserver observer) {
    snapshot_observer_ = std::move(observer);
    shard_->set_snapshot_observer(snapshot_observer_);
  }
  // Where the primary's fp32 pull replies are written (Shard::SetPayloadAllocator: shared
  // memory with a worker on this host), by whichever Shard this replica holds. A backup's
  // shard writes to ordinary memory: what it answers while applying the log is dropped.
  void SetPayloadAllocator(Shard::PayloadAllocator allocator) {
    payload_allocator_ = std::move(allocator);
    AttachShard();
  }
  // Called (with the role change) whenever this replica becomes primary or stops being it.
  void set_role_observer(std::function<void(ReplicaRole, uint64_t term)> f) {
    role_observer_ = std::move(f);
  }

 private:
  struct Peer {
    uint64_t next_index = 1;
    uint64_t match_index = 0;
    uint64_t boot_id = 0;
    std::set<uint64_t> retired_boots;  // acks of these are stale (the replica restarted)
    int64_t last_ack_ms = 0;
    int64_t progress_ms = 0;  // when it last held the whole log or moved forward
    int64_t sent_ms = -1;
    int64_t snapshot_ms = -1;
  };
  struct Held {
    uint64_t index;
    Outgoing reply;
    bool own = false;    // the replies to the entry's own requests (a backup may send them)
    size_t replies = 0;  // own: how many (a batch's pushes and clock)
  };
  // Backup (backup_answers): the connection a worker's heartbeats last came in on.
  struct WorkerLink {
    uint64_t incarnation = 0;
    PeerId peer;
    int64_t seen_ms = 0;
  };
  struct Transfer;  // primary: a snapshot being sent to one backup (replica.cc)
  struct Staging;   // backup: a snapshot being received

  // Stats of a primary: the commit index and each backup's lag (leashctl status).
  void FillBackupLag(ShardStats* st) const;
  void OnReplication(const PeerId& peer, const Message& message, std::vector<Outgoing>* out);
  void OnAppend(const ReplAppendMsg& m, std::vector<Outgoing>* out);
  void OnAck(const ReplAckMsg& m);
  void OnSnapshot(const ReplSnapshotMsg& m, std::span<const Frame> payloads);
  void SendAck(bool ok, uint64_t last_index, std::vector<uint64_t> answered = {});
  // Primary: whether a worker's request changes replicated state (and so is logged).
  bool ChangesState(const Message& message) const;
  // Primary: logs an entry of this term at now_, applies it, ships it.
  void Log(ReplEntryWire::Kind kind, const PeerId& peer, uint64_t worker_id,
           const Message& message);
  // Applies `e` to the shard with its clock value; its replies to `out` (may be null).
  void Apply(const ReplEntryWire& e, std::vector<Outgoing>* out);
  // Backup: an entry it answers (pushes and clocks of one worker, alone or a batch, whose
  // heartbeats come in here, within the lease; pushes: of that incarnation): its index, the
  // worker's connection here, and the request ids of the pushes and clocks (sorted).
  struct Answer {
    uint64_t index = 0;
    PeerId peer;
    std::vector<uint64_t> rids;
  };
  // Backup: applies what is committed. Of the entries in `answered` (by index), the replies
  // to their own requests go to `out`, addressed to the workers' connections here.
  void ApplyCommitted(std::vector<Outgoing>* out = nullptr,
                      const std::vector<Answer>& answered = {});
  // Backup: entry `index` (e) as an Answer if this backup answers it; nullopt otherwise.
  std::optional<Answer> AnswerOf(uint64_t index, const ReplEntryWire& e) const;
  // Backup: a worker's heartbeat on connection `peer`.
  void NoteWorkerLink(const PeerId& peer, const Message& heartbeat);
  // Primary: whether backup r may answer entries up to `last` (ReplAppendMsg::backup_answers):
  // it is the only in-sync backup, and this replica's durable log, if any, holds them.
  bool BackupMayAnswer(uint32_t r, uint64_t last) const;
  uint64_t TermAt(uint64_t index) const;  // 0 if unknown
  static size_t EntryBytes(const ReplEntryWire& e);
  const ReplEntryWire& EntryAt(uint64_t index) const;
  // The logged entry `index`, to change in place; null if compacted away or not logged.
  ReplEntryWire* LoggedEntry(uint64_t index);
  void SendAppend(uint32_t r);
  // Primary: copies the frames of `m` that backup r gets through shared memory into its ring
  // here (the transport then passes them as they are), checking their floats as it copies:
  // a logged frame found to hold finite float32 values is marked so (Frame::finite_f32), and
  // this replica's shard does not check that push again. Nothing if r is not on this host.
  void CopyIntoRing(uint32_t r, ReplAppendMsg* m);
  // Primary: starts a snapshot transfer to backup r (at most every snapshot_every_ms) or
  // goes on with the one in flight: the chunks within the window, again from where the
  // backup stands if it has acknowledged nothing for resend_ms.
  void SendSnapshot(uint32_t r);
  bool StartSnapshot(uint32_t r);
  void SendChunk(uint32_t r, uint32_t chunk);
  void OnSnapshotAck(const ReplAckMsg& m);
  // Backup.
  void SendChunkAck(uint32_t primary, uint64_t transfer, uint32_t next_chunk);
  bool BeginStaging(const ReplSnapshotMsg& m);
  Status StageChunk(const ReplSnapshotMsg& m, const Frame& frame);
  Status InstallStaging();
  void AbandonStaging(const std::string& why);
  void ReplicateAll();
  // Primary: shrinks or grows the in-sync set through the coordinator; false if deposed.
  bool UpdateInSync();
  void AdvanceCommit();
  void Release(std::vector<Outgoing>* out);
  void Compact();
  void BecomePrimary(uint64_t term);
  void StepDown(uint64_t term, const char* why);
  // Primary alone in the in-sync set with an uncertain lease: asks the coordinator whether
  // its term is still current; if the term is over, steps down still eligible to lead.
  void CheckTermAlone();
  void MaybeCampaign();
  // Why this replica may not lead while the shard has no primary (at most every 30 s).
  void WarnCannotLead(const ShardView& s, bool listed);
  void SetShardNow(int64_t ms) { shard_now_ = ms; }

  ReplicaOptions options_;
  ShardOptions shard_options_;
  SnapshotStore* store_;
  SparseStore* sparse_;
  NowMs now_ms_;
  Coordinator* coordinator_;
  ShardDirectory* directory_;
  ClientTransport* peers_;
  std::unique_ptr<Shard> shard_;
  Shard::SnapshotObserver snapshot_observer_;
  Shard::PayloadAllocator payload_allocator_;
  // Gives the shard this replica holds its payload allocator, snapshot observer and
  // checkpoint hooks (the durable log's files begin at its snapshots).
  void AttachShard();
  // A new, empty shard in place of the one held.
  void ResetShard();
  // Whether this replica could lead with the log and state it holds now (StopRecord's rule).
  bool CouldLead() const;
  // The log from entry `from` on as an append of this replica's (the form a stop record and
  // the durable log's records take).
  Message LogSince(uint64_t from) const;
  // Writes what changed in the log (entries appended, a tail cut, the term, CouldLead) to
  // the durable log. False if that failed (nothing may be acknowledged then).
  bool Persist();
  void MarkPersisted(bool could_lead);
  // A durable log write failed: said once, a primary resigns, and this replica acknowledges
  // and leads no more.
  void BreakDurable(const Status& st);
  // A primary steps down (`why`) and gives its term up in the coordinator, so that a backup
  // takes over now rather than when the lease expires (Resign, BreakDurable). No-op on a
  // backup.
  void GiveUpTerm(const char* why);
  Result<bool> RestoreFromDurableLog();
  // Takes a log back as this replica's (a clean stop's record or the durable log, `from`):
  // its term, the entry the shard's state stands at, the commit index it knew and the
  // entries past it; applies what is committed and writes a snapshot at once. It may then
  // lead if the in-sync set lists it.
  Status TakeLogBack(uint64_t term, uint64_t base, uint64_t base_term, uint64_t commit,
                     std::deque<ReplEntryWire> log, const char* from);
  // Whether the coordinator remembers this group (a stop record or durable log of `term`
  // means something only then).
  Result<bool> GroupRemembered(uint64_t term);
  // A group of one (R = 1, docs/replication.md "One replica with a durable log") whose log
  // cannot be used (`why`): it keeps the snapshot the shard recovered, with an empty log, and
  // may lead; starting empty, as a backup does, would throw that snapshot away.
  Result<bool> KeepSnapshotAlone(const std::string& why);
  int64_t shard_now_ = 0;  // the clock the shard reads: the entry being applied's
  int64_t now_ = 0;        // this turn's steady clock
  uint64_t boot_id_ = 0;

  ReplicaRole role_ = ReplicaRole::kBackup;
  uint64_t term_ = 0;
  std::optional<uint32_t> primary_;
  std::deque<ReplEntryWire> log_;  // entries base_index_+1 .. last_index()
  uint64_t base_index_ = 0;        // the entry before log_.front() (a snapshot's)
  size_t log_bytes_ = 0;           // EntryBytes of every entry in log_
  uint64_t base_term_ = 0;
  uint64_t commit_index_ = 0;
  uint64_t applied_index_ = 0;
  bool needs_snapshot_ = false;
  // Backup: it has held everything its primary had committed since it started, so it may
  // lead (a restarted replica lost its log and must be caught up first).
  bool caught_up_ = false;
  int64_t last_campaign_ms_ = -1;
  int64_t cannot_lead_warned_ms_ = -1;  // MaybeCampaign's warning, at most every 30 s
  int64_t no_primary_since_ms_ = -1;    // since when the directory names no primary
  // A term this replica won but whose in-sync set it could not write yet (the coordinator
  // did not answer): it holds the primary key, so nobody else can lead; tried again.
  std::optional<uint64_t> won_term_;

  // Primary.
  uint64_t term_start_index_ = 0;  // this term's no-op: nothing commits before it does
  std::vector<Peer> peers_state_;
  std::vector<uint32_t> in_sync_;    // sorted, contains options_.replica
  int64_t next_in_sync_try_ms_ = 0;  // after a failed SetInSync
  int64_t in_sync_warned_ms_ = -1;
  int64_t next_term_check_ms_ = 0;  // CheckTermAlone's next try
  std::deque<Held> held_;
  std::vector<Outgoing> scratch_;
  std::function<void(ReplicaRole, uint64_t)> role_observer_;

  // Catch-up by snapshot (docs/replication.md, "Catch-up").
  std::unique_ptr<SparseStore> own_sparse_;           // when no cold tier was given
  std::vector<std::unique_ptr<Transfer>> transfers_;  // primary: by backup
  std::unique_ptr<Staging> staging_;                  // backup
  bool state_dropped_ = false;
  uint64_t snapshots_abandoned_ = 0;
  uint64_t replication_refused_ = 0;
  int64_t refused_logged_ms_ = -1;
  uint64_t snapshots_installed_ = 0;
  uint64_t terms_led_ = 0;
  std::map<uint64_t, WorkerLink> worker_links_;  // backup: by worker id
  uint64_t backup_answered_ = 0;
  uint64_t replies_left_to_backup_ = 0;
  uint64_t entries_lent_ = 0;
  uint64_t frames_copied_once_ = 0;
  // The last entry holding ring room: received holding a lent frame (a backup), or holding
  // the copy this replica made into its backup's ring (a primary). Compacted once applied.
  uint64_t lent_through_ = 0;

  // The durable log (ReplicaOptions::durable_log_dir), and how far it holds the log.
  std::unique_ptr<DurableLog> durable_;
  uint64_t persisted_last_ = 0;       // it holds the log up to here...
  uint64_t dirty_from_ = UINT64_MAX;  // ...except from here on (a tail cut since)
  uint64_t persisted_term_ = 0;
  bool persisted_could_lead_ = false;
  bool durable_broken_ = false;
  int64_t next_durable_cut_ms_ = 0;          // after a failed snapshot to cut the file
  uint64_t durable_state_bytes_ = 0;         // the dense tables' bytes at the last snapshot
  const ReplEntryWire* applying_ = nullptr;  // the entry Apply is applying
};

// Runs `replica` on `transport` until `stop`: receives, handles, ticks and sends, like
// Serve (shard.h). On the way out it sends what was released, resigns (a primary), then
// writes a final snapshot: a backup does not wait for the snapshot to take over.
// `after_tick` as in Serve.
Status ServeReplica(Replica& replica, ServerTransport& transport, const std::atomic<bool>& stop,
                    const std::function<void(const Replica&)>& after_tick = {});

}  // namespace leash::server

// Client for a sharded Leash cluster: register, create tables, pull, push and clock, all
// asynchronous. Thread-safe. One connection per shard (through a ClientTransport); many
// requests in flight and pipelined. A background I/O thread owns the connections, sends
// heartbeats (so a long compute step never looks like a death) and resends requests to
// a shard that went silent once it answers again; pushes carry (worker id, incarnation,
// sequence) so a resent push is applied at most once. With a shard directory (replicated
// shards, --etcd) a second thread follows every shard's primary: on a failover it moves the
// shard's connection to the new primary and resends what was not answered.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "leash/common/coordinator.h"
#include "leash/common/domain.h"
#include "leash/common/message.h"
#include "leash/common/status.h"
#include "leash/common/transport.h"

namespace leash {

struct ClientOptions {
  uint64_t worker_id = 0;          // 0: pick a random id
  std::string name;                // for logs and status
  bool register_worker = true;     // false for tools (leashctl) that only read
  int64_t staleness = 0;           // pulls for iteration c wait until min clock >= c - staleness
  DType wire_dtype = DType::kF32;  // encoding of pushes and pull replies
  int64_t connect_timeout_ms = 30000;  // Connect() fails if a shard does not answer
  int64_t shard_silence_ms = 3000;  // a shard silent this long with requests pending is reconnected
  int64_t heartbeat_ms = 0;         // 0: a quarter of the shortest lease, 10 ms to 1 s
  // A thread waiting on a future polls for the reply this long before it sleeps: lower
  // latency for a CPU core. Off by default (it hurt on a loaded 2-core machine).
  int64_t reply_spin_us = 0;
  // Polled about every 100 ms by the calls that wait inside the client (Connect, Rejoin,
  // CreateTable, NextChunk, Stats, Checkpoint): once it returns true the call gives up
  // with Cancelled (a request already sent may still be answered; the answer is dropped).
  // Lets a binding honour Ctrl-C. Called on the waiting thread.
  std::function<bool()> interrupted;
  // Replicated shards: the directory naming each shard's primary, and the view the
  // transport's endpoints were taken from (ResolvePrimaries). The client watches the
  // directory; when a shard's primary changes it retargets that shard's connection and
  // resends every request not yet answered (parked pulls included; pushes are deduplicated
  // by the replicas, which share the exactly-once records). A backup's "I am a backup"
  // answer is never surfaced: the request waits for the directory to name the primary.
  // Where a shard's sole in-sync backup answers pushes and clocks itself (--backup-answers
  // on the servers; ReplicaAddress::answers), the client connects to it too
  // (ClientTransport::ConnectBackup) and takes those replies from it; what it leaves
  // unanswered for max(4 heartbeats, 1 s) goes to the primary again.
  // Null: static endpoints (--servers), nothing followed.
  std::shared_ptr<ShardDirectory> directory;
  ClusterView directory_view;
};

// Waits until every shard of the directory's job has a primary (logging progress every few
// seconds) and returns the view; its primaries' endpoints, shard s at index s, are what to
// connect to. Unavailable after `timeout_ms` naming the shards without a primary (or what
// the directory said); Cancelled once `interrupted` (may be null) returns true.
Result<ClusterView> ResolvePrimaries(ShardDirectory& directory, int64_t timeout_ms,
                                     const std::function<bool()>& interrupted = nullptr);
// The endpoints of `view`'s primaries, shard s at index s (every shard must have one).
std::vector<std::string> PrimaryEndpoints(const ClusterView& view);

namespace detail {
struct Op;
}

// The result of an asynchronous Client call. The thread that waits on it reads the
// replies from the connections itself, so an answer reaches it without a hand-off
// through the client's I/O thread. Copyable; every copy sees the same result. Do not
// destroy the Client while another thread waits on one of its futures (a future that
// is ready may outlive the Client).
class Future {
 public:
  Future() = default;
  explicit Future(std::shared_ptr<detail::Op> op) : op_(std::move(op)) {}
  bool valid() const { return op_ != nullptr; }
  // True once the result is there; never waits nor reads a connection.
  bool ready() const;
  // Waits for the result and returns it (FailedPrecondition for a default-made future).
  Status get() const;
  void wait() const;
  // std::future_status::ready or ::timeout.
  template <typename Rep, typename Period>
  std::future_status wait_for(const std::chrono::duration<Rep, Period>& timeout) const {
    return WaitMs(std::chrono::ceil<std::chrono::milliseconds>(timeout).count())
               ? std::future_status::ready
               : std::future_status::timeout;
  }

 private:
  bool WaitMs(int64_t timeout_ms) const;  // -1: no limit
  std::shared_ptr<detail::Op> op_;
};

// A table as created on every shard: its shape and each shard's id for it.
struct TableHandle {
  std::string name;
  uint64_t rows = 0;  // 0 for a sparse table
  uint32_t cols = 0;
  TableKind kind = TableKind::kDense;
  std::vector<uint32_t> shard_ids;
  size_t size() const { return static_cast<size_t>(rows) * cols; }
};

// A dense table's values as the shards sent them (Client::PullInPlace): one piece per shard
// that holds rows of it, in row order, read where the reply arrived instead of copied into a
// buffer of the caller's. With a float32 wire that is the received message itself, or the
// reply's bytes in a same-host shard's shared-memory ring, whose room goes back to the shard
// when the last copy of this object goes. A client keeps at most a quarter of a ring so held
// (ClientSharedMemory::ring_bytes); past that a ring's reply is copied out, and a 16-bit
// wire's values are widened into a piece of their own: those cost the one copy a Pull makes.
// Immutable once the future is ready; the pieces stay valid while this object (or a copy)
// lives, whatever the table does meanwhile. Copyable: copies share the pieces.
class PulledValues {
 public:
  struct Piece {
    size_t offset = 0;  // the table's float (row x cols) where the piece starts
    std::span<const float> values;
  };
  // Floats of the table, every piece together; 0 before a pull filled this.
  size_t size() const { return size_; }
  const std::vector<Piece>& pieces() const { return pieces_; }
  // All size() values as one span when one piece holds them (a table on one shard); else
  // an empty span.
  std::span<const float> contiguous() const;
  // Copies every value into out (size() floats).
  void CopyTo(float* out) const;
  // Bytes the client copied or widened to make the pieces (0: every piece read in place).
  size_t copied_bytes() const;

 private:
  friend class Client;
  std::vector<Piece> pieces_;
  std::vector<Frame> storage_;   // pieces_[i]'s bytes
  std::vector<uint8_t> copied_;  // 1 where piece i was copied or widened
  size_t size_ = 0;
};

struct ClientCounters {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t requests = 0;
  uint64_t resends = 0;
  // Pushes and clocks resent to a shard's primary because its answering backup
  // (ReplicaAddress::answers) did not answer them in time, or stopped being that backup.
  uint64_t backup_reply_resends = 0;
  uint64_t pushes = 0;            // Push() calls (one per table, whatever the shards)
  uint64_t pulls = 0;             // Pull() calls
  int64_t pulled_min_clock = -1;  // minimum clock the latest pull reply's values reflect
  // Shards on this host that large frames reach through shared memory.
  int shared_memory_shards = 0;
  // Answering backups (ReplicaAddress::answers) on this host whose connection sends and
  // receives through shared memory.
  int shared_memory_backups = 0;
  // Answering backups this client is connected to (one per shard at most).
  int answering_backups = 0;
  uint64_t push_buffers = 0;        // PushBuffer() calls that gave shared memory
  uint64_t pushes_from_buffer = 0;  // pushes sent from such a buffer where it lies (no copy)
};

class Client {
 public:
  // Connects through `transport` (one connection per shard) and, unless
  // options.register_worker is false, registers this worker with every shard. The
  // worker's clock starts at the largest minimum clock the shards report, so a worker
  // joining late never drags the others back. Unavailable, naming the shard, if a shard
  // does not answer within options.connect_timeout_ms; VersionMismatch for a shard of
  // another protocol version.
  static Result<std::unique_ptr<Client>> Connect(std::unique_ptr<ClientTransport> transport,
                                                 ClientOptions options);
  ~Client();  // stops the I/O thread; does not Leave()

  // Creates `table` (its shape, server-side optimizer and initializer) on every shard, or
  // finds it if it exists with the same spec. AlreadyExists if it exists with another
  // spec; InvalidArgument for a bad spec.
  Result<TableHandle> CreateTable(const TableSpec& table);

  // Reads the whole table into `out` (table.size() floats, alive until the future is
  // ready) once the staleness bound allows reading for this worker's current clock.
  // The future fails with NotFound for an unknown table. `for_clock` >= 0 pulls for that
  // iteration instead (to prefetch the next iteration's values under a bound s >= 1).
  // `read_clock`, if not null, is lowered to the minimum clock each shard's reply reflects
  // (it must outlive the future).
  Future Pull(const TableHandle& table, float* out, int64_t for_clock = -1,
              std::atomic<int64_t>* read_clock = nullptr);
  // Reads rows `keys` (row-major into out, keys.size() * cols floats).
  Future Pull(const TableHandle& table, std::span<const uint64_t> keys, float* out);
  // Pull without the copy into a buffer of the caller's: *out (alive until the future is
  // ready, not read before) gets the values where the replies brought them (PulledValues).
  // For a caller that reads the values once and moves on, e.g. copies them to a GPU or
  // into a framework's tensor: over the socket that saves the client a pass over every
  // byte. Same bound, clocks and errors as Pull; InvalidArgument for a null `out`.
  Future PullInPlace(const TableHandle& table, PulledValues* out, int64_t for_clock = -1,
                     std::atomic<int64_t>* read_clock = nullptr);
  // Sends the gradient of the whole table (copied before returning). Each shard applies
  // a given push at most once.
  // `weight` (work in proportion to speed): the samples behind the gradient and the job's
  // global batch; the shards weight it by their ratio. Default: unweighted.
  Future Push(const TableHandle& table, const float* grad, PushWeight weight = {});
  // The same, sent from `grad` itself instead of a copy (table.size() floats at
  // grad.get()): the caller hands the floats over and must not change them after the call;
  // the client keeps a reference to their owner until no shard's message (or resend) can
  // still read them, so the buffer may be reused once the caller holds the last reference
  // (use_count() == 1 after the future is ready and the client has sent it). With a float32
  // wire over the socket no byte of the gradient is copied in user space; a 16-bit wire
  // converts it, and a shard on this host gets it through shared memory (one copy either
  // way). InvalidArgument for a null `grad`.
  Future Push(const TableHandle& table, std::shared_ptr<const float> grad, PushWeight weight = {});
  Future Push(const TableHandle& table, std::span<const uint64_t> keys, const float* grad);
  // Room for a gradient of the whole dense `table` (table.size() floats) that a later
  // Push(table, shared_ptr) sends from where it lies, with no copy at all: a frame of the
  // shared-memory ring of the shard on this host that holds all the table's rows. Null
  // where there is none (the rows span several shards, the shard is on another host or
  // shared memory is off or full, a 16-bit wire, a table under the transport's smallest
  // shared-memory frame): then compute into memory of your own. Write the gradient, then
  // hand it to Push; a buffer never pushed gives its room back when dropped. Pushed after
  // the connection changed (a reconnect to a new shard process), it is copied as any
  // gradient is. Thread-safe.
  std::shared_ptr<float> PushBuffer(const TableHandle& table);

  // Sparse tables (TableKind::kSparse): rows addressed by any 64-bit keys, each on the
  // shard SparseOwner(key) names. PullSparse reads rows `keys` into `out` (keys.size() x
  // cols, alive until the future is ready) under the staleness bound, as Pull does; a key
  // named twice is fetched once. PushSparse sends gradient rows (keys.size() x cols,
  // copied before returning), summed per key on this worker first, one push per shard.
  // InvalidArgument for a dense table (or Pull/Push of keys on a sparse one); NotFound
  // for an unknown table.
  Future PullSparse(const TableHandle& table, std::span<const uint64_t> keys, float* out,
                    int64_t for_clock = -1);
  Future PushSparse(const TableHandle& table, std::span<const uint64_t> keys, const float* grad,
                    PushWeight weight = {});

  // Ends this worker's current iteration on every shard (after the pushes sent before it).
  // `samples_per_second` > 0 reports this worker's measured speed (work in proportion to
  // speed), < 0 that it is idle (no data to train: it counts 0); shard 0's reply then gives
  // the live workers' speeds summed.
  Future Clock(float samples_per_second = 0);
  // The summed speeds of the latest clock reply that had them; 0 before any.
  double cluster_samples_per_second() const;
  // Moves this worker's clock up to `clock` on every shard (a worker that fell behind the
  // minimum clock, which the shards' --backup-workers let run ahead of it: its next
  // pushes are for the iteration of the values it read). Ready at once if `clock` is not
  // ahead of this worker's clock.
  Future CatchUp(int64_t clock);

  // Batching: the Pull, Push and Clock requests made after HoldSends(), from any thread,
  // are kept until FlushSends() and then go out as one message per shard (wire.h
  // PackBatch), which the shard answers with one message: an iteration's pulls, or its
  // pushes and clock, then cost one message each way instead of one per table. Waiting
  // on the future of a held request flushes first. Heartbeats and resends are never held.
  void HoldSends();
  void FlushSends();
  int64_t clock() const { return clock_.load(); }

  // Leaves the job: every shard drops this worker at once.
  Status Leave();

  // Reports the chunk `done` (if not null) as trained and leases the next chunk of the
  // job's data from shard 0. FailedPrecondition if `plan` differs from the job's.
  // With samples_per_second and others_samples_per_second (work in proportion to speed),
  // shard 0 may answer kWait to a worker too slow to finish one of the job's last chunks
  // before the others finish them all (ps::DataCoverage::Next).
  Result<ChunkGrant> NextChunk(const DataPlan& plan, const ChunkDone* done,
                               float samples_per_second = 0, float others_samples_per_second = 0);

  // True once a shard has said it does not know this worker (it was evicted after its
  // lease expired, or the shard restarted without it). Rejoin() then registers again.
  bool needs_rejoin() const;
  // Registers with every shard under a new incarnation, starting at the shards' minimum
  // clock, and resumes heartbeats.
  Status Rejoin();

  // Statistics of every shard (for leashctl status).
  Result<std::vector<ShardStats>> Stats();
  // Makes every shard write a snapshot now; returns the clock each snapshot holds.
  Result<std::vector<int64_t>> Checkpoint();

  uint64_t worker_id() const { return options_.worker_id; }
  uint64_t incarnation() const { return incarnation_.load(); }
  int num_shards() const { return num_shards_; }
  ClientCounters counters() const;

 private:
  class Impl;
  Client(ClientOptions options, int num_shards);

  ClientOptions options_;
  int num_shards_;
  Status Register();
  Status WaitForShards(Future& fut, const std::vector<bool>& answered);
  // Push of a dense table; `owner` (or null: copied) keeps `grad` for the frames.
  Future PushDense(const TableHandle& table, const float* grad,
                   const std::shared_ptr<const float>& owner, PushWeight weight);
  // A pull of a whole dense table: take(index of the shard among those holding rows, the
  // float of the table its rows start at, its floats, the checked reply, its payload) keeps
  // each shard's values; `sized` (if set) is told how many shards hold rows before any
  // request is sent.
  using TakeValues = std::function<Status(size_t index, size_t offset, size_t floats,
                                          const PullReply& reply, const Frame& payload)>;
  Future PullDense(const TableHandle& table, int64_t for_clock, std::atomic<int64_t>* read_clock,
                   TakeValues take, const std::function<void(size_t shards)>& sized = nullptr);
  // fut's status, or Cancelled once options_.interrupted says so.
  Status Await(const Future& fut) const;

  std::atomic<uint64_t> incarnation_{0};
  std::atomic<int64_t> clock_{0};
  std::unique_ptr<Impl> impl_;
};

}  // namespace leash

// leash::Client: request pipelining, heartbeats and resends. Callers send their requests
// and read the replies they wait for on their own threads (one thread at a time receives
// from the transport); a background I/O thread handles the rest (replies nobody waits for,
// heartbeats, resends).
#include "leash/worker/client.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <span>
#include <thread>
#include <unordered_map>
#include <variant>

#include "leash/common/partition.h"
#include "leash/common/wire.h"

namespace leash {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A replica's answer that it is a backup (server/src/replica.cc): not an error of the
// request, which goes to the primary instead.
bool IsBackupRefusal(const Status& st) {
  return st.code() == StatusCode::kUnavailable &&
         st.message().find(" is a backup; the primary is ") != std::string::npos;
}

}  // namespace

namespace detail {

// Waits on a request's operation for a Future (implemented by Client::Impl).
class OpWaiter {
 public:
  virtual ~OpWaiter() = default;
  // True once `op` is done; false if `timeout_ms` (>= 0) passed first.
  virtual bool Wait(Op& op, int64_t timeout_ms) = 0;
};

// A user-level operation fanned out to one or more shards; completes when every part
// has a reply. Everything but `done` is touched under the client's I/O lock.
struct Op {
  using OnReply =
      std::function<Status(int shard, const Reply& reply, std::span<const Frame> payloads)>;
  Op(int parts, OnReply cb, OpWaiter* w) : remaining(parts), on_reply(std::move(cb)), waiter(w) {}
  std::atomic<bool> done{false};
  Status status;  // the result, written before done is set
  int remaining;
  Status error;
  OnReply on_reply;
  OpWaiter* waiter;  // valid while !done
  int sleepers = 0;  // threads asleep until it is done (they need a notification)

  // Returns whether a thread sleeps until the op is done.
  bool Finish(Status st) {
    status = std::move(st);
    done.store(true, std::memory_order_release);
    return sleepers > 0;
  }
  bool Complete(Status st) {
    if (!st.ok() && error.ok()) error = std::move(st);
    return --remaining == 0 && Finish(error);
  }
};

}  // namespace detail

namespace {

using detail::Op;

struct Pending {
  uint64_t rid = 0;
  int shard = 0;
  Message message;
  std::shared_ptr<Op> op;  // null for heartbeats
  int64_t sent_ms = 0;     // when it was last sent; 0 while it is held (HoldSends)
  // Whether a shard's answering backup may reply to it (a push or a clock): -1 not looked
  // at yet (BackupMayAnswer).
  int8_t backup_answers = -1;
};

// The endpoint of the replica that answers `sv`'s pushes and clocks besides its primary: the
// other member of a two-replica in-sync set, live and registered with
// ReplicaAddress::answers; "" if there is none.
std::string AnsweringBackup(const ShardView& sv) {
  if (!sv.primary || sv.in_sync.size() != 2) return "";
  const uint32_t p = sv.primary->replica;
  if (sv.in_sync[0] != p && sv.in_sync[1] != p) return "";
  const uint32_t other = sv.in_sync[0] == p ? sv.in_sync[1] : sv.in_sync[0];
  for (const ReplicaAddress& a : sv.live) {
    if (a.replica == other) return a.answers ? a.endpoint : "";
  }
  return "";
}

Future Ready(Status st) {
  auto op = std::make_shared<Op>(1, nullptr, nullptr);
  op->Finish(std::move(st));
  return Future(std::move(op));
}

std::vector<int> AllShards(int n) {
  std::vector<int> all(static_cast<size_t>(n));
  for (int s = 0; s < n; ++s) all[static_cast<size_t>(s)] = s;
  return all;
}

// Reply frames read in place from same-host shards' rings (Frame::lent) that PullInPlace
// keeps, in bytes: each keeps its room in a shard's ring until it is released (the next
// iteration's pull). `limit`: a quarter of a ring, so the shard always has room for the
// replies still to come; past it a reply is copied out, as before.
struct LentBudget {
  explicit LentBudget(int64_t bytes) : limit(bytes) {}
  std::atomic<int64_t> held{0};
  const int64_t limit;
};

// `lent` itself, kept (no longer marked lent) and counted in `budget` until its last copy
// goes; an empty frame if it would take the budget past its limit.
Frame KeepLent(const Frame& lent, const std::shared_ptr<LentBudget>& budget) {
  const auto bytes = static_cast<int64_t>(lent.size());
  int64_t held = budget->held.load(std::memory_order_relaxed);
  do {
    if (held + bytes > budget->limit) return Frame();
  } while (!budget->held.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed));
  std::shared_ptr<const void> owner(new Frame(lent), [budget, bytes](const void* p) {
    delete static_cast<const Frame*>(p);
    budget->held.fetch_sub(bytes, std::memory_order_relaxed);
  });
  return Frame::Wrap(lent.data(), lent.size(), std::move(owner));
}

}  // namespace

bool Future::WaitMs(int64_t timeout_ms) const {
  if (!op_) return true;
  if (op_->done.load(std::memory_order_acquire)) return true;
  return op_->waiter->Wait(*op_, timeout_ms);
}

Status Future::get() const {
  if (!op_) return FailedPrecondition("waited on a default-constructed leash::Future");
  WaitMs(-1);
  return op_->status;
}

void Future::wait() const { WaitMs(-1); }

bool Future::ready() const { return !op_ || op_->done.load(std::memory_order_acquire); }

// Every thread may send, one at a time under io_mu_, and one thread at a time is the
// reader: it waits in the transport's Receive without io_mu_ (sends go on meanwhile, as
// transport.h allows), then handles what came under io_mu_, so replies are handled in
// the order they arrived. A thread waiting on a future is the reader itself when it can,
// so its reply reaches it without a hand-off; while it reads, other waiters sleep until
// their op is done or the reader's role is free. The background I/O thread is the reader
// while nobody waits (a waiter that finds it reading wakes it to take over), and sends
// heartbeats and resends.
class Client::Impl final : public detail::OpWaiter {
 public:
  Impl(std::unique_ptr<ClientTransport> transport, const ClientOptions& options)
      : transport_(std::move(transport)),
        options_(options),
        n_(transport_->num_shards()),
        last_heard_(static_cast<size_t>(n_), NowMs()),
        next_reconnect_(static_cast<size_t>(n_), 0),
        backoff_(static_cast<size_t>(n_), 100),
        push_seq_(static_cast<size_t>(n_), 0),
        held_(static_cast<size_t>(n_)),
        silence_ms_(options.shard_silence_ms),
        shared_memory_(transport_->shared_memory()),
        lent_(std::make_shared<LentBudget>(
            shared_memory_ != nullptr ? static_cast<int64_t>(shared_memory_->ring_bytes() / 4)
                                      : 0)),
        stale_(new std::atomic<bool>[static_cast<size_t>(n_)]()) {}

  ~Impl() override { Stop(); }

  void Start() {
    io_ = std::thread([this] { Loop(); });
    if (options_.directory) follow_ = std::thread([this] { Follow(); });
  }

  const ConnectionHealth* health() const { return transport_->health(); }
  std::optional<WritableFrame> ReservePayload(int shard, size_t bytes) {
    return shared_memory_ != nullptr ? shared_memory_->ReservePayload(shard, bytes) : std::nullopt;
  }
  const std::shared_ptr<LentBudget>& lent_budget() const { return lent_; }

  void Stop() {
    if (!io_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(io_mu_);
      stop_.store(true);
    }
    io_cv_.notify_all();
    transport_->Wake();
    io_.join();
    if (follow_.joinable()) follow_.join();
  }

  // Sends one message per shard in `parts` from the calling thread; `build(shard, rid,
  // seq)` makes each message. rid and push sequence numbers are assigned under the I/O
  // lock, so their order is the order messages reach each shard.
  Future Submit(const std::vector<int>& shards,
                const std::function<Message(int, uint64_t, uint64_t)>& build, Op::OnReply on_reply,
                bool is_push = false) {
    auto op = std::make_shared<Op>(static_cast<int>(shards.size()), std::move(on_reply), this);
    if (shards.empty()) {
      op->Finish(Status::Ok());
      return Future(op);
    }
    {
      std::lock_guard<std::mutex> lock(io_mu_);
      if (stop_.load()) {
        op->Finish(Cancelled("client is shut down"));
        return Future(op);
      }
      int64_t now = NowMs();
      for (int s : shards) {
        Pending r;
        r.rid = next_rid_.fetch_add(1);
        r.shard = s;
        uint64_t seq = is_push ? ++push_seq_[static_cast<size_t>(s)] : 0;
        r.message = build(s, r.rid, seq);
        r.op = op;
        uint64_t limit = max_message_bytes_[static_cast<size_t>(s)].load();
        if (limit > 0 &&
            MessageBytes(r.message) > limit) {  // the shard would refuse it, or drop the connection
          op->Complete(ResourceExhausted("a request of " + std::to_string(MessageBytes(r.message)) +
                                         " bytes to shard " + std::to_string(s) +
                                         " exceeds the shard's limit of " + std::to_string(limit) +
                                         " bytes (its --max-message-mb); split it"));
          continue;
        }
        if (inflight_per_shard_[s]++ == 0) last_heard_[static_cast<size_t>(s)] = now;
        ++requests_;
        if (hold_) {
          held_[static_cast<size_t>(s)].push_back(r.message);
          if (first_held_rid_ == 0) first_held_rid_ = r.rid;
        } else {
          SendNow(r);
        }
        uint64_t rid = r.rid;
        inflight_.emplace(rid, std::move(r));
      }
    }
    return Future(op);
  }

  // Requests Submit()s from now on until Flush() are kept and then sent as one batch
  // per shard. Heartbeats and resends are never held.
  void Hold() {
    std::lock_guard<std::mutex> lock(io_mu_);
    hold_ = true;
  }

  void Flush() {
    std::lock_guard<std::mutex> lock(io_mu_);
    FlushLocked();
  }

  bool Wait(Op& op, int64_t timeout_ms) override {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0));
    // A reply that comes within a round trip is read without going to sleep.
    const auto spin_end = start + std::chrono::microseconds(timeout_ms != 0 ? spin_us_ : 0);
    std::unique_lock<std::mutex> lock(io_mu_);
    // A held request would never be answered; an op completed while this thread took
    // io_mu_ needs nothing sent (what is held may wait for the next flush).
    if (!op.done.load(std::memory_order_acquire)) FlushLocked();
    ++waiters_;
    bool kicked = false;
    while (!op.done.load(std::memory_order_acquire)) {
      auto now = std::chrono::steady_clock::now();
      const bool expired = timeout_ms >= 0 && now >= deadline;
      int64_t wait_ms = 50;  // a safety net only: arrivals, completions and Wake end waits
      if (timeout_ms >= 0) {
        wait_ms = std::min<int64_t>(
            wait_ms, std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count());
      }
      if (expired || now < spin_end) wait_ms = 0;
      if (!reading_) {
        bool ok = ReadLocked(lock, wait_ms, /*io_thread=*/false);
        if (expired) break;
        if (ok) continue;
        // A failed transport: wait a little before reading again.
      } else if (expired) {
        break;
      } else if (io_reading_ && !kicked) {
        // The I/O thread waits in Receive: end its wait; it gives the role up for us
        // within microseconds, so look for that before going to sleep.
        kicked = true;
        transport_->Wake();
        lock.unlock();
        auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
        while (reading_flag_.load(std::memory_order_acquire) &&
               std::chrono::steady_clock::now() < until) {
          std::this_thread::yield();
        }
        lock.lock();
        continue;
      }
      ++op.sleepers;
      wait_cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(wait_ms, 1)));
      --op.sleepers;
    }
    --waiters_;
    if (!reading_) {
      if (waiters_ > 0) {
        wait_cv_.notify_all();  // one of them becomes the reader
      } else if (!inflight_.empty()) {
        io_cv_.notify_one();  // the I/O thread reads what is still in flight
      }
    }
    return op.done.load(std::memory_order_acquire);
  }

  // Heartbeats every `interval_ms` (0 stops them). A shard counts as silent only after
  // missing a few heartbeats, so a pull parked behind a straggler is not resent.
  void EnableHeartbeats(uint64_t worker_id, uint64_t incarnation, int64_t interval_ms) {
    hb_worker_.store(worker_id);
    hb_incarnation_.store(incarnation);
    silence_ms_.store(std::max(options_.shard_silence_ms, interval_ms * 5 / 2));
    hb_interval_ms_.store(interval_ms);
    std::lock_guard<std::mutex> lock(io_mu_);
    io_cv_.notify_one();
    if (io_reading_) transport_->Wake();
  }

  ClientCounters counters() const {
    ClientCounters c;
    c.bytes_sent = bytes_sent_.load();
    c.bytes_received = bytes_received_.load();
    c.requests = requests_.load();
    c.resends = resends_.load();
    c.backup_reply_resends = backup_reply_resends_.load();
    c.pushes = pushes_.load();
    c.pulls = pulls_.load();
    c.pulled_min_clock = pulled_min_clock_.load();
    c.push_buffers = push_buffers_.load();
    c.pushes_from_buffer = pushes_from_buffer_.load();
    for (int shard = 0; shard < n_ && shared_memory_ != nullptr; ++shard) {
      c.shared_memory_shards += shared_memory_->ActiveWith(shard) ? 1 : 0;
      c.shared_memory_backups += shared_memory_->ActiveWith(n_ + shard) ? 1 : 0;
    }
    c.answering_backups = backups_connected_.load();
    return c;
  }
  void CountPush() { ++pushes_; }
  void CountPushBuffer() { ++push_buffers_; }
  void CountPushFromBuffer() { ++pushes_from_buffer_; }
  void CountPull() { ++pulls_; }
  // Called on the I/O thread with the minimum clock a pull reply's values reflect.
  void NotePulledMinClock(int64_t min_clock) { pulled_min_clock_.store(min_clock); }
  // With a clock reply: the speeds the shard's live workers reported, summed.
  void NoteClusterRate(double samples_per_second) { cluster_rate_.store(samples_per_second); }
  double cluster_rate() const { return cluster_rate_.load(); }

  int num_shards() const { return n_; }
  bool needs_rejoin() const { return needs_rejoin_.load(); }
  // The largest request `shard` accepts, from its Welcome. Thread-safe.
  void NoteMaxMessage(int shard, uint64_t bytes) {
    max_message_bytes_[static_cast<size_t>(shard)].store(bytes);
  }
  // The clock this worker announced last (re-announced to a shard that restarts).
  void NoteClock(int64_t clock) { last_clock_.store(clock); }
  void clear_needs_rejoin() { needs_rejoin_.store(false); }

 private:
  void FlushLocked() {
    hold_ = false;
    for (int s = 0; s < n_; ++s) {
      std::vector<Message>& held = held_[static_cast<size_t>(s)];
      if (held.empty()) continue;
      Message m = held.size() == 1 ? std::move(held[0]) : PackBatch(std::move(held));
      held.clear();
      Send(s, std::move(m));
    }
    if (first_held_rid_ != 0) {
      // What was held went out now (everything held has a rid from the first one held on).
      const int64_t now = NowMs();
      for (auto it = inflight_.lower_bound(first_held_rid_); it != inflight_.end(); ++it) {
        if (it->second.sent_ms == 0) it->second.sent_ms = now;
      }
      first_held_rid_ = 0;
    }
  }

  void SendNow(Pending& r) {
    r.sent_ms = NowMs();
    Send(r.shard, r.message);
  }

  void Send(int shard, Message m) {
    bytes_sent_ += MessageBytes(m);
    Status st = transport_->Send(shard, std::move(m));
    if (!st.ok()) spdlog::debug("send to shard {} deferred: {}", shard, st.ToString());
  }

  // As the reader: waits up to `wait_ms` for a message without io_mu_ (held by `lock`
  // before and after), then handles it and every other message that is ready, and
  // wakes the waiters whose ops completed. False if the transport failed.
  bool ReadLocked(std::unique_lock<std::mutex>& lock, int64_t wait_ms, bool io_thread) {
    reading_ = true;
    io_reading_ = io_thread;
    reading_flag_.store(true, std::memory_order_release);
    lock.unlock();
    auto in = transport_->Receive(std::chrono::milliseconds(std::max<int64_t>(wait_ms, 0)));
    lock.lock();
    bool ok = in.ok();
    while (ok && in->has_value()) {
      OnMessage((*in)->first, (*in)->second);
      in = transport_->Receive(std::chrono::milliseconds(0));
      ok = in.ok();
    }
    if (!ok) spdlog::error("client transport failed: {}", in.status().ToString());
    reading_ = false;
    io_reading_ = false;
    reading_flag_.store(false, std::memory_order_release);
    if (notify_waiters_) {
      notify_waiters_ = false;
      wait_cv_.notify_all();
    }
    return ok;
  }

  void Loop() {
    int64_t last_hb = 0;
    std::unique_lock<std::mutex> lock(io_mu_);
    while (!stop_.load()) {
      int64_t wait = 50;
      int64_t now = NowMs();
      int64_t hb = hb_interval_ms_.load();
      if (hb > 0 && now - last_hb >= hb) {
        last_hb = now;
        for (int s = 0; s < n_; ++s) {
          Pending r;
          r.rid = next_rid_.fetch_add(1);
          r.shard = s;
          r.message = MakeHeartbeat(r.rid, hb_worker_.load(), hb_incarnation_.load());
          if (inflight_per_shard_[s]++ == 0) last_heard_[static_cast<size_t>(s)] = now;
          SendNow(r);
          inflight_.emplace(r.rid, std::move(r));
        }
        for (int s = 0; s < n_ && backups_connected_ > 0; ++s) {
          if (!backup_[static_cast<size_t>(s)].empty()) HeartbeatBackup(s);
        }
      }
      CheckSilence(now);
      CheckBackupAnswers(now);
      if (hb > 0) wait = std::clamp<int64_t>(last_hb + hb - now, 1, 50);
      // While threads wait on futures they read the connections; this one keeps time.
      if (waiters_ > 0 || reading_) {
        io_cv_.wait_for(lock, std::chrono::milliseconds(wait));
        continue;
      }
      if (!ReadLocked(lock, wait, /*io_thread=*/true)) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        lock.lock();
      }
      if (waiters_ > 0) wait_cv_.notify_all();  // the reader's role is free for them
    }
    for (auto& [rid, r] : inflight_) {
      if (r.op && r.op->Complete(Cancelled("client shut down before shard " +
                                           std::to_string(r.shard) + " replied"))) {
        notify_waiters_ = true;
      }
    }
    inflight_.clear();
    if (notify_waiters_) wait_cv_.notify_all();
  }

  // A shard that answers with a new boot id restarted and lost whatever was in flight to
  // it (the connection itself survived: ZeroMQ reconnected on its own). Resend it all, in
  // the original order.
  void NoteBoot(int shard, uint64_t boot_id) {
    uint64_t& known = boot_ids_[shard];
    if (known == boot_id || boot_id == 0) return;
    bool restarted = known != 0;
    known = boot_id;
    if (!restarted) return;
    // The restarted shard knows this worker's clock as of its snapshot; tell it where the
    // worker is now, before anything else, or pulls would wait for a clock already sent.
    if (hb_interval_ms_.load() > 0) {
      Pending c;
      c.rid = next_rid_.fetch_add(1);
      c.shard = shard;
      c.message = MakeClock(c.rid, hb_worker_.load(), last_clock_.load());
      ++inflight_per_shard_[shard];
      SendNow(c);
      inflight_.emplace(c.rid, std::move(c));
    }
    int n = 0;
    for (auto& [rid, r] : inflight_) {
      if (r.shard == shard && r.op) {
        ++resends_;
        ++n;
        SendNow(r);
      }
    }
    spdlog::warn("shard {} restarted; resent {} pending request(s)", shard, n);
  }

  // The directory thread: watches the shard directory and moves a shard's connection to its
  // new primary (a new endpoint, or a new term at the same one, or a shard whose replica said
  // it is a backup). A shard without a primary (an election under way) keeps its requests
  // pending until one is named.
  //
  // It also connects each shard's answering backup (AnsweringBackup), if any: that replica
  // sends the replies of pushes and clocks itself, and the primary drops its own.
  void Follow() {
    ClusterView known = options_.directory_view;
    std::vector<std::string> targets(static_cast<size_t>(n_));
    std::vector<uint64_t> terms(static_cast<size_t>(n_), 0);
    for (size_t s = 0; s < targets.size() && s < known.shards.size(); ++s) {
      if (known.shards[s].primary) targets[s] = known.shards[s].primary->endpoint;
      terms[s] = known.shards[s].term;
    }
    // The answering backup each shard is connected to ("" none); the first view connects
    // those of the view the transport was made from.
    std::vector<std::string> backups(static_cast<size_t>(n_));
    for (int s = 0; s < n_ && static_cast<size_t>(s) < known.shards.size(); ++s) {
      auto i = static_cast<size_t>(s);
      if (std::string b = AnsweringBackup(known.shards[i]); !b.empty()) {
        SetBackup(s, b, /*resend=*/false);
        backups[i] = std::move(b);
      }
    }
    int64_t revision = known.revision;
    int64_t last_error_log = 0;
    while (!stop_.load()) {
      const bool refresh = refresh_.exchange(false);
      if (refresh) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      auto view = refresh
                      ? options_.directory->View()
                      : options_.directory->WaitForChange(revision, std::chrono::milliseconds(500));
      if (!view.ok()) {
        if (NowMs() - last_error_log >= 10000) {
          last_error_log = NowMs();
          spdlog::warn(
              "shard directory unreachable (training goes on with the known "
              "primaries): {}",
              view.status().ToString());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        continue;
      }
      revision = view->revision;
      for (int s = 0; s < n_ && static_cast<size_t>(s) < view->shards.size(); ++s) {
        auto i = static_cast<size_t>(s);
        const ShardView& sv = view->shards[i];
        bool retargeted = false;
        if (sv.primary) {
          const bool moved = sv.primary->endpoint != targets[i];
          const bool stale = stale_[i].exchange(false);
          if (moved || sv.term != terms[i] || stale) {
            if (!Retarget(s, sv.primary->endpoint, sv.term, moved)) {
              stale_[i].store(true);
              refresh_.store(true);
              continue;  // the backup too waits for the primary's connection
            }
            targets[i] = sv.primary->endpoint;
            terms[i] = sv.term;
            retargeted = true;
          }
        }
        std::string b = AnsweringBackup(sv);
        if (b != backups[i]) {
          // Retarget resent everything pending already.
          SetBackup(s, b, /*resend=*/!retargeted);
          backups[i] = std::move(b);
        } else if (retargeted && !b.empty()) {
          // The same backup under a new primary or term: it learns this worker's connection
          // again now rather than at the next heartbeat.
          std::lock_guard<std::mutex> lock(io_mu_);
          if (!backup_[i].empty() && hb_interval_ms_.load() > 0) HeartbeatBackup(s);
        }
      }
    }
  }

  // Connects `shard`'s answering backup at `endpoint` ("" closes it) and, with heartbeats
  // on, introduces this worker to it with one heartbeat. `resend`: if a backup was connected
  // before, the pushes and clocks it may have promised to answer go to the primary again
  // now (it may have died, or was dropped from the in-sync set, with replies owed).
  void SetBackup(int shard, const std::string& endpoint, bool resend) {
    std::lock_guard<std::mutex> lock(io_mu_);
    auto i = static_cast<size_t>(shard);
    const std::string old = backup_[i];
    if (!old.empty()) --backups_connected_;
    backup_[i].clear();
    Status st = transport_->ConnectBackup(shard, endpoint);
    if (!st.ok()) {
      spdlog::warn("shard {}: cannot connect to its answering backup at {}: {}", shard, endpoint,
                   st.ToString());
    } else if (!endpoint.empty()) {
      backup_[i] = endpoint;
      ++backups_connected_;
      spdlog::info("shard {}: its backup at {} answers pushes and clocks; connected to it", shard,
                   endpoint);
      if (hb_interval_ms_.load() > 0) HeartbeatBackup(shard);
    } else {
      spdlog::info("shard {}: no backup answers pushes and clocks now (was {})", shard, old);
    }
    if (resend && !old.empty()) {
      int n = 0;
      for (auto& [rid, r] : inflight_) {
        if (r.shard == shard && r.op && r.sent_ms != 0 && BackupMayAnswer(r)) {
          ++backup_reply_resends_;
          ++n;
          SendNow(r);
        }
      }
      if (n > 0) {
        spdlog::warn(
            "shard {}: resent {} push/clock request(s) to its primary (the backup at {} "
            "no longer answers them)",
            shard, n, old);
      }
    }
  }

  // A heartbeat on `shard`'s backup connection, not tracked: the backup learns this worker's
  // connection from it (worker id, incarnation) and answers nothing. Under io_mu_.
  void HeartbeatBackup(int shard) {
    Send(n_ + shard,
         MakeHeartbeat(next_rid_.fetch_add(1), hb_worker_.load(), hb_incarnation_.load()));
  }

  // Whether `shard`'s answering backup may answer `r` (a push or a clock). Under io_mu_.
  static bool BackupMayAnswer(Pending& r) {
    if (r.backup_answers < 0) {
      const RequestPeek::Kind kind = PeekRequest(r.message).kind;
      r.backup_answers = kind == RequestPeek::kPush || kind == RequestPeek::kClock ? 1 : 0;
    }
    return r.backup_answers == 1;
  }

  // The safety net of answering backups: a backup's reply can be lost (it died after telling
  // the primary it would answer, or it did not know this worker's connection), and the
  // primary sent none. A push or clock pending on a shard with an answering backup that
  // went unanswered for a few heartbeats goes to the primary again (pushes are deduplicated
  // by sequence, clocks are idempotent), once per such period. Under io_mu_.
  void CheckBackupAnswers(int64_t now) {
    // Every 100 ms at most: the period is a second or more, and this walks every request.
    if (backups_connected_ == 0 || now < next_backup_check_ms_) return;
    next_backup_check_ms_ = now + 100;
    const int64_t hb = hb_interval_ms_.load();
    const int64_t period = hb > 0 ? std::max<int64_t>(4 * hb, 1000) : 1000;
    uint64_t n = 0;
    for (auto& [rid, r] : inflight_) {
      if (!r.op || r.sent_ms == 0 || now - r.sent_ms < period ||
          backup_[static_cast<size_t>(r.shard)].empty() || !BackupMayAnswer(r)) {
        continue;
      }
      ++backup_reply_resends_;
      ++n;
      SendNow(r);
    }
    backup_resends_unlogged_ += n;
    if (backup_resends_unlogged_ > 0 && now - backup_resends_logged_ms_ >= 10000) {
      spdlog::warn(
          "{} push/clock request(s) resent to their shards' primaries: no answer from the "
          "answering backup within {} ms",
          backup_resends_unlogged_, period);
      backup_resends_unlogged_ = 0;
      backup_resends_logged_ms_ = now;
    }
  }

  // Points `shard` at its primary `endpoint` (reopening the connection if `reopen`) and
  // resends every request still pending on it, in the original order. False if the
  // transport could not.
  bool Retarget(int shard, const std::string& endpoint, uint64_t term, bool reopen) {
    std::lock_guard<std::mutex> lock(io_mu_);
    if (reopen) {
      Status st = transport_->Retarget(shard, endpoint);
      if (!st.ok()) {
        spdlog::warn("cannot move shard {} to its primary at {}: {}", shard, endpoint,
                     st.ToString());
        return false;
      }
      // The new primary holds the replicated state (registrations, clocks, exactly-once
      // records): its boot id is news, not a restart that lost this worker's requests.
      boot_ids_.erase(shard);
    }
    auto i = static_cast<size_t>(shard);
    int n = 0;
    for (auto it = inflight_.begin(); it != inflight_.end();) {
      if (it->second.shard != shard) {
        ++it;
      } else if (!it->second.op) {  // a heartbeat: drop, the next one follows
        --inflight_per_shard_[shard];
        it = inflight_.erase(it);
      } else {
        ++resends_;
        ++n;
        SendNow(it->second);
        ++it;
      }
    }
    last_heard_[i] = NowMs();
    backoff_[i] = 100;
    next_reconnect_[i] = 0;
    spdlog::warn("shard {}: primary is {} (term {}); resent {} pending request(s)", shard, endpoint,
                 term, n);
    return true;
  }

  // A shard that stays silent while requests wait on it is reconnected with backoff and
  // sent every pending request again, in the original order. Pulls, clocks and
  // registrations are idempotent; pushes are deduplicated by sequence on the shard.
  void CheckSilence(int64_t now) {
    for (int s = 0; s < n_; ++s) {
      auto i = static_cast<size_t>(s);
      if (inflight_per_shard_[s] == 0 || now - last_heard_[i] < silence_ms_.load() ||
          now < next_reconnect_[i]) {
        continue;
      }
      spdlog::warn("shard {} silent for {} ms with {} requests pending; reconnecting and resending",
                   s, now - last_heard_[i], inflight_per_shard_[s]);
      Status st = transport_->Reconnect(s);
      if (!st.ok()) spdlog::warn("reconnect to shard {} failed: {}", s, st.ToString());
      for (auto it = inflight_.begin(); it != inflight_.end();) {
        if (it->second.shard != s) {
          ++it;
        } else if (!it->second.op) {  // stale heartbeat: drop, a new one follows
          --inflight_per_shard_[s];
          it = inflight_.erase(it);
        } else {
          ++resends_;
          SendNow(it->second);
          ++it;
        }
      }
      next_reconnect_[i] = now + backoff_[i];
      backoff_[i] = std::min<int64_t>(backoff_[i] * 2, 5000);
    }
  }

  void OnMessage(int shard, const Message& msg) {
    if (shard >= n_) {
      OnBackupMessage(shard - n_, msg);
      return;
    }
    if (IsBatch(msg)) {
      auto replies = UnpackBatch(msg);
      if (!replies.ok()) {
        spdlog::error("shard {} sent an unreadable batch of replies: {}", shard,
                      replies.status().ToString());
        return;
      }
      bytes_received_ += msg[0].size();
      for (const Message& r : *replies) OnMessage(shard, r);
      return;
    }
    auto si = static_cast<size_t>(shard);
    bytes_received_ += MessageBytes(msg);
    last_heard_[si] = NowMs();
    backoff_[si] = 100;
    next_reconnect_[si] = 0;
    auto decoded = DecodeReply(msg);
    if (!decoded.ok()) {
      spdlog::error("shard {} sent an unreadable reply: {}", shard, decoded.status().ToString());
      return;
    }
    auto it = inflight_.find(decoded->request_id);
    if (it == inflight_.end()) return;  // a late duplicate of a resent request
    const Reply& reply = decoded->value;
    if (const auto* e = std::get_if<ErrorReply>(&reply);
        e != nullptr && options_.directory && IsBackupRefusal(e->status)) {
      // Sent to a replica that is not (or no longer) the primary: the request stays pending
      // until the directory names the primary, then goes there (Follow).
      if (!it->second.op) {
        inflight_.erase(it);
        --inflight_per_shard_[shard];
      }
      if (!stale_[si].exchange(true)) {
        spdlog::info("shard {}: {}; waiting for the directory", shard, e->status.message());
      }
      refresh_.store(true);
      return;
    }
    Pending r = std::move(it->second);
    inflight_.erase(it);
    --inflight_per_shard_[shard];
    if (const auto* e = std::get_if<ErrorReply>(&reply)) {
      NoteBoot(shard, e->boot_id);
      Status st = e->status.WithContext("shard " + std::to_string(shard));
      if (st.code() == StatusCode::kNotRegistered) needs_rejoin_.store(true);
      if (r.op) {
        if (r.op->Complete(std::move(st))) notify_waiters_ = true;
      } else if (st.code() != StatusCode::kNotRegistered) {
        spdlog::warn("heartbeat rejected: {}", st.ToString());
      }
      return;
    }
    if (!r.op) {  // heartbeat acknowledged
      if (const auto* hb = std::get_if<HeartbeatReply>(&reply)) NoteBoot(shard, hb->boot_id);
      return;
    }
    if (const auto* w = std::get_if<Welcome>(&reply)) NoteBoot(shard, w->boot_id);
    if (r.op->Complete(r.op->on_reply ? r.op->on_reply(shard, reply, decoded->payloads)
                                      : Status::Ok())) {
      notify_waiters_ = true;
    }
  }

  // A message from `shard`'s answering backup: the reply of a push or clock pending on that
  // shard completes it as the primary's would; anything else is ignored. Says nothing of
  // the primary's health (last_heard_, boot ids, the directory).
  void OnBackupMessage(int shard, const Message& msg) {
    if (IsBatch(msg)) {
      auto replies = UnpackBatch(msg);
      if (!replies.ok()) {
        spdlog::debug("shard {}'s backup sent an unreadable batch: {}", shard,
                      replies.status().ToString());
        return;
      }
      bytes_received_ += msg[0].size();
      for (const Message& r : *replies) OnBackupMessage(shard, r);
      return;
    }
    bytes_received_ += MessageBytes(msg);
    auto decoded = DecodeReply(msg);
    if (!decoded.ok()) {
      spdlog::debug("shard {}'s backup sent an unreadable reply: {}", shard,
                    decoded.status().ToString());
      return;
    }
    auto it = inflight_.find(decoded->request_id);
    // Heartbeats to a backup are not tracked; other requests are the primary's to answer.
    if (it == inflight_.end() || it->second.shard != shard || !it->second.op ||
        !BackupMayAnswer(it->second)) {
      return;
    }
    const Reply& reply = decoded->value;
    const auto* e = std::get_if<ErrorReply>(&reply);
    if (e != nullptr && IsBackupRefusal(e->status)) return;
    if (e == nullptr && !std::holds_alternative<PushReply>(reply) &&
        !std::holds_alternative<ClockReply>(reply)) {
      spdlog::debug("shard {}'s backup answered request {} with an unexpected reply", shard,
                    decoded->request_id);
      return;
    }
    Pending r = std::move(it->second);
    inflight_.erase(it);
    --inflight_per_shard_[shard];
    Status st = Status::Ok();
    if (e != nullptr) {
      st = e->status.WithContext("shard " + std::to_string(shard));
      if (st.code() == StatusCode::kNotRegistered) needs_rejoin_.store(true);
    } else if (r.op->on_reply) {
      st = r.op->on_reply(shard, reply, decoded->payloads);
    }
    if (r.op->Complete(std::move(st))) notify_waiters_ = true;
  }

  std::unique_ptr<ClientTransport> transport_;
  ClientOptions options_;
  int n_;
  // Guards sends and the state below it; never held while waiting.
  std::mutex io_mu_;
  std::condition_variable wait_cv_;        // waiters that are not the reader sleep here
  std::condition_variable io_cv_;          // the I/O thread sleeps here while others read
  bool reading_ = false;                   // a thread is the reader (under io_mu_)
  bool io_reading_ = false;                // ... and it is the I/O thread (under io_mu_)
  std::atomic<bool> reading_flag_{false};  // reading_, for a waiter spinning without io_mu_
  bool notify_waiters_ = false;            // an op with sleepers completed (under io_mu_)
  int waiters_ = 0;                        // threads waiting on futures (under io_mu_)
  // Taken under io_mu_, so rid order is send order.
  std::atomic<uint64_t> next_rid_{1};
  std::thread io_;
  std::thread follow_;  // Follow(), with a directory only
  std::atomic<bool> stop_{false};
  std::atomic<bool> refresh_{false};  // Follow() reads the directory now, not on a change

  // Under io_mu_.
  std::map<uint64_t, Pending> inflight_;  // ordered by rid = send order
  std::map<int, int64_t> inflight_per_shard_;
  std::vector<int64_t> last_heard_;
  std::vector<int64_t> next_reconnect_;
  std::vector<int64_t> backoff_;
  std::vector<uint64_t> push_seq_;
  // Per shard, the endpoint of the answering backup connected to ("" none), and how many
  // are connected.
  std::vector<std::string> backup_ = std::vector<std::string>(static_cast<size_t>(n_));
  std::atomic<int> backups_connected_{0};  // changed under io_mu_; read by counters()
  uint64_t backup_resends_unlogged_ = 0;   // safety-net resends since the last warning
  int64_t backup_resends_logged_ms_ = 0;
  int64_t next_backup_check_ms_ = 0;        // CheckBackupAnswers' next walk
  uint64_t first_held_rid_ = 0;             // the first request held since the last flush
  bool hold_ = false;                       // under io_mu_
  std::vector<std::vector<Message>> held_;  // per shard, under io_mu_
  std::atomic<uint64_t> hb_worker_{0};
  std::atomic<uint64_t> hb_incarnation_{0};
  std::atomic<int64_t> silence_ms_{0};
  std::unique_ptr<std::atomic<uint64_t>[]> max_message_bytes_ {
    new std::atomic<uint64_t>[ static_cast<size_t>(n_) ]()
  };
  std::atomic<int64_t> hb_interval_ms_{0};

  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> resends_{0};
  std::atomic<uint64_t> backup_reply_resends_{0};
  std::atomic<uint64_t> pushes_{0};
  std::atomic<uint64_t> pulls_{0};
  std::atomic<uint64_t> push_buffers_{0};
  std::atomic<uint64_t> pushes_from_buffer_{0};
  std::atomic<int64_t> pulled_min_clock_{-1};
  std::atomic<double> cluster_rate_{0};
  std::atomic<bool> needs_rejoin_{false};
  std::map<int, uint64_t> boot_ids_;  // under io_mu_
  std::atomic<int64_t> last_clock_{0};
  ClientSharedMemory* shared_memory_;  // the transport's, or null
  std::shared_ptr<LentBudget> lent_;   // PullInPlace's (it outlives the client in frames)
  int64_t spin_us_ = options_.reply_spin_us;
  // Per shard: a replica said it is a backup; Follow() resends once a primary is named.
  std::unique_ptr<std::atomic<bool>[]> stale_;
};

Client::Client(ClientOptions options, int num_shards)
    : options_(std::move(options)), num_shards_(num_shards) {}

Client::~Client() {
  if (impl_) impl_->Stop();
}

uint64_t NewIncarnation(uint64_t previous) {
  auto now = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::system_clock::now().time_since_epoch())
                                       .count());
  return std::max(now, previous + 1);
}

std::vector<std::string> PrimaryEndpoints(const ClusterView& view) {
  std::vector<std::string> endpoints;
  for (const ShardView& s : view.shards) {
    LEASH_CHECK(s.primary.has_value());
    endpoints.push_back(s.primary->endpoint);
  }
  return endpoints;
}

Result<ClusterView> ResolvePrimaries(ShardDirectory& directory, int64_t timeout_ms,
                                     const std::function<bool()>& interrupted) {
  const int64_t start = NowMs();
  int64_t last_log = start;
  int64_t revision = 0;
  std::string missing;
  Status unreachable;  // the directory's latest error; Ok once it answers
  while (true) {
    auto view = revision == 0 ? directory.View()
                              : directory.WaitForChange(revision, std::chrono::milliseconds(500));
    if (view.ok()) {
      unreachable = Status::Ok();
      revision = view->revision;
      missing.clear();
      for (const ShardView& s : view->shards) {
        if (!s.primary) missing += (missing.empty() ? "" : ", ") + std::to_string(s.shard);
      }
      if (view->num_shards > 0 && view->shards.size() == view->num_shards && missing.empty()) {
        return std::move(*view);
      }
      if (view->shards.size() != view->num_shards) {
        missing = "(not all registered yet)";
      }
    } else {
      // NotFound: the directory answered but knows no replica of the job yet.
      if (view.status().code() == StatusCode::kNotFound) {
        unreachable = Status::Ok();
        missing = "(" + view.status().message() + ")";
      } else {
        unreachable = view.status();
      }
      revision = 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    const int64_t now = NowMs();
    if (interrupted && interrupted()) {
      return Cancelled("interrupted while waiting for the shards' primaries");
    }
    if (now - start >= timeout_ms && !unreachable.ok()) {
      return Unavailable("the shard directory did not answer within " + std::to_string(timeout_ms) +
                         " ms: " + unreachable.message());
    }
    if (now - start >= timeout_ms) {
      return Unavailable("no primary for shard(s) " + missing + " after " +
                         std::to_string(timeout_ms) +
                         " ms; check that every replica of the job runs (leashctl --etcd URL "
                         "--job NAME status)");
    }
    if (now - last_log >= 3000) {
      last_log = now;
      spdlog::info("waiting for the primary of shard(s) {} ({} s so far)",
                   unreachable.ok() ? missing : unreachable.ToString(), (now - start) / 1000);
    }
  }
}

Result<std::unique_ptr<Client>> Client::Connect(std::unique_ptr<ClientTransport> transport,
                                                ClientOptions options) {
  if (!transport) return InvalidArgument("Client::Connect needs a transport");
  if (options.staleness < 0) return InvalidArgument("staleness must be >= 0");
  if (options.worker_id == 0) {
    std::random_device rd;
    options.worker_id = (static_cast<uint64_t>(rd()) << 32 | rd()) | 1;
  }
  int n = transport->num_shards();
  std::unique_ptr<Client> c(new Client(options, n));
  c->incarnation_ = NewIncarnation(0);
  c->impl_ = std::make_unique<Impl>(std::move(transport), c->options_);
  c->impl_->Start();
  if (c->options_.register_worker) {
    LEASH_RETURN_IF_ERROR(c->Register());
    return c;
  }
  // Tools that do not register still make sure every shard answers.
  auto answered = std::make_shared<std::vector<bool>>(static_cast<size_t>(n), false);
  auto fut = c->impl_->Submit(
      AllShards(n), [](int, uint64_t rid, uint64_t) { return MakeStats(rid); },
      [answered](int shard, const Reply&, std::span<const Frame>) -> Status {
        (*answered)[static_cast<size_t>(shard)] = true;
        return Status::Ok();
      });
  LEASH_RETURN_IF_ERROR(c->WaitForShards(fut, *answered));
  return c;
}

Status Client::WaitForShards(Future& fut, const std::vector<bool>& answered) {
  // Polls, so that a shard the transport knows is refusing us (e.g. a refused CURVE key,
  // which ZeroMQ reports only through its socket monitor) fails Connect at once.
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.connect_timeout_ms);
  while (fut.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    if (options_.interrupted && options_.interrupted()) {
      return Cancelled("interrupted while waiting for the shards to answer");
    }
    for (int s = 0; s < num_shards_; ++s) {
      const ConnectionHealth* h = impl_->health();
      Status health = h != nullptr ? h->ShardHealth(s) : Status::Ok();
      if (!health.ok()) return health;
    }
    if (std::chrono::steady_clock::now() < deadline) continue;
    std::string missing;
    for (size_t s = 0; s < answered.size(); ++s) {
      if (!answered[s]) missing += (missing.empty() ? "" : ", ") + std::to_string(s);
    }
    return Unavailable(
        "shard(s) " + missing + " did not answer within " +
        std::to_string(options_.connect_timeout_ms) +
        " ms; check that leash-server is running and --servers / LEASH_SERVERS is right");
  }
  return fut.get();
}

Status Client::Await(const Future& fut) const {
  if (!options_.interrupted) return fut.get();
  while (fut.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    if (options_.interrupted()) return Cancelled("interrupted while waiting for a reply");
  }
  return fut.get();
}

Status Client::Register() {
  int n = num_shards_;
  uint64_t incarnation = incarnation_.load();
  auto starts = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(n), 0);
  auto lease = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(n), 0);
  auto answered = std::make_shared<std::vector<bool>>(static_cast<size_t>(n), false);
  auto fut = impl_->Submit(
      AllShards(n),
      [&](int, uint64_t rid, uint64_t) {
        return MakeRegister(rid, options_.worker_id, incarnation, options_.name);
      },
      [starts, lease, answered, n, impl = impl_.get()](int shard, const Reply& reply,
                                                       std::span<const Frame>) -> Status {
        const auto* w = std::get_if<Welcome>(&reply);
        if (w == nullptr) return Internal("shard answered Register without a Welcome");
        impl->NoteMaxMessage(shard, w->max_message_bytes);
        if (static_cast<int>(w->num_shards) != n || static_cast<int>(w->shard) != shard) {
          return FailedPrecondition("server #" + std::to_string(shard) +
                                    " in --servers says it is shard " + std::to_string(w->shard) +
                                    " of " + std::to_string(w->num_shards) +
                                    "; list the shards in order, all of them");
        }
        (*starts)[static_cast<size_t>(shard)] = w->start_clock;
        (*lease)[static_cast<size_t>(shard)] = w->lease_ms;
        (*answered)[static_cast<size_t>(shard)] = true;
        return Status::Ok();
      });
  LEASH_RETURN_IF_ERROR(WaitForShards(fut, *answered));
  int64_t start = *std::max_element(starts->begin(), starts->end());
  int64_t min_lease = *std::min_element(lease->begin(), lease->end());
  clock_.store(start);
  impl_->NoteClock(start);
  int64_t hb = options_.heartbeat_ms > 0 ? options_.heartbeat_ms
                                         : std::clamp<int64_t>(min_lease / 4, 10, 1000);
  impl_->EnableHeartbeats(options_.worker_id, incarnation, hb);
  if (*std::min_element(starts->begin(), starts->end()) != start) {
    clock_.store(start - 1);
    LEASH_RETURN_IF_ERROR(Await(Clock()));  // bring every shard to the same start clock
  }
  spdlog::info(
      "worker {:016x} '{}' (incarnation {}) registered with {} shard(s), starting at clock {}",
      options_.worker_id, options_.name, incarnation, n, start);
  return Status::Ok();
}

bool Client::needs_rejoin() const { return impl_->needs_rejoin(); }

Status Client::Rejoin() {
  impl_->EnableHeartbeats(options_.worker_id, incarnation_.load(), 0);
  incarnation_ = NewIncarnation(incarnation_.load());
  impl_->clear_needs_rejoin();
  spdlog::warn(
      "worker {:016x} was dropped by a shard (evicted or the shard restarted); rejoining as "
      "incarnation {}",
      options_.worker_id, incarnation_.load());
  return Register();
}

Result<ChunkGrant> Client::NextChunk(const DataPlan& plan, const ChunkDone* done,
                                     float samples_per_second, float others_samples_per_second) {
  auto grant = std::make_shared<ChunkGrant>();
  ChunkRequest request;
  request.worker_id = options_.worker_id;
  request.incarnation = incarnation_.load();
  request.plan = plan;
  if (done != nullptr) request.done = *done;
  request.samples_per_second = samples_per_second;
  request.others_samples_per_second = others_samples_per_second;
  auto fut = impl_->Submit(
      {0}, [&](int, uint64_t rid, uint64_t) { return EncodeRequest(rid, request); },
      [grant](int, const Reply& reply, std::span<const Frame>) -> Status {
        const auto* g = std::get_if<ChunkGrant>(&reply);
        if (g == nullptr) return Internal("unexpected reply to a chunk request");
        *grant = *g;
        return Status::Ok();
      });
  LEASH_RETURN_IF_ERROR(Await(fut).WithContext("data chunk lease"));
  if (grant->kind == ChunkGrant::Kind::kChunk &&
      (grant->end <= grant->begin || grant->end > plan.num_samples)) {
    return Internal("shard 0 leased an empty or out-of-range chunk");
  }
  return *grant;
}

Result<TableHandle> Client::CreateTable(const TableSpec& t) {
  auto ids = std::make_shared<std::vector<uint32_t>>(static_cast<size_t>(num_shards_), 0);
  std::vector<int> all = AllShards(num_shards_);
  auto fut = impl_->Submit(
      all, [&](int, uint64_t rid, uint64_t) { return MakeCreateTable(rid, t); },
      [ids](int shard, const Reply& reply, std::span<const Frame>) -> Status {
        const auto* tc = std::get_if<TableCreated>(&reply);
        if (tc == nullptr) return Internal("unexpected reply to CreateTable");
        (*ids)[static_cast<size_t>(shard)] = tc->table_id;
        return Status::Ok();
      });
  LEASH_RETURN_IF_ERROR(Await(fut).WithContext("create table '" + t.name + "'"));
  TableHandle h;
  h.name = t.name;
  h.rows = t.rows;
  h.cols = t.cols;
  h.kind = t.kind;
  h.shard_ids = *ids;
  return h;
}

namespace {

// The pull reply in `reply`, checked to hold rows x cols values in one payload frame.
Result<const PullReply*> CheckPullReply(const Reply& reply, std::span<const Frame> payloads,
                                        size_t rows, uint32_t cols) {
  const auto* r = std::get_if<PullReply>(&reply);
  if (r == nullptr) return Internal("unexpected reply to Pull");
  if (r->num_rows != rows || r->cols != cols) {
    return Internal("pull reply has " + std::to_string(r->num_rows) + " x " +
                    std::to_string(r->cols) + " values, expected " + std::to_string(rows) + " x " +
                    std::to_string(cols));
  }
  if (payloads.size() != 1) return Internal("pull reply without exactly one payload frame");
  return r;
}

Status NotDense(const TableHandle& t, const char* call) {
  return InvalidArgument("table '" + t.name + "' is sparse: use " + call + "Sparse, not " + call);
}

// The keys of a sparse request, each named once, grouped by the shard that owns them.
// unique[s] are shard s's keys; for the u-th of them, first[s][u] is its first position
// in the request and next[j] the next position of the key at position j (kNone: none).
struct SparseSplit {
  static constexpr uint32_t kNone = UINT32_MAX;
  std::vector<std::vector<uint64_t>> unique;
  std::vector<std::vector<uint32_t>> first;
  std::vector<uint32_t> next;
  std::vector<int> shards;  // the shards with keys

  SparseSplit(std::span<const uint64_t> keys, int num_shards)
      : unique(static_cast<size_t>(num_shards)),
        first(static_cast<size_t>(num_shards)),
        next(keys.size(), kNone) {
    // key -> (its shard, its index in unique[shard], its last position so far)
    struct Seen {
      int shard;
      uint32_t index;
      uint32_t last;
    };
    std::unordered_map<uint64_t, Seen> seen;
    seen.reserve(keys.size());
    for (size_t j = 0; j < keys.size(); ++j) {
      auto [it, fresh] = seen.try_emplace(keys[j]);
      if (fresh) {
        int s = SparseOwner(keys[j], num_shards);
        auto& u = unique[static_cast<size_t>(s)];
        it->second = {s, static_cast<uint32_t>(u.size()), static_cast<uint32_t>(j)};
        u.push_back(keys[j]);
        first[static_cast<size_t>(s)].push_back(static_cast<uint32_t>(j));
      } else {
        next[it->second.last] = static_cast<uint32_t>(j);
        it->second.last = static_cast<uint32_t>(j);
      }
    }
    for (int s = 0; s < num_shards; ++s) {
      if (!unique[static_cast<size_t>(s)].empty()) shards.push_back(s);
    }
  }
};

Status CheckSparse(const TableHandle& t, std::span<const uint64_t> keys, const char* call) {
  if (t.kind != TableKind::kSparse) {
    return InvalidArgument("table '" + t.name + "' is dense: use " + call + ", not " + call +
                           "Sparse");
  }
  if (keys.size() >= SparseSplit::kNone) {
    return InvalidArgument(std::string(call) + "Sparse of " + std::to_string(keys.size()) +
                           " keys: split it into requests of fewer than 2^32 keys");
  }
  return Status::Ok();
}

// The shards holding at least one row of a dense table of `rows` rows, in order (with
// fewer rows than shards, the last ones hold none).
std::vector<int> ShardsWithRows(const RangePartitioner& part, uint64_t rows) {
  std::vector<int> shards;
  for (int s = 0; s < part.num_shards(); ++s) {
    if (part.Range(rows, s).size() > 0) shards.push_back(s);
  }
  return shards;
}

}  // namespace

Future Client::PullSparse(const TableHandle& table, std::span<const uint64_t> keys, float* out,
                          int64_t for_clock) {
  if (Status st = CheckSparse(table, keys, "Pull"); !st.ok()) return Ready(st);
  auto split = std::make_shared<SparseSplit>(keys, num_shards_);
  int64_t clock = for_clock >= 0 ? for_clock : clock_.load();
  auto dtype = options_.wire_dtype;
  const uint32_t cols = table.cols;
  Impl* impl = impl_.get();
  impl->CountPull();
  return impl_->Submit(
      split->shards,
      [&](int s, uint64_t rid, uint64_t) {
        return EncodeRequest(
            rid, PullRequest{table.shard_ids[static_cast<size_t>(s)],
                             Rows::Keys(split->unique[static_cast<size_t>(s)]), options_.worker_id,
                             clock, options_.staleness, dtype});
      },
      [split, cols, out, impl](int s, const Reply& reply,
                               std::span<const Frame> payloads) -> Status {
        const auto& first = split->first[static_cast<size_t>(s)];
        LEASH_ASSIGN_OR_RETURN(const PullReply* r,
                               CheckPullReply(reply, payloads, first.size(), cols));
        impl->NotePulledMinClock(r->min_clock);
        size_t n = first.size() * cols;
        std::vector<float> rows(n);
        LEASH_RETURN_IF_ERROR(DecodeValues(payloads[0], r->dtype, n, rows.data()));
        for (size_t u = 0; u < first.size(); ++u) {
          for (uint32_t j = first[u]; j != SparseSplit::kNone; j = split->next[j]) {
            std::copy_n(rows.data() + u * cols, cols, out + size_t{j} * cols);
          }
        }
        return Status::Ok();
      });
}

Future Client::PushSparse(const TableHandle& table, std::span<const uint64_t> keys,
                          const float* grad, PushWeight weight) {
  if (Status st = CheckSparse(table, keys, "Push"); !st.ok()) return Ready(st);
  SparseSplit split(keys, num_shards_);
  const uint32_t cols = table.cols;
  std::vector<Frame> payloads(static_cast<size_t>(num_shards_));
  std::vector<float> sum;
  for (int s : split.shards) {
    const auto& first = split.first[static_cast<size_t>(s)];
    sum.assign(first.size() * cols, 0.f);
    for (size_t u = 0; u < first.size(); ++u) {
      float* acc = sum.data() + u * cols;
      for (uint32_t j = first[u]; j != SparseSplit::kNone; j = split.next[j]) {
        const float* g = grad + size_t{j} * cols;
        for (uint32_t c = 0; c < cols; ++c) acc[c] += g[c];
      }
    }
    std::span<const float> values(sum);
    if (auto w = impl_->ReservePayload(s, values.size() * DTypeSize(options_.wire_dtype))) {
      EncodeValuesInto(values, options_.wire_dtype, w->data);
      payloads[static_cast<size_t>(s)] = std::move(w->frame);
    } else {
      payloads[static_cast<size_t>(s)] = EncodeValues(values, options_.wire_dtype);
    }
  }
  impl_->CountPush();
  return impl_->Submit(
      split.shards,
      [&](int s, uint64_t rid, uint64_t seq) {
        return EncodeRequest(
            rid,
            PushRequest{table.shard_ids[static_cast<size_t>(s)],
                        Rows::Keys(split.unique[static_cast<size_t>(s)]), options_.worker_id,
                        incarnation_, seq, options_.wire_dtype, -1, weight.samples,
                        weight.global_batch, weight.clock_step},
            {payloads[static_cast<size_t>(s)]});
      },
      nullptr, /*is_push=*/true);
}

Future Client::PullDense(const TableHandle& table, int64_t for_clock,
                         std::atomic<int64_t>* read_clock, TakeValues take,
                         const std::function<void(size_t shards)>& sized) {
  RangePartitioner part(num_shards_);
  std::vector<int> shards = ShardsWithRows(part, table.rows);
  if (sized) sized(shards.size());
  std::vector<size_t> index(static_cast<size_t>(num_shards_));
  for (size_t i = 0; i < shards.size(); ++i) index[static_cast<size_t>(shards[i])] = i;
  int64_t clock = for_clock >= 0 ? for_clock : clock_.load();
  auto dtype = options_.wire_dtype;
  TableHandle t = table;
  Impl* impl = impl_.get();
  impl->CountPull();
  return impl_->Submit(
      shards,
      [&](int s, uint64_t rid, uint64_t) {
        RowRange rr = part.Range(t.rows, s);
        Rows rows;
        rows.begin = rr.begin;
        rows.end = rr.end;
        return MakePull(rid, t.shard_ids[static_cast<size_t>(s)], rows, options_.worker_id, clock,
                        options_.staleness, dtype);
      },
      [t, part, impl, read_clock, index, take = std::move(take)](
          int s, const Reply& reply, std::span<const Frame> payloads) -> Status {
        RowRange rr = part.Range(t.rows, s);
        LEASH_ASSIGN_OR_RETURN(const PullReply* r,
                               CheckPullReply(reply, payloads, rr.size(), t.cols));
        impl->NotePulledMinClock(r->min_clock);
        if (read_clock != nullptr) {
          int64_t seen = read_clock->load();
          while (r->min_clock < seen && !read_clock->compare_exchange_weak(seen, r->min_clock)) {
          }
        }
        return take(index[static_cast<size_t>(s)], rr.begin * t.cols, rr.size() * t.cols, *r,
                    payloads[0]);
      });
}

Future Client::Pull(const TableHandle& table, float* out, int64_t for_clock,
                    std::atomic<int64_t>* read_clock) {
  if (table.kind != TableKind::kDense) return Ready(NotDense(table, "Pull"));
  return PullDense(
      table, for_clock, read_clock,
      [out](size_t, size_t offset, size_t floats, const PullReply& r, const Frame& payload) {
        return DecodeValues(payload, r.dtype, floats, out + offset);
      });
}

Future Client::PullInPlace(const TableHandle& table, PulledValues* out, int64_t for_clock,
                           std::atomic<int64_t>* read_clock) {
  if (table.kind != TableKind::kDense) {
    return Ready(
        InvalidArgument("table '" + table.name + "' is sparse: use PullSparse, not PullInPlace"));
  }
  if (out == nullptr) {
    return Ready(InvalidArgument("PullInPlace of table '" + table.name + "' without an output"));
  }
  // Each shard's reply fills its own slot (PullDense's index), on whichever thread reads it.
  auto sized = [out, size = table.size()](size_t parts) {
    out->pieces_.assign(parts, {});
    out->storage_.assign(parts, Frame());
    out->copied_.assign(parts, 0);
    out->size_ = size;
  };
  return PullDense(
      table, for_clock, read_clock,
      [out, budget = impl_->lent_budget()](size_t i, size_t offset, size_t floats,
                                           const PullReply& r, const Frame& payload) -> Status {
        Frame kept;
        if (r.dtype == DType::kF32 && payload.size() == floats * sizeof(float) &&
            reinterpret_cast<uintptr_t>(payload.data()) % alignof(float) == 0) {
          // The received bytes themselves: the socket's message, or the shard's ring
          // within the budget.
          kept = payload.lent() ? KeepLent(payload, budget) : payload;
        }
        if (kept.empty()) {
          std::shared_ptr<float[]> values(new float[floats]);
          LEASH_RETURN_IF_ERROR(DecodeValues(payload, r.dtype, floats, values.get()));
          float* data = values.get();
          kept = Frame::Wrap(data, floats * sizeof(float), std::move(values));
          out->copied_[i] = 1;
        }
        out->pieces_[i] = {offset, {reinterpret_cast<const float*>(kept.data()), floats}};
        out->storage_[i] = std::move(kept);
        return Status::Ok();
      },
      sized);
}

std::span<const float> PulledValues::contiguous() const {
  if (pieces_.size() != 1 || pieces_[0].values.size() != size_) return {};
  return pieces_[0].values;
}

void PulledValues::CopyTo(float* out) const {
  for (const Piece& p : pieces_) {
    if (!p.values.empty()) std::memcpy(out + p.offset, p.values.data(), p.values.size_bytes());
  }
}

size_t PulledValues::copied_bytes() const {
  size_t n = 0;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if (copied_[i]) n += pieces_[i].values.size_bytes();
  }
  return n;
}

Future Client::Pull(const TableHandle& table, std::span<const uint64_t> keys, float* out) {
  if (table.kind != TableKind::kDense) return Ready(NotDense(table, "Pull"));
  for (uint64_t k : keys) {
    if (k >= table.rows) {
      return Ready(InvalidArgument("key " + std::to_string(k) + " out of range for table '" +
                                   table.name + "' of " + std::to_string(table.rows) + " rows"));
    }
  }
  RangePartitioner part(num_shards_);
  auto split = std::make_shared<std::vector<std::vector<uint64_t>>>();
  auto pos = std::make_shared<std::vector<std::vector<size_t>>>();
  part.Split(table.rows, std::vector<uint64_t>(keys.begin(), keys.end()), split.get(), pos.get());
  std::vector<int> shards;
  for (int s = 0; s < num_shards_; ++s) {
    if (!(*split)[static_cast<size_t>(s)].empty()) shards.push_back(s);
  }
  int64_t clock = clock_.load();
  auto dtype = options_.wire_dtype;
  TableHandle t = table;
  Impl* impl = impl_.get();
  impl->CountPull();
  return impl_->Submit(
      shards,
      [&](int s, uint64_t rid, uint64_t) {
        return EncodeRequest(
            rid, PullRequest{t.shard_ids[static_cast<size_t>(s)],
                             Rows::Keys((*split)[static_cast<size_t>(s)]), options_.worker_id,
                             clock, options_.staleness, dtype});
      },
      [t, out, split, pos, impl](int s, const Reply& reply,
                                 std::span<const Frame> payloads) -> Status {
        const auto& p = (*pos)[static_cast<size_t>(s)];
        LEASH_ASSIGN_OR_RETURN(const PullReply* r,
                               CheckPullReply(reply, payloads, p.size(), t.cols));
        impl->NotePulledMinClock(r->min_clock);
        size_t n = p.size() * t.cols;
        std::vector<float> tmp(n);
        LEASH_RETURN_IF_ERROR(DecodeValues(payloads[0], r->dtype, n, tmp.data()));
        for (size_t i = 0; i < p.size(); ++i) {
          std::copy_n(tmp.data() + i * t.cols, t.cols, out + p[i] * t.cols);
        }
        return Status::Ok();
      });
}

Future Client::Push(const TableHandle& table, const float* grad, PushWeight weight) {
  return PushDense(table, grad, nullptr, weight);
}

Future Client::Push(const TableHandle& table, std::shared_ptr<const float> grad,
                    PushWeight weight) {
  if (grad == nullptr) {
    return Ready(InvalidArgument("Push of table '" + table.name + "': the gradient is null"));
  }
  const float* data = grad.get();
  return PushDense(table, data, grad, weight);
}

namespace {

// The deleter of a PushBuffer: it holds the ring frame the buffer is, which PushDense finds
// (std::get_deleter) and sends as it lies. Dropping the last reference drops the frame,
// whose own release gives the ring's room back once the shard has read it.
struct RingGradient {
  const void* client;  // the Client::Impl that reserved it
  int shard;
  Frame frame;
  void operator()(float*) { frame = Frame(); }
};

}  // namespace

std::shared_ptr<float> Client::PushBuffer(const TableHandle& table) {
  if (table.kind != TableKind::kDense || options_.wire_dtype != DType::kF32) return nullptr;
  const std::vector<int> shards = ShardsWithRows(RangePartitioner(num_shards_), table.rows);
  // A contiguous gradient cannot lie in two shards' rings.
  if (shards.size() != 1) return nullptr;
  const int only = shards[0];
  std::optional<WritableFrame> w = impl_->ReservePayload(only, table.size() * sizeof(float));
  if (!w) return nullptr;
  impl_->CountPushBuffer();
  float* data = reinterpret_cast<float*>(w->data);
  return std::shared_ptr<float>(data, RingGradient{impl_.get(), only, std::move(w->frame)});
}

Future Client::PushDense(const TableHandle& table, const float* grad,
                         const std::shared_ptr<const float>& owner, PushWeight weight) {
  if (table.kind != TableKind::kDense) return Ready(NotDense(table, "Push"));
  RangePartitioner part(num_shards_);
  std::vector<int> shards;
  std::vector<Frame> payloads(static_cast<size_t>(num_shards_));
  const RingGradient* ring = owner != nullptr ? std::get_deleter<RingGradient>(owner) : nullptr;
  for (int s = 0; s < num_shards_; ++s) {
    RowRange rr = part.Range(table.rows, s);
    if (rr.size() == 0) continue;
    shards.push_back(s);
    std::span<const float> values(grad + rr.begin * table.cols, rr.size() * table.cols);
    // Only this client's PushBuffer made `ring`, so the wire is float32.
    if (ring != nullptr && ring->client == impl_.get() && ring->shard == s &&
        ring->frame.data() == reinterpret_cast<const uint8_t*>(values.data()) &&
        ring->frame.size() == values.size_bytes()) {
      // Computed where it is sent from (PushBuffer): the frame itself, no copy. Sent after
      // the link changed, the transport copies it into the new ring or onto the socket.
      payloads[static_cast<size_t>(s)] = ring->frame;
      impl_->CountPushFromBuffer();
    } else if (auto w = impl_->ReservePayload(s, values.size() * DTypeSize(options_.wire_dtype))) {
      EncodeValuesInto(values, options_.wire_dtype, w->data);
      payloads[static_cast<size_t>(s)] = std::move(w->frame);
    } else if (owner != nullptr && options_.wire_dtype == DType::kF32) {
      // The caller's floats are the wire's bytes: the frame refers to them and keeps their
      // owner (the socket's message too, until ZeroMQ has sent it).
      payloads[static_cast<size_t>(s)] =
          Frame::Wrap(values.data(), values.size_bytes(), std::shared_ptr<const void>(owner));
    } else {
      payloads[static_cast<size_t>(s)] = EncodeValues(values, options_.wire_dtype);
    }
  }
  impl_->CountPush();
  return impl_->Submit(
      shards,
      [&](int s, uint64_t rid, uint64_t seq) {
        RowRange rr = part.Range(table.rows, s);
        Rows rows;
        rows.begin = rr.begin;
        rows.end = rr.end;
        return MakePush(rid, table.shard_ids[static_cast<size_t>(s)], rows, options_.worker_id,
                        incarnation_, seq, options_.wire_dtype, payloads[static_cast<size_t>(s)],
                        weight);
      },
      nullptr, /*is_push=*/true);
}

Future Client::Push(const TableHandle& table, std::span<const uint64_t> keys, const float* grad) {
  if (table.kind != TableKind::kDense) return Ready(NotDense(table, "Push"));
  for (uint64_t k : keys) {
    if (k >= table.rows) {
      return Ready(InvalidArgument("key " + std::to_string(k) + " out of range for table '" +
                                   table.name + "' of " + std::to_string(table.rows) + " rows"));
    }
  }
  RangePartitioner part(num_shards_);
  std::vector<std::vector<uint64_t>> split;
  std::vector<std::vector<size_t>> pos;
  part.Split(table.rows, std::vector<uint64_t>(keys.begin(), keys.end()), &split, &pos);
  std::vector<int> shards;
  std::vector<Frame> payloads(static_cast<size_t>(num_shards_));
  for (int s = 0; s < num_shards_; ++s) {
    const auto& p = pos[static_cast<size_t>(s)];
    if (p.empty()) continue;
    shards.push_back(s);
    std::vector<float> g(p.size() * table.cols);
    for (size_t i = 0; i < p.size(); ++i)
      std::copy_n(grad + p[i] * table.cols, table.cols, g.data() + i * table.cols);
    payloads[static_cast<size_t>(s)] = EncodeValues(g, options_.wire_dtype);
  }
  impl_->CountPush();
  return impl_->Submit(
      shards,
      [&](int s, uint64_t rid, uint64_t seq) {
        return EncodeRequest(
            rid,
            PushRequest{table.shard_ids[static_cast<size_t>(s)],
                        Rows::Keys(split[static_cast<size_t>(s)]), options_.worker_id, incarnation_,
                        seq, options_.wire_dtype, -1},
            {payloads[static_cast<size_t>(s)]});
      },
      nullptr, /*is_push=*/true);
}

Future Client::Clock(float samples_per_second) {
  int64_t next = clock_.fetch_add(1) + 1;
  impl_->NoteClock(next);
  std::vector<int> all = AllShards(num_shards_);
  auto make = [&](int, uint64_t rid, uint64_t) {
    return MakeClock(rid, options_.worker_id, next, samples_per_second);
  };
  if (samples_per_second == 0) return impl_->Submit(all, make, nullptr);
  Impl* impl = impl_.get();
  return impl_->Submit(all, make,
                       [impl](int shard, const Reply& reply, std::span<const Frame>) -> Status {
                         const auto* r = std::get_if<ClockReply>(&reply);
                         if (shard == 0 && r != nullptr && r->cluster_samples_per_second > 0)
                           impl->NoteClusterRate(r->cluster_samples_per_second);
                         return Status::Ok();
                       });
}

double Client::cluster_samples_per_second() const { return impl_->cluster_rate(); }

Future Client::CatchUp(int64_t clock) {
  if (clock <= clock_.load()) return Ready(Status::Ok());
  clock_.store(clock);
  impl_->NoteClock(clock);
  std::vector<int> all = AllShards(num_shards_);
  return impl_->Submit(
      all, [&](int, uint64_t rid, uint64_t) { return MakeClock(rid, options_.worker_id, clock); },
      nullptr);
}

Status Client::Leave() {
  std::vector<int> all = AllShards(num_shards_);
  impl_->EnableHeartbeats(options_.worker_id, incarnation_, 0);
  auto fut = impl_->Submit(
      all,
      [&](int, uint64_t rid, uint64_t) { return MakeLeave(rid, options_.worker_id, incarnation_); },
      nullptr);
  if (fut.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    return Unavailable(
        "not every shard acknowledged the leave within 5 s; they will evict this worker when its "
        "lease expires");
  }
  return fut.get();
}

Result<std::vector<ShardStats>> Client::Stats() {
  auto stats = std::make_shared<std::vector<ShardStats>>(static_cast<size_t>(num_shards_));
  std::vector<int> all = AllShards(num_shards_);
  auto fut = impl_->Submit(
      all, [](int, uint64_t rid, uint64_t) { return MakeStats(rid); },
      [stats](int s, const Reply& reply, std::span<const Frame>) -> Status {
        const auto* r = std::get_if<ShardStats>(&reply);
        if (r == nullptr) return Internal("unexpected reply to Stats");
        (*stats)[static_cast<size_t>(s)] = *r;
        return Status::Ok();
      });
  LEASH_RETURN_IF_ERROR(Await(fut));
  return *stats;
}

Result<std::vector<int64_t>> Client::Checkpoint() {
  auto clocks = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(num_shards_), -1);
  std::vector<int> all = AllShards(num_shards_);
  auto fut = impl_->Submit(
      all, [](int, uint64_t rid, uint64_t) { return MakeCheckpoint(rid); },
      [clocks](int s, const Reply& reply, std::span<const Frame>) -> Status {
        const auto* r = std::get_if<CheckpointReply>(&reply);
        if (r == nullptr) return Internal("unexpected reply to Checkpoint");
        (*clocks)[static_cast<size_t>(s)] = r->clock;
        return Status::Ok();
      });
  LEASH_RETURN_IF_ERROR(Await(fut));
  return *clocks;
}

ClientCounters Client::counters() const { return impl_->counters(); }

void Client::HoldSends() { impl_->Hold(); }
void Client::FlushSends() { impl_->Flush(); }

}  // namespace leash

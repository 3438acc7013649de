// leash._leash: leash::Client for Python (pybind11). Every wait releases the GIL and
// wakes every kWaitSliceMs to run Python's signal handlers, so Ctrl-C interrupts a parked
// pull; every error becomes a leash.errors exception carrying Leash's status code. Python
// threads call in under the GIL (which guards this file's own state); the leash::Client
// underneath is thread-safe and writes pulled values from whichever thread reads the reply.
// Each client has a sender thread (Sender) that copies and sends the gradients handed to
// it during backward and the clocks behind them; it never touches Python objects. With
// etcd= (replicated shards) the shards' primaries are found in etcd and followed by the
// leash::Client's own directory thread, as leash-worker --etcd does.
#include <pthread.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "leash/common/curve_keys.h"
#include "leash/common/domain.h"
#include "leash/common/etcd_coordinator.h"
#include "leash/common/logging.h"
#include "leash/common/status.h"
#include "leash/common/zmq_transport.h"
#include "leash/kernels/blas_core.h"
#include "leash/worker/client.h"

namespace py = pybind11;

namespace leash::python {
namespace {

constexpr int64_t kWaitSliceMs = 50;  // how often a wait comes back to check for signals
// An iteration's pushes go out with its clock unless they add up to this first (as
// leash-worker's RemoteParams does: a large gradient still travels early).
constexpr size_t kPushBucketBytes = size_t{1} << 20;
// Pushes kept in flight without a clock before the oldest is waited on.
constexpr size_t kMaxPendingPushes = 4096;
// Pushes handed to the sender wake it once they add up to this (or a clock comes).
constexpr size_t kWakeBytes = size_t{256} << 10;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- errors ----------------------------------------------------------------------------

// Raises the leash.errors class for `code` (leash.errors._class_for) with `message`.
[[noreturn]] void Raise(StatusCode code, const std::string& message,
                        const char* python_class = nullptr) {
  py::module_ errors = py::module_::import("leash.errors");
  py::object cls = python_class != nullptr ? errors.attr(python_class)
                                           : errors.attr("_class_for")(static_cast<int>(code));
  py::object exc = cls(message, static_cast<int>(code));
  PyErr_SetObject(cls.ptr(), exc.ptr());
  throw py::error_already_set();
}

void ThrowIfError(const Status& st, const std::string& context = {}) {
  if (st.ok()) return;
  // A call given up on by the interrupt hook (a signal handler raised): that exception.
  if (PyErr_Occurred() != nullptr) throw py::error_already_set();
  Raise(st.code(), context.empty() ? st.message() : context + ": " + st.message());
}

template <typename T>
T ValueOrThrow(Result<T> r, const std::string& context = {}) {
  if (!r.ok()) ThrowIfError(r.status(), context);
  return std::move(r).value();
}

// ---- tables ---------------------------------------------------------------------------

// A table as this process knows it: the client's handle plus the shape Python sees.
struct Table {
  TableHandle handle;
  std::vector<py::ssize_t> shape;  // dense: product == rows * cols; sparse: (cols,), one row
  bool sparse() const { return handle.kind == TableKind::kSparse; }

  size_t size() const { return handle.size(); }
  std::string ShapeText() const {
    std::string s = "(";
    for (size_t i = 0; i < shape.size(); ++i) {
      s += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
      if (i + 1 < shape.size()) s += " ";
    }
    return s + ")";
  }
};

// Time spent in this binding, for the benchmark (bench/python_leash.py): the total inside
// its entry points, the part of it waiting with the GIL released, the part taking the
// GIL back after a wait, and the part inside leash::Client calls that copy or encode.
struct BindingStats {
  uint64_t pulls = 0;
  uint64_t pushes = 0;
  uint64_t clocks = 0;
  uint64_t waits = 0;
  int64_t total_ns = 0;
  int64_t wait_ns = 0;
  int64_t gil_ns = 0;
  int64_t client_ns = 0;
  int64_t tensor_ns = 0;  // inside push_tensor (called from gradient hooks during backward)
  uint64_t values_pulled = 0;
  uint64_t values_pulled_in_place = 0;  // of those, handed out in the reply's own memory
  uint64_t values_pushed = 0;
  uint64_t pushes_handed_over = 0;  // push_tensor's, sent from the tensor where the wire allows
};

class ScopedTimer {
 public:
  explicit ScopedTimer(int64_t* sink) : sink_(sink), start_(NowNs()) {}
  ~ScopedTimer() { *sink_ += NowNs() - start_; }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  int64_t* sink_;
  int64_t start_;
};

// Futures given up on (a wait interrupted by a signal) with the arrays their replies still
// write into: kept alive until the future is ready or the Client is gone.
struct Graveyard {
  std::vector<std::pair<Future, py::object>> entries;
  void Add(Future f, py::object keep) { entries.emplace_back(std::move(f), std::move(keep)); }
  void Reap() {
    std::erase_if(entries, [](const auto& e) { return e.first.ready(); });
  }
};

// What a Client shares with its pull batches; touched under the GIL only.
struct Shared {
  Graveyard graveyard;
  BindingStats stats;
  int waiters = 0;      // threads in a wait (with the GIL released most of the time)
  bool closed = false;  // the leash::Client is gone: its futures must not be waited on
  const leash::Client* client = nullptr;  // while open
};

[[noreturn]] void RaiseClosed() {
  Raise(StatusCode::kFailedPrecondition,
        "this leash.Client is closed (it left the job); make a new one", "ClientClosedError");
}

// Waits for `f`, the GIL released, in slices that each end by running Python's signal
// handlers; a handler's exception (KeyboardInterrupt, SystemExit) propagates, and `keep`
// (what the reply writes into) goes to the graveyard until the reply comes. A pull
// (`is_pull`) also gives up with NotRegistered once a shard has evicted this worker: a
// pull it sent since then may stay parked for a clock that nobody will reach.
Status WaitInterruptibly(const Future& f, Shared* shared, py::object keep = py::none(),
                         bool is_pull = false) {
  if (f.ready()) return f.get();
  if (shared->closed) RaiseClosed();
  BindingStats* stats = &shared->stats;
  ++stats->waits;
  ++shared->waiters;
  struct Leave {
    Shared* s;
    ~Leave() { --s->waiters; }
  } leave{shared};
  while (true) {
    bool ready = false;
    int64_t t0 = NowNs();
    int64_t t1 = 0;
    {
      py::gil_scoped_release release;
      ready = f.wait_for(std::chrono::milliseconds(kWaitSliceMs)) == std::future_status::ready;
      t1 = NowNs();
    }
    stats->wait_ns += t1 - t0;
    stats->gil_ns += NowNs() - t1;
    if (ready) break;
    if (PyErr_CheckSignals() != 0) {
      if (!keep.is_none()) shared->graveyard.Add(f, std::move(keep));
      throw py::error_already_set();
    }
    if (is_pull && shared->client != nullptr && shared->client->needs_rejoin()) {
      if (!keep.is_none()) shared->graveyard.Add(f, std::move(keep));
      return NotRegistered(
          "this worker was evicted (it was silent past its lease); rejoin() and pull again");
    }
  }
  return f.get();
}

// ---- arrays ---------------------------------------------------------------------------

std::string TypeName(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__name__")); }

// The float32 C-contiguous array `obj` holding exactly t.size() values (`what` names the
// argument in errors). Raises WrongDTypeError or WrongShapeError otherwise.
py::array CheckedArray(py::handle obj, const Table& t, const char* what, bool writable,
                       size_t values) {
  if (!py::isinstance<py::array>(obj)) {
    Raise(StatusCode::kInvalidArgument,
          std::string(what) + " must be a numpy.ndarray of float32 (or a torch.Tensor), got " +
              TypeName(obj),
          "WrongDTypeError");
  }
  auto a = py::reinterpret_borrow<py::array>(obj);
  if (!py::array_t<float>::check_(a)) {
    Raise(StatusCode::kInvalidArgument,
          std::string(what) + " for table '" + t.handle.name + "' must hold float32, not " +
              std::string(py::str(a.dtype())) + " (convert it with .astype(numpy.float32))",
          "WrongDTypeError");
  }
  if (static_cast<size_t>(a.size()) != values) {
    std::string shape = "(";
    for (py::ssize_t i = 0; i < a.ndim(); ++i) {
      shape += std::to_string(a.shape(i)) + (a.ndim() == 1 || i + 1 < a.ndim() ? "," : "");
      if (i + 1 < a.ndim()) shape += " ";
    }
    shape += ")";
    Raise(StatusCode::kInvalidArgument,
          std::string(what) + " of shape " + shape + " holds " + std::to_string(a.size()) +
              " values; table '" + t.handle.name + "' needs " + std::to_string(values) +
              (values == t.size() ? " (shape " + t.ShapeText() + ")" : std::string()),
          "WrongShapeError");
  }
  if ((a.flags() & py::array::c_style) == 0) {
    Raise(StatusCode::kInvalidArgument,
          std::string(what) + " for table '" + t.handle.name +
              "' is not C-contiguous; pass numpy.ascontiguousarray(...) or tensor.contiguous()",
          "WrongShapeError");
  }
  if (writable && !a.writeable()) {
    Raise(StatusCode::kInvalidArgument,
          std::string(what) + " for table '" + t.handle.name + "' is read-only",
          "InvalidArgumentError");
  }
  return a;
}

// Keys as uint64: any integer array or sequence. Negative keys are refused for a dense
// table's rows; a sparse table takes any 64-bit key (an int64 is read as its bits).
std::vector<uint64_t> CheckedKeys(py::handle keys, const Table& t) {
  py::array a = py::array::ensure(keys);
  if (!a || (a.size() > 0 && a.dtype().kind() != 'i' && a.dtype().kind() != 'u')) {
    Raise(StatusCode::kInvalidArgument,
          "keys for table '" + t.handle.name + "' must be integers, got " +
              (a ? std::string(py::str(a.dtype())) : TypeName(keys)),
          "WrongDTypeError");
  }
  if (a.ndim() > 1) {
    Raise(StatusCode::kInvalidArgument, "keys for table '" + t.handle.name + "' must be 1-D",
          "WrongShapeError");
  }
  std::vector<uint64_t> out(static_cast<size_t>(a.size()));
  if (a.size() == 0) return out;
  if (a.dtype().kind() == 'i') {
    auto s = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
    const int64_t* p = s.data();
    for (size_t i = 0; i < out.size(); ++i) {
      if (p[i] < 0 && !t.sparse()) {
        Raise(StatusCode::kInvalidArgument,
              "key " + std::to_string(p[i]) + " for table '" + t.handle.name + "' is negative",
              "InvalidArgumentError");
      }
      out[i] = static_cast<uint64_t>(p[i]);
    }
  } else {
    auto u = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(a);
    std::copy_n(u.data(), out.size(), out.begin());
  }
  return out;
}

py::array NewArray(const std::vector<py::ssize_t>& shape) {
  return py::array_t<float>(std::vector<py::ssize_t>(shape));
}

// A pull with no output array of the caller's (Client::PullInPlace): the values it fills,
// owned by a capsule that the pull keeps (the graveyard keeps it if the wait is given up)
// and that the array made from them keeps.
struct InPlacePull {
  py::object capsule;
  leash::PulledValues* values = nullptr;
};
InPlacePull NewInPlacePull() {
  auto* v = new leash::PulledValues();
  return {py::capsule(v, [](void* p) { delete static_cast<leash::PulledValues*>(p); }), v};
}

// The array of a completed in-place pull: the pull's own memory where one piece holds the
// table, kept alive by the array; else (rows on several shards) a new array the pieces are
// copied into. Writable either way: nothing else reads it (a reply in a same-host shard's
// shared-memory ring is the shard's to write again only once the array is gone).
// *in_place: the array is the reply itself, nothing copied (a float32 wire, over the socket
// or in the ring within the client's budget; a 16-bit wire's values, or a ring's past the
// budget, were widened or copied into memory of the pull's own).
py::array InPlaceArray(const InPlacePull& p, const std::vector<py::ssize_t>& shape,
                       BindingStats* stats, bool* in_place = nullptr) {
  const std::span<const float> whole = p.values->contiguous();
  const bool read_in_place = !whole.empty() && p.values->copied_bytes() == 0;
  if (in_place != nullptr) *in_place = read_in_place;
  if (read_in_place) stats->values_pulled_in_place += whole.size();
  if (whole.empty()) {
    py::array a = NewArray(shape);
    p.values->CopyTo(static_cast<float*>(a.mutable_data()));
    return a;
  }
  return py::array_t<float>(std::vector<py::ssize_t>(shape), whole.data(), p.capsule);
}

// Where one pull's values go: the caller's array (`into`), or, given None, the reply itself
// (`in_place`, read by InPlaceArray). `keep` is what the pull keeps alive until its reply
// comes (the graveyard holds it if the wait is given up).
struct PullTarget {
  InPlacePull in_place;
  float* into = nullptr;
  py::object keep;
};
PullTarget NewPullTarget(const Table& t, py::handle out) {
  PullTarget target;
  if (out.is_none()) {
    target.in_place = NewInPlacePull();
    target.keep = target.in_place.capsule;
  } else {
    py::array a = CheckedArray(out, t, "out", /*writable=*/true, t.size());
    target.into = static_cast<float*>(a.mutable_data());
    target.keep = std::move(a);
  }
  return target;
}

// The values of a completed pull into `target`. *in_place as InPlaceArray's (false for the
// caller's array).
py::array PulledArray(const PullTarget& target, const Table& t, BindingStats* stats,
                      bool* in_place = nullptr) {
  if (target.into != nullptr) {
    if (in_place != nullptr) *in_place = false;
    return py::reinterpret_borrow<py::array>(target.keep);
  }
  return InPlaceArray(target.in_place, t.shape, stats, in_place);
}

// ---- a batch of pulls -----------------------------------------------------------------

class Client;

// Pulls in flight, with the arrays they write into. wait() raises the first error;
// dropping a batch that is not done keeps its arrays alive until its replies come.
class PullBatch {
 public:
  // `targets[i]`: where pull i's values go.
  PullBatch(std::vector<Future> futures, std::vector<PullTarget> targets,
            std::vector<py::object> tables, std::shared_ptr<Shared> shared)
      : futures_(std::move(futures)),
        targets_(std::move(targets)),
        tables_(std::move(tables)),
        shared_(std::move(shared)) {}
  ~PullBatch() {
    if (shared_->closed) return;  // nothing writes into the arrays any more
    for (size_t i = 0; i < futures_.size(); ++i) {
      if (!futures_[i].ready()) shared_->graveyard.Add(futures_[i], targets_[i].keep);
    }
  }
  PullBatch(const PullBatch&) = delete;
  PullBatch& operator=(const PullBatch&) = delete;

  bool ready() const {
    for (const auto& f : futures_) {
      if (!f.ready()) return false;
    }
    return true;
  }

  // The arrays, once every pull is done.
  py::list Wait() {
    ScopedTimer total(&shared_->stats.total_ns);
    Status first;
    for (size_t i = 0; i < futures_.size(); ++i) {
      Status st = WaitInterruptibly(futures_[i], shared_.get(), targets_[i].keep, /*is_pull=*/true);
      if (!st.ok() && first.ok()) {
        first = st.WithContext("pull '" + tables_[i].cast<const Table&>().handle.name + "'");
      }
    }
    ThrowIfError(first);
    py::list out;
    was_in_place_.assign(targets_.size(), false);
    for (size_t i = 0; i < targets_.size(); ++i) {
      bool in_place = false;
      out.append(
          PulledArray(targets_[i], tables_[i].cast<const Table&>(), &shared_->stats, &in_place));
      was_in_place_[i] = in_place;
    }
    return out;
  }

  // After wait(): per pull, whether its array is the reply itself (pulled without an output
  // array, and nothing copied to make it).
  std::vector<bool> InPlace() const { return was_in_place_; }

 private:
  std::vector<Future> futures_;
  std::vector<PullTarget> targets_;
  std::vector<bool> was_in_place_;
  std::vector<py::object> tables_;
  std::shared_ptr<Shared> shared_;
};

// ---- the sender ----------------------------------------------------------------------

// What a client's pushes and clocks share: the futures of pushes and clocks not known to be
// done and the open bucket of held pushes. Guarded by Sender::exec_mu.
struct PushState {
  std::deque<Future> pending;  // pushes not known to be done, oldest first
  std::deque<Future> clocks;
  size_t previous = 0;  // pushes at the front of `pending` from before the last clock
  bool holding = false;
  size_t held_bytes = 0;
  Status deferred;  // an error of a push waited on before its clock, raised by the next one
};

// Runs a client's handed-over pushes (push_tensor: a gradient nobody writes any more) and
// the clocks queued behind them on its own thread, in order: the encoding of a gradient
// (and its copy, where the wire or shared memory needs one) and the wait for the previous
// iteration's acknowledgements happen there, off the training thread, while backward()
// goes on. Every other push or clock runs on the caller's thread once the queue is empty
// (Drain), under exec_mu like the jobs, so the order of pushes and clocks is the order of
// the calls. Never touches Python objects: the arrays it reads are kept alive by the
// caller until done_seq() passes their job, and a job's `owned` floats until the client
// drops its last reference to them (PushTensor's release flag).
class Sender {
 public:
  struct Job {
    bool clock = false;  // a clock, else a push of `values` floats at `data`
    const TableHandle* table = nullptr;
    const float* data = nullptr;
    size_t values = 0;
    std::vector<uint64_t> keys;  // a sparse table's rows (len(keys) x dim values at `data`)
    // A dense push's floats handed over to the client (Client::Push of a shared_ptr): sent
    // from `data` itself where the wire carries float32 over the socket, no copy.
    std::shared_ptr<const float> owned;
  };

  explicit Sender(leash::Client* client) : client_(client) {
    thread_ = std::thread([this] { Loop(); });
    // Named, so that top -H, perf and /proc tell it from the training thread.
    pthread_setname_np(thread_.native_handle(), "leash-sender");
  }
  ~Sender() { Stop(); }
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;

  // Queues `job`; returns its sequence number (done once done_seq() >= it). A sleeping
  // sender is woken by a clock or once kWakeBytes of pushes wait (a wake-up can cost the
  // training thread its core on a busy machine: the small gradients of the last layers go
  // with the next large one).
  uint64_t Enqueue(Job job) {
    bool wake = false;
    uint64_t seq = 0;
    const bool clock = job.clock;
    const size_t bytes = job.values * sizeof(float) + 1;  // never 0 with a job waiting
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      queue_.push_back(std::move(job));
      seq = ++enqueued_;
      if (clock) ++queued_clocks_;
      if (sleeping_) {
        unwoken_bytes_ += bytes;
        wake = clock || unwoken_bytes_ >= kWakeBytes;
        if (wake) unwoken_bytes_ = 0;
      }
    }
    if (wake) q_cv_.notify_one();
    return seq;
  }

  // Wakes the sender for what is queued.
  void Kick() {
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      if (!sleeping_ || queue_.empty()) return;
      unwoken_bytes_ = 0;
    }
    q_cv_.notify_one();
  }

  bool idle() const {
    std::lock_guard<std::mutex> lock(q_mu_);
    return enqueued_ == done_seq_.load(std::memory_order_acquire);
  }
  int queued_clocks() const {
    std::lock_guard<std::mutex> lock(q_mu_);
    return queued_clocks_;
  }
  uint64_t done_seq() const { return done_seq_.load(std::memory_order_acquire); }

  // Waits (up to timeout_ms) until every job queued so far is done. The caller releases
  // the GIL around it.
  bool WaitIdle(int64_t timeout_ms) {
    Kick();
    std::unique_lock<std::mutex> lock(q_mu_);
    return idle_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
      return enqueued_ == done_seq_.load(std::memory_order_acquire);
    });
  }
  // Waits until fewer than `n` clocks are queued.
  bool WaitClocksBelow(int n, int64_t timeout_ms) {
    Kick();
    std::unique_lock<std::mutex> lock(q_mu_);
    return idle_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                             [&] { return queued_clocks_ < n; });
  }

  // The first error of a queued job since the last call (Ok if none).
  Status TakeError() {
    if (!has_error_.load(std::memory_order_acquire)) return Status::Ok();
    std::lock_guard<std::mutex> lock(err_mu_);
    has_error_.store(false);
    return std::exchange(error_, Status::Ok());
  }

  // Stops the thread; the jobs still queued are dropped.
  void Stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      stop_ = true;
    }
    q_cv_.notify_one();
    thread_.join();
  }

  // From now on the queued clocks do not wait for acknowledgements (the client is leaving:
  // a shard that is gone must not hold up the exit).
  void SkipAcks() { skip_acks_.store(true); }

  int64_t busy_ns() const { return busy_ns_.load(std::memory_order_relaxed); }
  void reset_busy_ns() { busy_ns_.store(0); }

  std::mutex exec_mu;  // held by whoever runs pushes and clocks; guards `state`
  PushState state;

 private:
  void Loop() {
    while (true) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(q_mu_);
        sleeping_ = true;
        q_cv_.wait(lock, [&] { return stop_ || (!queue_.empty() && unwoken_bytes_ == 0); });
        sleeping_ = false;
        if (stop_) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      const int64_t t0 = NowNs();
      Status st;
      {
        std::lock_guard<std::mutex> exec(exec_mu);
        st = job.clock ? RunClock() : RunPush(job);
      }
      busy_ns_.fetch_add(NowNs() - t0, std::memory_order_relaxed);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(err_mu_);
        if (error_.ok()) error_ = st;
        has_error_.store(true, std::memory_order_release);
      }
      {
        std::lock_guard<std::mutex> lock(q_mu_);
        if (job.clock) --queued_clocks_;
        done_seq_.fetch_add(1, std::memory_order_release);
      }
      idle_cv_.notify_all();
    }
  }

  Status RunPush(Job& job) {
    PushState& s = state;
    if (!s.holding) {
      client_->HoldSends();
      s.holding = true;
      s.held_bytes = 0;
    }
    if (job.owned != nullptr) {
      s.pending.push_back(client_->Push(*job.table, std::move(job.owned)));
    } else {
      s.pending.push_back(job.keys.empty() ? client_->Push(*job.table, job.data)
                                           : client_->PushSparse(*job.table, job.keys, job.data));
    }
    s.held_bytes += job.values * sizeof(float);
    if (s.held_bytes >= kPushBucketBytes) {
      client_->FlushSends();
      client_->HoldSends();
      s.held_bytes = 0;
    }
    return Status::Ok();
  }

  // As Client::Clock, with the waits here: they bound what is in flight to two iterations
  // without holding up the training thread.
  Status RunClock() {
    PushState& s = state;
    s.clocks.push_back(client_->Clock());
    s.holding = false;
    client_->FlushSends();
    Status first = std::exchange(s.deferred, Status::Ok());
    while (s.previous > 0) {
      Status st = Await(s.pending.front());
      if (stopping()) return Status::Ok();
      s.pending.pop_front();
      --s.previous;
      if (!st.ok() && first.ok()) first = st.WithContext("push");
    }
    s.previous = s.pending.size();
    while (s.clocks.size() > 2) {
      Status st = Await(s.clocks.front());
      if (stopping()) return Status::Ok();
      s.clocks.pop_front();
      if (!st.ok() && first.ok()) first = st.WithContext("clock");
    }
    return first;
  }

  // f's status, or Ok once Stop() was called (the jobs are being dropped).
  Status Await(const Future& f) {
    while (f.wait_for(std::chrono::milliseconds(kWaitSliceMs)) != std::future_status::ready) {
      if (stopping() || skip_acks_.load()) return Status::Ok();
    }
    return f.get();
  }
  bool stopping() {
    std::lock_guard<std::mutex> lock(q_mu_);
    return stop_;
  }

  leash::Client* client_;
  std::thread thread_;
  mutable std::mutex q_mu_;
  std::condition_variable q_cv_;     // the sender sleeps here
  std::condition_variable idle_cv_;  // Drain and the clock bound wait here
  std::deque<Job> queue_;
  uint64_t enqueued_ = 0;
  int queued_clocks_ = 0;
  size_t unwoken_bytes_ = 0;  // of pushes queued while the sender sleeps, not woken for
  bool sleeping_ = false;
  bool stop_ = false;
  std::atomic<uint64_t> done_seq_{0};
  std::atomic<int64_t> busy_ns_{0};
  std::atomic<bool> skip_acks_{false};
  std::mutex err_mu_;
  std::atomic<bool> has_error_{false};
  Status error_;
};

// ---- the client -----------------------------------------------------------------------

// Exactly one of `servers` (static, unreplicated shards) and `etcd` (replicated shards of
// job `job`, found and followed in etcd) is set.
struct ConnectOptions {
  std::vector<std::string> servers;
  std::vector<std::string> etcd;
  std::string job;
  std::string name;
  int64_t staleness = 0;
  std::string wire_dtype = "fp32";
  int64_t connect_timeout_ms = 30000;
  std::optional<std::string> curve_keys;
  std::string curve_client = kDefaultCurveClient;
  bool shared_memory = true;
  int64_t shm_ring_mb = 64;
  int stripes = 1;
  bool register_worker = true;
  uint64_t worker_id = 0;
  int64_t heartbeat_ms = 0;
};

py::dict GrantDict(const ChunkGrant& g) {
  static const char* kKinds[] = {"chunk", "wait", "finished"};
  py::dict d;
  d["kind"] = kKinds[static_cast<int>(g.kind)];
  d["epoch"] = g.epoch;
  d["chunk"] = g.chunk;
  d["begin"] = g.begin;
  d["end"] = g.end;
  d["epochs_done"] = g.epochs_done;
  d["chunks_done"] = g.chunks_done;
  d["num_chunks"] = g.num_chunks;
  return d;
}

py::dict StatsDict(const ShardStats& s) {
  py::dict d;
  d["shard"] = s.shard;
  d["num_shards"] = s.num_shards;
  d["min_clock"] = s.min_clock;
  d["parked_pulls"] = s.parked_pulls;
  d["pushes_applied"] = s.pushes_applied;
  d["pulls_served"] = s.pulls_served;
  d["errors"] = s.errors;
  d["last_snapshot_clock"] = s.last_snapshot_clock;
  d["recovered_clock"] = s.recovered_clock;
  d["snapshot_age_ms"] = s.snapshot_age_ms;
  d["memory_budget_bytes"] = s.memory_budget_bytes;
  d["memory_used_bytes"] = s.memory_used_bytes;
  py::dict cov;
  cov["epochs_done"] = s.coverage.epochs_done;
  cov["epochs"] = s.coverage.epochs;
  cov["chunks_done"] = s.coverage.chunks_done;
  cov["num_chunks"] = s.coverage.num_chunks;
  cov["chunks_leased"] = s.coverage.chunks_leased;
  d["coverage"] = cov;
  py::list workers;
  for (const auto& w : s.workers) {
    py::dict wd;
    wd["id"] = w.id;
    wd["incarnation"] = w.incarnation;
    wd["name"] = w.name;
    wd["clock"] = w.clock;
    wd["ms_since_heartbeat"] = w.ms_since_heartbeat;
    workers.append(wd);
  }
  d["workers"] = workers;
  py::list tables;
  for (const auto& t : s.tables) {
    py::dict td;
    td["table_id"] = t.table_id;
    td["name"] = t.name;
    td["rows"] = t.rows;
    td["cols"] = t.cols;
    td["local_rows"] = t.local_rows;
    td["kind"] = TableKindName(t.kind);
    if (t.kind == TableKind::kSparse) {
      td["resident_rows"] = t.resident_rows;
      td["memory_bytes"] = t.memory_bytes;
      td["tier_hits"] = t.tier_hits;
      td["tier_misses"] = t.tier_misses;
      td["evictions"] = t.evictions;
      td["admissions"] = t.admissions;
      td["unadmitted_reads"] = t.unadmitted_reads;
      td["dropped_gradients"] = t.dropped_gradients;
      td["expired_rows"] = t.expired_rows;
    }
    tables.append(td);
  }
  d["tables"] = tables;
  return d;
}

class Client {
 public:
  explicit Client(const ConnectOptions& o) {
    if (!o.servers.empty() && !o.etcd.empty()) {
      Raise(StatusCode::kInvalidArgument,
            "servers and etcd are exclusive: servers names unreplicated shards, etcd finds "
            "replicated ones; give one");
    }
    if (o.servers.empty() && o.etcd.empty()) {
      Raise(StatusCode::kInvalidArgument,
            "servers is empty: give the shards' endpoints in order, e.g. "
            "['tcp://127.0.0.1:7000', 'tcp://127.0.0.1:7001'], or etcd= and job= for "
            "replicated shards");
    }
    ClientOptions co;
    co.name = o.name;
    co.staleness = o.staleness;
    co.wire_dtype = ValueOrThrow(ParseDType(o.wire_dtype), "wire_dtype");
    co.connect_timeout_ms = o.connect_timeout_ms;
    co.register_worker = o.register_worker;
    co.worker_id = o.worker_id;
    co.heartbeat_ms = o.heartbeat_ms;
    // The client's own waits (connecting, creating tables, chunk leases, stats) run
    // Python's signal handlers every 100 ms, the GIL taken for it: Ctrl-C ends them.
    co.interrupted = [] {
      py::gil_scoped_acquire gil;
      return PyErr_CheckSignals() != 0;
    };
    if (o.staleness < 0) Raise(StatusCode::kInvalidArgument, "staleness must be >= 0");
    if (o.connect_timeout_ms <= 0) {
      Raise(StatusCode::kInvalidArgument, "connect_timeout must be > 0");
    }
    ZmqOptions zo;
    zo.shared_memory = o.shared_memory;
    if (o.shm_ring_mb < 1 || o.shm_ring_mb > kMaxShmRingMb) {
      Raise(StatusCode::kInvalidArgument,
            "shm_ring_mb must be 1 to " + std::to_string(kMaxShmRingMb) + " MiB");
    }
    zo.shm_ring_bytes = o.shm_ring_mb << 20;
    zo.stripes = o.stripes;
    if (o.curve_keys) {
      zo.curve = ValueOrThrow(LoadCurveClientKeys(*o.curve_keys, o.curve_client), "curve_keys");
    }
    std::vector<std::string> servers = o.servers;
    if (!o.etcd.empty()) {
      // As leash-worker --etcd: wait for every shard's primary, connect to them, and let
      // the client's directory thread follow failovers.
      co.directory = OpenDirectory(o);
      Result<ClusterView> view = Unavailable("not resolved");
      {
        py::gil_scoped_release release;  // waits up to connect_timeout for the primaries
        view = ResolvePrimaries(*co.directory, o.connect_timeout_ms, co.interrupted);
      }
      co.directory_view =
          ValueOrThrow(std::move(view), "cannot find the shards of job '" + o.job + "' in etcd");
      servers = PrimaryEndpoints(co.directory_view);
      spdlog::info("job '{}' in etcd: {} shard(s) x {} replica(s); following their primaries",
                   o.job, co.directory_view.num_shards, co.directory_view.replicas);
    }
    ctx_ = std::make_unique<ZmqContext>(std::clamp(o.stripes, 1, 16));  // an I/O thread a stripe
    auto transport =
        ValueOrThrow(ConnectZmqClient(*ctx_, servers, zo), o.etcd.empty() ? "servers" : "etcd");
    Result<std::unique_ptr<leash::Client>> client = Unavailable("not connected");
    {
      py::gil_scoped_release release;  // Connect waits up to connect_timeout for the shards
      client = leash::Client::Connect(std::move(transport), co);
    }
    client_ = ValueOrThrow(std::move(client), "cannot join the cluster");
    shared_->client = client_.get();
    staleness_ = o.staleness;
    clock_ = client_->clock();
    sender_ = std::make_unique<Sender>(client_.get());
  }

  ~Client() {
    if (shared_->waiters == 0) Destroy();  // a thread in a wait holds a reference: never here
  }

  Table CreateTable(const std::string& name, std::vector<py::ssize_t> shape,
                    const std::string& optimizer, float lr, float momentum, float beta1,
                    float beta2, float epsilon, float weight_decay, const std::string& init,
                    float init_scale, uint64_t seed, bool sparse, float l1, float ftrl_beta,
                    float clip_value, uint32_t admit_after, int64_t expire_after_clocks) {
    CheckOpen();
    if (name.empty()) Raise(StatusCode::kInvalidArgument, "a table needs a name");
    auto [rows, cols] = RowsCols(name, shape);
    TableSpec spec;
    spec.name = name;
    spec.rows = rows;
    spec.cols = static_cast<uint32_t>(cols);
    if (sparse) {
      if (shape.size() != 1) {
        Raise(StatusCode::kInvalidArgument,
              "sparse table '" + name + "' is given by its row width (dim), not a shape");
      }
      if (shape[0] > UINT32_MAX) {
        Raise(StatusCode::kInvalidArgument, "sparse table '" + name + "': dim is too large");
      }
      spec.kind = TableKind::kSparse;
      spec.rows = 0;
      spec.cols = static_cast<uint32_t>(shape[0]);
      spec.sparse.admit_after = admit_after;
      spec.sparse.expire_after_clocks = expire_after_clocks;
    }
    spec.optimizer.l1 = l1;
    spec.optimizer.ftrl_beta = ftrl_beta;
    spec.optimizer.clip_value = clip_value;
    spec.optimizer.kind = ValueOrThrow(ParseOptimizer(optimizer), "optimizer");
    spec.optimizer.lr = lr;
    spec.optimizer.momentum = momentum;
    spec.optimizer.beta1 = beta1;
    spec.optimizer.beta2 = beta2;
    spec.optimizer.epsilon = epsilon;
    spec.optimizer.weight_decay = weight_decay;
    spec.init.kind = ValueOrThrow(ParseInit(init), "init");
    spec.init.scale = init_scale;
    spec.init.seed = seed;
    Result<TableHandle> h = Unavailable("not created");
    {
      py::gil_scoped_release release;
      h = client_->CreateTable(spec);
    }
    Table t;
    t.handle = ValueOrThrow(std::move(h));
    t.shape = std::move(shape);
    return t;
  }

  // The table `name` as the shards hold it (created by another worker), or
  // UnknownTableError if some shard does not know it.
  Table OpenTable(const std::string& name, std::optional<std::vector<py::ssize_t>> shape) {
    CheckOpen();
    std::vector<ShardStats> stats = StatsOrThrow();
    Table t;
    t.handle.name = name;
    t.handle.shard_ids.resize(stats.size());
    for (size_t s = 0; s < stats.size(); ++s) {
      const ShardStats::TableStat* found = nullptr;
      for (const auto& ts : stats[s].tables) {
        if (ts.name == name) found = &ts;
      }
      if (found == nullptr) {
        Raise(StatusCode::kNotFound,
              "no table '" + name + "' on shard " + std::to_string(s) +
                  "; create it with create_table() (or wait for the worker that creates it)",
              "UnknownTableError");
      }
      t.handle.rows = found->rows;
      t.handle.cols = found->cols;
      t.handle.kind = found->kind;
      t.handle.shard_ids[s] = found->table_id;
    }
    if (t.sparse()) {
      if (shape && (shape->size() != 1 || (*shape)[0] != static_cast<py::ssize_t>(t.handle.cols))) {
        Raise(StatusCode::kInvalidArgument,
              "table '" + name + "' is sparse with rows of " + std::to_string(t.handle.cols) +
                  " values; give its dim as the shape, or none",
              "WrongShapeError");
      }
      t.shape = {static_cast<py::ssize_t>(t.handle.cols)};
    } else if (shape) {
      auto [rows, cols] = RowsCols(name, *shape);
      if (rows * cols != t.handle.size()) {
        t.shape = *shape;
        Raise(StatusCode::kInvalidArgument,
              "table '" + name + "' holds " + std::to_string(t.handle.rows) + " x " +
                  std::to_string(t.handle.cols) + " values, not shape " + t.ShapeText(),
              "WrongShapeError");
      }
      t.shape = *shape;
    } else {
      t.shape = {static_cast<py::ssize_t>(t.handle.rows), static_cast<py::ssize_t>(t.handle.cols)};
    }
    return t;
  }

  py::array Pull(const Table& t, py::object out) {
    ScopedTimer total(&shared_->stats.total_ns);
    CheckOpen();
    CheckDense(t, "pull");
    PullTarget target = NewPullTarget(t, out);
    Future f;
    {
      ScopedTimer c(&shared_->stats.client_ns);
      f = StartPull(t, target, clock_);
    }
    ++shared_->stats.pulls;
    shared_->stats.values_pulled += t.size();
    ThrowIfError(WaitInterruptibly(f, shared_.get(), target.keep, /*is_pull=*/true),
                 "pull '" + t.handle.name + "'");
    return PulledArray(target, t, &shared_->stats);
  }

  // Starts pulling every table (one message per shard), for iteration `for_clock` (-1:
  // this worker's clock).
  std::unique_ptr<PullBatch> StartPulls(py::sequence tables, py::sequence outs, int64_t for_clock) {
    ScopedTimer total(&shared_->stats.total_ns);
    CheckOpen();
    const size_t n = py::len(tables);
    if (py::len(outs) != n) {
      Raise(StatusCode::kInvalidArgument, "start_pulls: " + std::to_string(n) + " tables but " +
                                              std::to_string(py::len(outs)) + " output arrays");
    }
    std::vector<py::object> keep_tables;  // the batch names them in errors
    std::vector<const Table*> ts;
    std::vector<PullTarget> targets;
    keep_tables.reserve(n);
    ts.reserve(n);
    targets.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      py::object t = tables[i];
      if (!py::isinstance<Table>(t)) {
        Raise(StatusCode::kInvalidArgument,
              "start_pulls: tables must be leash.Table values, got " + TypeName(t));
      }
      const Table& table = t.cast<const Table&>();
      CheckDense(table, "start_pulls");
      targets.push_back(NewPullTarget(table, outs[i]));
      ts.push_back(&table);
      keep_tables.push_back(std::move(t));
    }
    std::vector<Future> futures;
    futures.reserve(n);
    {
      ScopedTimer c(&shared_->stats.client_ns);
      client_->HoldSends();
      for (size_t i = 0; i < n; ++i) {
        const int64_t clock = for_clock >= 0 ? for_clock : clock_;
        futures.push_back(StartPull(*ts[i], targets[i], clock));
        shared_->stats.values_pulled += ts[i]->size();
      }
      client_->FlushSends();
    }
    shared_->stats.pulls += n;
    return std::make_unique<PullBatch>(std::move(futures), std::move(targets),
                                       std::move(keep_tables), shared_);
  }

  py::array PullRows(const Table& t, py::handle keys, py::object out) {
    ScopedTimer total(&shared_->stats.total_ns);
    CheckOpen();
    CheckDense(t, "pull_rows");
    Drain();  // the pull is for the client's clock: the queued clocks first
    std::vector<uint64_t> k = CheckedKeys(keys, t);
    const size_t n = k.size() * t.handle.cols;
    std::vector<py::ssize_t> shape = {static_cast<py::ssize_t>(k.size())};
    if (t.shape.size() > 1) {
      shape.insert(shape.end(), t.shape.begin() + 1, t.shape.end());  // rows keep their shape
    }
    py::array a = out.is_none() ? NewArray(shape) : CheckedArray(out, t, "out", true, n);
    Future f;
    {
      ScopedTimer c(&shared_->stats.client_ns);
      f = client_->Pull(t.handle, std::span<const uint64_t>(k),
                        static_cast<float*>(a.mutable_data()));
    }
    ++shared_->stats.pulls;
    shared_->stats.values_pulled += n;
    ThrowIfError(WaitInterruptibly(f, shared_.get(), a, /*is_pull=*/true),
                 "pull '" + t.handle.name + "'");
    return a;
  }

  void Push(const Table& t, py::handle grad, bool wait) {
    ScopedTimer total(&shared_->stats.total_ns);
    CheckOpen();
    CheckDense(t, "push");
    py::array a = CheckedArray(grad, t, "grad", false, t.size());
    Submit(t.size(), [&] { return client_->Push(t.handle, static_cast<const float*>(a.data())); });
    if (wait) WaitPending();
  }

  // Hands a CPU float32 torch tensor of the table's size over to the sender thread, which
  // sends it: the caller must not write it any more (a gradient that backward() just
  // made). Over the socket with a float32 wire the messages to the shards are the
  // tensor's own memory (no copy), so the tensor is kept until every shard has answered
  // and no resend can need it; a 16-bit wire or a shard on this host reached through
  // shared memory gets a copy, and the tensor is let go once made. Returns at once;
  // errors come with a later clock() or wait().
  void PushTensor(py::object table, py::object tensor) {
    ScopedTimer total(&shared_->stats.total_ns);
    ScopedTimer in_hooks(&shared_->stats.tensor_ns);
    CheckOpen();
    if (!py::isinstance<Table>(table)) {
      Raise(StatusCode::kInvalidArgument,
            "push_tensor: table must be a leash.Table, got " + TypeName(table));
    }
    const Table& t = table.cast<const Table&>();
    CheckDense(t, "push_tensor");
    const float* data = TensorData(tensor, t);
    Sender::Job job;
    job.table = &t.handle;
    job.data = data;
    job.values = t.size();
    // The client's last reference going (on whichever thread drops it: the sender's, or
    // ZeroMQ's I/O thread once the last message is sent) only sets a flag: the tensor
    // itself is let go under the GIL, by ReapOwned.
    auto released = std::make_shared<std::atomic<bool>>(false);
    job.owned = std::shared_ptr<const float>(
        data, [released](const float*) { released->store(true, std::memory_order_release); });
    uint64_t seq = sender_->Enqueue(std::move(job));
    owned_.push_back({seq, std::move(table), std::move(tensor), std::move(released)});
    ++shared_->stats.pushes_handed_over;
    ++shared_->stats.pushes;
    shared_->stats.values_pushed += t.size();
    ReapOwned();
  }

  void PushRows(const Table& t, py::handle keys, py::handle grads, bool wait) {
    ScopedTimer total(&shared_->stats.total_ns);
    CheckOpen();
    CheckDense(t, "push_rows");
    std::vector<uint64_t> k = CheckedKeys(keys, t);
    const size_t n = k.size() * t.handle.cols;
    py::array a = CheckedArray(grads, t, "grads", false, n);
    Submit(n, [&] {
      return client_->Push(t.handle, std::span<const uint64_t>(k),
                           static_cast<const float*>(a.data()));
    });
    if (wait) WaitPending();
  }

  // Rows `keys` of a sparse table (any 64-bit keys; a row is created on its first pull),
  // as a (len(keys), dim) array, for this worker's clock or iteration `for_clock`.
  py::array PullSparse(const Table& t, py::handle keys, py::object out, int64_t for_clock) {
    ScopedTimer total(&shared_->stats.total_ns);
    CheckOpen();
    CheckSparse(t, "pull_sparse");
    std::vector<uint64_t> k = CheckedKeys(keys, t);
    const size_t n = k.size() * t.handle.cols;
    py::array a = out.is_none() ? NewArray({static_cast<py::ssize_t>(k.size()),
                                            static_cast<py::ssize_t>(t.handle.cols)})
                                : CheckedArray(out, t, "out", true, n);
    if (k.empty()) return a;
    Future f;
    {
      ScopedTimer c(&shared_->stats.client_ns);
      f = client_->PullSparse(t.handle, std::span<const uint64_t>(k),
                              static_cast<float*>(a.mutable_data()),
                              for_clock >= 0 ? for_clock : clock_);
    }
    ++shared_->stats.pulls;
    shared_->stats.values_pulled += n;
    ThrowIfError(WaitInterruptibly(f, shared_.get(), a, /*is_pull=*/true),
                 "pull_sparse '" + t.handle.name + "'");
    return a;
  }

  // Gradient rows of `keys` of a sparse table ((len(keys), dim) float32; a key named
  // twice has its rows summed).
  void PushSparse(const Table& t, py::handle keys, py::handle grads, bool wait) {
    ScopedTimer total(&shared_->stats.total_ns);
    CheckOpen();
    CheckSparse(t, "push_sparse");
    std::vector<uint64_t> k = CheckedKeys(keys, t);
    const size_t n = k.size() * t.handle.cols;
    py::array a = CheckedArray(grads, t, "grads", false, n);
    if (k.empty()) return;
    Submit(n, [&] {
      return client_->PushSparse(t.handle, std::span<const uint64_t>(k),
                                 static_cast<const float*>(a.data()));
    });
    if (wait) WaitPending();
  }

  // push_sparse for an array nobody writes any more (SparseEmbedding's gradient rows):
  // while the sender holds pushes (a backward's dense gradients) it is queued behind them
  // instead of waiting for them here; else it is pushed now. Errors as push_sparse's.
  void PushSparseTensor(py::object table, py::handle keys, py::object grads) {
    if (!py::isinstance<Table>(table)) {
      Raise(StatusCode::kInvalidArgument,
            "push_sparse_tensor: table must be a leash.Table, got " + TypeName(table));
    }
    if (sender_ == nullptr || sender_->idle()) {
      PushSparse(table.cast<const Table&>(), keys, grads, false);
      return;
    }
    ScopedTimer total(&shared_->stats.total_ns);
    CheckOpen();
    const Table& t = table.cast<const Table&>();
    CheckSparse(t, "push_sparse");
    Sender::Job job;
    job.keys = CheckedKeys(keys, t);
    const size_t n = job.keys.size() * t.handle.cols;
    py::array a = CheckedArray(grads, t, "grads", false, n);
    if (job.keys.empty()) return;
    job.table = &t.handle;
    job.data = static_cast<const float*>(a.data());
    job.values = n;
    uint64_t seq = sender_->Enqueue(std::move(job));
    owned_.push_back({seq, std::move(table), std::move(a), nullptr});
    ++shared_->stats.pushes;
    shared_->stats.values_pushed += n;
    ReapOwned();
  }

  // Ends this worker's iteration (after its pushes, in the same message per shard). The
  // previous iteration's pushes must be done before this returns, which bounds what is in
  // flight to two iterations (as leash-worker does); raises the first error among them.
  //
  // Behind pushes handed to the sender (push_tensor) the clock is queued after them and
  // this returns at once: its waits happen on the sender, and their errors come with a
  // later clock() or wait(). At most two clocks wait in the queue.
  int64_t Clock() {
    ScopedTimer total(&shared_->stats.total_ns);
    CheckOpen();
    ++shared_->stats.clocks;
    if (!sender_->idle()) {
      Sender::Job job;
      job.clock = true;
      sender_->Enqueue(job);
      ++clock_;
      ReapOwned();
      shared_->graveyard.Reap();
      ThrowIfError(sender_->TakeError());
      if (sender_->queued_clocks() > 2) {
        WaitForSender([&] { return sender_->WaitClocksBelow(3, kWaitSliceMs); });
      }
      return clock_;
    }
    std::lock_guard<std::mutex> exec(sender_->exec_mu);
    PushState& s = sender_->state;
    {
      ScopedTimer c(&shared_->stats.client_ns);
      s.clocks.push_back(client_->Clock());
      s.holding = false;
      client_->FlushSends();
    }
    ++clock_;
    Status first = std::exchange(s.deferred, Status::Ok());
    if (first.ok()) first = sender_->TakeError();
    while (s.previous > 0) {
      Status st = WaitInterruptibly(s.pending.front(), shared_.get());
      s.pending.pop_front();
      --s.previous;
      if (!st.ok() && first.ok()) first = st.WithContext("push");
    }
    s.previous = s.pending.size();
    while (s.clocks.size() > 2) {
      Status st = WaitInterruptibly(s.clocks.front(), shared_.get());
      s.clocks.pop_front();
      if (!st.ok() && first.ok()) first = st.WithContext("clock");
    }
    ReapOwned();
    shared_->graveyard.Reap();
    ThrowIfError(first);
    return clock_;
  }

  // Sends what is held and waits for every push and clock sent so far.
  void WaitPending() {
    CheckOpen();
    Drain();
    std::lock_guard<std::mutex> exec(sender_->exec_mu);
    PushState& s = sender_->state;
    s.holding = false;
    client_->FlushSends();
    Status first = std::exchange(s.deferred, Status::Ok());
    if (first.ok()) first = sender_->TakeError();
    while (!s.pending.empty()) {
      Status st = WaitInterruptibly(s.pending.front(), shared_.get());
      s.pending.pop_front();
      if (!st.ok() && first.ok()) first = st.WithContext("push");
    }
    s.previous = 0;
    while (!s.clocks.empty()) {
      Status st = WaitInterruptibly(s.clocks.front(), shared_.get());
      s.clocks.pop_front();
      if (!st.ok() && first.ok()) first = st.WithContext("clock");
    }
    ReapOwned();
    ThrowIfError(first);
  }

  py::dict NextChunk(const DataPlan& plan, std::optional<ChunkDone> done) {
    CheckOpen();
    if (plan.num_samples == 0 || plan.chunk_size == 0 || plan.epochs == 0) {
      Raise(StatusCode::kInvalidArgument,
            "a data plan needs num_samples, chunk_size and epochs > 0");
    }
    Result<ChunkGrant> g = Unavailable("no grant");
    {
      py::gil_scoped_release release;
      g = client_->NextChunk(plan, done ? &*done : nullptr);
    }
    return GrantDict(ValueOrThrow(std::move(g)));
  }

  bool needs_rejoin() const { return client_ != nullptr && client_->needs_rejoin(); }

  // Drops this incarnation's pushes, clocks and pulls in flight and registers again.
  void Rejoin() {
    CheckOpen();
    Drain();
    std::lock_guard<std::mutex> exec(sender_->exec_mu);
    PushState& s = sender_->state;
    s.holding = false;
    client_->FlushSends();
    {
      py::gil_scoped_release release;
      for (auto& f : s.pending) f.wait();
      for (auto& f : s.clocks) f.wait();
    }
    s.pending.clear();
    s.clocks.clear();
    s.previous = 0;
    s.deferred = Status::Ok();
    (void)sender_->TakeError();
    ReapOwned();
    Status st;
    {
      py::gil_scoped_release release;
      st = client_->Rejoin();
    }
    clock_ = client_->clock();
    ThrowIfError(st, "rejoin");
  }

  py::list Stats() {
    CheckOpen();
    py::list out;
    for (const auto& s : StatsOrThrow()) out.append(StatsDict(s));
    return out;
  }

  std::vector<int64_t> Checkpoint() {
    CheckOpen();
    Result<std::vector<int64_t>> r = Unavailable("no checkpoint");
    {
      py::gil_scoped_release release;
      r = client_->Checkpoint();
    }
    return ValueOrThrow(std::move(r), "checkpoint");
  }

  // Sends what is held, leaves the job (every shard drops this worker at once) and closes
  // the connections. Pushes already sent reach the shards before the leave. Idempotent.
  void Leave() {
    if (client_ == nullptr) return;
    if (shared_->waiters > 0) {
      Raise(StatusCode::kFailedPrecondition,
            "leave() while another thread waits on this client; stop it first");
    }
    sender_->SkipAcks();  // what it holds is sent, without waiting for acknowledgements
    Drain();
    {
      std::lock_guard<std::mutex> exec(sender_->exec_mu);
      sender_->state.holding = false;
      client_->FlushSends();
    }
    Status st;
    if (client_->worker_id() != 0 && registered_) {
      py::gil_scoped_release release;
      st = client_->Leave();
    }
    Destroy();
    ThrowIfError(st, "leave");
  }

  // Closes the connections without leaving (the shards evict this worker when its lease
  // expires).
  void Close() { Destroy(); }

  bool closed() const { return client_ == nullptr; }
  int64_t clock() const { return client_ ? clock_ : -1; }
  int64_t staleness() const { return staleness_; }
  uint64_t worker_id() const { return client_ ? client_->worker_id() : 0; }
  int num_shards() const { return client_ ? client_->num_shards() : 0; }

  py::dict Counters() const {
    py::dict d;
    if (client_) {
      ClientCounters c = client_->counters();
      d["bytes_sent"] = c.bytes_sent;
      d["bytes_received"] = c.bytes_received;
      d["requests"] = c.requests;
      d["resends"] = c.resends;
      d["backup_reply_resends"] = c.backup_reply_resends;
      d["pushes"] = c.pushes;
      d["pulls"] = c.pulls;
      d["pulled_min_clock"] = c.pulled_min_clock;
      d["shared_memory_shards"] = c.shared_memory_shards;
      d["shared_memory_backups"] = c.shared_memory_backups;
      d["answering_backups"] = c.answering_backups;
    }
    return d;
  }

  py::dict BindingTimes() {
    if (sender_ != nullptr) ReapOwned();
    const BindingStats& s = shared_->stats;
    py::dict d;
    d["pulls"] = s.pulls;
    d["pushes"] = s.pushes;
    d["clocks"] = s.clocks;
    d["waits"] = s.waits;
    d["total_ns"] = s.total_ns;
    d["wait_ns"] = s.wait_ns;
    d["gil_ns"] = s.gil_ns;
    d["client_ns"] = s.client_ns;
    d["tensor_ns"] = s.tensor_ns;
    d["sender_ns"] = sender_ ? sender_->busy_ns() : 0;
    d["values_pulled"] = s.values_pulled;
    d["values_pulled_in_place"] = s.values_pulled_in_place;
    d["values_pushed"] = s.values_pushed;
    d["pushes_handed_over"] = s.pushes_handed_over;
    d["tensors_held"] = owned_.size();  // handed-over arrays not let go yet
    return d;
  }
  void ResetBindingTimes() {
    shared_->stats = BindingStats{};
    if (sender_) sender_->reset_busy_ns();
  }

  void set_registered(bool r) { registered_ = r; }

 private:
  // Sends a pull of `t` for `clock` into `target` (NewPullTarget).
  Future StartPull(const Table& t, const PullTarget& target, int64_t clock) {
    return target.into != nullptr ? client_->Pull(t.handle, target.into, clock)
                                  : client_->PullInPlace(t.handle, target.in_place.values, clock);
  }

  static Result<InitKind> ParseInit(const std::string& name) {
    if (name == "zeros") return InitKind::kZeros;
    if (name == "uniform") return InitKind::kUniform;
    if (name == "normal") return InitKind::kNormal;
    if (name == "constant") return InitKind::kConstant;
    return InvalidArgument("unknown initializer '" + name +
                           "' (use zeros, uniform, normal or constant)");
  }

  // A table of `shape` holds shape[0] rows of the product of the other dimensions.
  static std::pair<uint64_t, uint64_t> RowsCols(const std::string& name,
                                                const std::vector<py::ssize_t>& shape) {
    if (shape.empty()) {
      Raise(StatusCode::kInvalidArgument, "table '" + name + "' needs a shape, e.g. (rows, cols)");
    }
    uint64_t cols = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] <= 0) {
        Raise(StatusCode::kInvalidArgument,
              "table '" + name + "': every dimension of its shape must be > 0");
      }
      if (i > 0) cols *= static_cast<uint64_t>(shape[i]);
    }
    if (cols > UINT32_MAX) {
      Raise(StatusCode::kInvalidArgument,
            "table '" + name + "': a row of " + std::to_string(cols) +
                " values is too wide (at most 2^32 - 1); put more in the first dimension");
    }
    return {static_cast<uint64_t>(shape[0]), cols};
  }

  void CheckOpen() const {
    if (client_ == nullptr) RaiseClosed();
  }
  static void CheckDense(const Table& t, const char* call) {
    if (t.sparse()) {
      Raise(StatusCode::kInvalidArgument,
            std::string(call) + ": table '" + t.handle.name +
                "' is sparse; use pull_sparse / push_sparse with its keys");
    }
  }
  static void CheckSparse(const Table& t, const char* call) {
    if (!t.sparse()) {
      Raise(StatusCode::kInvalidArgument,
            std::string(call) + ": table '" + t.handle.name +
                "' is dense; use pull / push (or pull_rows / push_rows for some of its rows)");
    }
  }

  std::vector<ShardStats> StatsOrThrow() {
    Result<std::vector<ShardStats>> r = Unavailable("no stats");
    {
      py::gil_scoped_release release;
      r = client_->Stats();
    }
    return ValueOrThrow(std::move(r), "stats");
  }

  // Sends a push (held with this iteration's others until a bucket's worth or the clock).
  // Runs on this thread after what the sender holds (the push copies its array now).
  template <typename F>
  void Submit(size_t values, const F& push) {
    Drain();
    std::lock_guard<std::mutex> exec(sender_->exec_mu);
    PushState& s = sender_->state;
    {
      ScopedTimer c(&shared_->stats.client_ns);
      if (!s.holding) {
        client_->HoldSends();
        s.holding = true;
        s.held_bytes = 0;
      }
      s.pending.push_back(push());
      s.held_bytes += values * sizeof(float);
      if (s.held_bytes >= kPushBucketBytes) {
        client_->FlushSends();
        client_->HoldSends();
        s.held_bytes = 0;
      }
    }
    ++shared_->stats.pushes;
    shared_->stats.values_pushed += values;
    // Pushes with no clock between them are bounded too; their errors wait for the next
    // clock() or wait().
    while (s.pending.size() > kMaxPendingPushes) {
      Status st = WaitInterruptibly(s.pending.front(), shared_.get());
      s.pending.pop_front();
      if (s.previous > 0) --s.previous;
      if (!st.ok() && s.deferred.ok()) s.deferred = st.WithContext("push");
    }
  }

  // Waits, the GIL released and Ctrl-C honoured, until the sender has run every job
  // queued so far.
  void Drain() {
    if (sender_->idle()) return;
    WaitForSender([&] { return sender_->WaitIdle(kWaitSliceMs); });
  }

  // Calls `wait_slice` (a wait of at most kWaitSliceMs on the sender, true when done)
  // with the GIL released until it returns true, running the signal handlers between
  // slices. Counts as a waiter: the client is not closed under it.
  template <typename F>
  void WaitForSender(const F& wait_slice) {
    ++shared_->waiters;
    struct Leave {
      Shared* s;
      ~Leave() { --s->waiters; }
    } leave{shared_.get()};
    while (true) {
      bool done = false;
      {
        py::gil_scoped_release release;
        done = wait_slice();
      }
      if (done) return;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }

  // Drops the arrays of handed-over pushes nothing reads any more: the sender has run
  // their job and, for a tensor handed over to the client, the client has let it go.
  void ReapOwned() {
    const uint64_t done = sender_->done_seq();
    std::erase_if(owned_, [done](const Owned& o) {
      return o.seq <= done &&
             (o.released == nullptr || o.released->load(std::memory_order_acquire));
    });
  }

  // The data of `tensor`, a CPU, C-contiguous float32 torch.Tensor of t.size() values.
  static const float* TensorData(py::handle tensor, const Table& t) {
    // Kept for the life of the process (never destroyed after the interpreter).
    static py::object* torch_tensor = nullptr;
    static py::object* float32 = nullptr;
    if (torch_tensor == nullptr) {
      py::module_ torch = py::module_::import("torch");
      torch_tensor = new py::object(torch.attr("Tensor"));
      float32 = new py::object(torch.attr("float32"));
    }
    if (!py::isinstance(tensor, *torch_tensor)) {
      Raise(StatusCode::kInvalidArgument,
            "push_tensor for table '" + t.handle.name + "' needs a torch.Tensor, got " +
                TypeName(tensor),
            "WrongDTypeError");
    }
    py::object dtype = tensor.attr("dtype");
    if (!dtype.is(*float32)) {
      Raise(StatusCode::kInvalidArgument,
            "push_tensor for table '" + t.handle.name + "' needs float32, not " +
                std::string(py::str(dtype)),
            "WrongDTypeError");
    }
    if (py::str(tensor.attr("device").attr("type")).cast<std::string>() != "cpu") {
      Raise(StatusCode::kInvalidArgument,
            "push_tensor for table '" + t.handle.name + "' needs a CPU tensor; use push()",
            "InvalidArgumentError");
    }
    if (tensor.attr("numel")().cast<size_t>() != t.size() ||
        !tensor.attr("is_contiguous")().cast<bool>()) {
      Raise(StatusCode::kInvalidArgument,
            "push_tensor for table '" + t.handle.name + "' needs a contiguous tensor of " +
                std::to_string(t.size()) + " values",
            "WrongShapeError");
    }
    return reinterpret_cast<const float*>(tensor.attr("data_ptr")().cast<uintptr_t>());
  }

  // The shard directory of job o.job in the etcd cluster at o.etcd (each entry a URL or a
  // comma-separated list). Each request to etcd gives up after at most connect_timeout, so
  // an unreachable etcd fails within it. Raises InvalidArgumentError for a bad URL or job.
  static std::shared_ptr<ShardDirectory> OpenDirectory(const ConnectOptions& o) {
    EtcdOptions eo;
    eo.job = o.job;
    for (const std::string& e : o.etcd) {
      std::vector<std::string> urls = ValueOrThrow(ParseEtcdEndpoints(e), "etcd");
      eo.endpoints.insert(eo.endpoints.end(), urls.begin(), urls.end());
    }
    eo.request_timeout =
        std::min(eo.request_timeout,
                 std::chrono::milliseconds(std::max<int64_t>(o.connect_timeout_ms, 200)));
    return ValueOrThrow(NewEtcdShardDirectory(eo), "etcd");
  }

  void Destroy() {
    if (client_ == nullptr) return;
    if (shared_->waiters > 0) {
      Raise(StatusCode::kFailedPrecondition,
            "closing a leash.Client while another thread waits on it; stop that thread first");
    }
    shared_->closed = true;
    shared_->client = nullptr;
    sender_.reset();  // stops its thread (the jobs still queued are dropped)
    client_.reset();  // stops the I/O thread: no reply writes into an array any more
    shared_->graveyard.entries.clear();
    ctx_.reset();  // frees the messages still queued, which may read handed-over tensors
    owned_.clear();
  }

  std::unique_ptr<ZmqContext> ctx_;
  std::unique_ptr<leash::Client> client_;
  int64_t staleness_ = 0;
  bool registered_ = true;
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
  std::unique_ptr<Sender> sender_;  // while open; destroyed before client_
  int64_t clock_ = 0;  // this worker's clock, counting the clocks the sender still holds
  // Handed-over pushes' tables and arrays, kept until nothing reads them (ReapOwned).
  struct Owned {
    uint64_t seq;
    py::object table;
    py::object array;
    std::shared_ptr<std::atomic<bool>> released;  // null: read only by the sender's job
  };
  std::deque<Owned> owned_;
};

}  // namespace
}  // namespace leash::python

PYBIND11_MODULE(_leash, m) {
  using namespace leash;
  using namespace leash::python;
  m.doc() = "Leash's C++ client (leash::Client) for Python; use the leash package, not this.";

  m.def(
      "status_code_names",
      [] {
        py::dict d;
        for (int c = 0; c <= static_cast<int>(StatusCode::kNotRegistered); ++c) {
          d[py::int_(c)] = std::string(StatusCodeName(static_cast<StatusCode>(c)));
        }
        return d;
      },
      "Leash's status codes: {number: name}, as leash/common/status.h defines them.");
  m.def(
      "better_openblas_core",
      [](const std::string& core) {
        return kernels::cpu::BetterOpenBlasCore(core, kernels::cpu::HostIsa());
      },
      py::arg("core"),
      "The OPENBLAS_CORETYPE to use on this CPU instead of OpenBLAS's kernels `core` "
      "(openblas_get_corename()), or '' where OpenBLAS's own choice stands: only a pre-AVX "
      "fallback on a CPU with AVX or more is replaced (leash/kernels/blas_core.h).");
  m.def(
      "init_logging",
      [](const std::string& level) { ThrowIfError(InitLogging("leash", level), "log level"); },
      py::arg("level"), "Logs Leash's client messages to stderr at `level`; call once.");
  m.def(
      "set_log_level",
      [](const std::string& level) {
        auto lvl = spdlog::level::from_str(level);
        if (lvl == spdlog::level::off && level != "off") {
          Raise(StatusCode::kInvalidArgument,
                "unknown log level '" + level + "' (use trace, debug, info, warn, error or off)");
        }
        spdlog::set_level(lvl);
      },
      py::arg("level"));

  py::class_<DataPlan>(m, "DataPlan")
      .def(py::init([](uint64_t num_samples, uint32_t chunk_size, uint32_t epochs, uint64_t seed) {
             return DataPlan{num_samples, chunk_size, epochs, seed};
           }),
           py::arg("num_samples"), py::arg("chunk_size") = 1024, py::arg("epochs") = 1,
           py::arg("seed") = 1)
      .def_readwrite("num_samples", &DataPlan::num_samples)
      .def_readwrite("chunk_size", &DataPlan::chunk_size)
      .def_readwrite("epochs", &DataPlan::epochs)
      .def_readwrite("seed", &DataPlan::seed)
      .def("__eq__", [](const DataPlan& a, const DataPlan& b) { return a == b; })
      .def("__repr__", [](const DataPlan& p) {
        return "DataPlan(num_samples=" + std::to_string(p.num_samples) +
               ", chunk_size=" + std::to_string(p.chunk_size) +
               ", epochs=" + std::to_string(p.epochs) + ", seed=" + std::to_string(p.seed) + ")";
      });

  py::class_<ChunkDone>(m, "ChunkDone")
      .def(py::init([](uint32_t epoch, uint32_t chunk) {
             return ChunkDone{epoch, chunk};
           }),
           py::arg("epoch"), py::arg("chunk"));

  py::class_<Table>(m, "Table")
      .def_property_readonly("name", [](const Table& t) { return t.handle.name; })
      .def_property_readonly("shape",
                             [](const Table& t) {
                               py::tuple s(t.shape.size());
                               for (size_t i = 0; i < t.shape.size(); ++i) s[i] = t.shape[i];
                               return s;
                             })
      .def_property_readonly("rows", [](const Table& t) { return t.handle.rows; })
      .def_property_readonly("cols", [](const Table& t) { return t.handle.cols; })
      .def_property_readonly("size", &Table::size)
      .def_property_readonly("sparse", &Table::sparse)
      .def_property_readonly("dim", [](const Table& t) { return t.handle.cols; })
      .def("__repr__", [](const Table& t) {
        if (t.sparse()) {
          return "<leash.Table '" + t.handle.name + "' sparse, dim " +
                 std::to_string(t.handle.cols) + ">";
        }
        return "<leash.Table '" + t.handle.name + "' shape " + t.ShapeText() + ">";
      });

  py::class_<PullBatch>(m, "PullBatch")
      .def("ready", &PullBatch::ready)
      .def("wait", &PullBatch::Wait)
      .def("in_place", &PullBatch::InPlace);

  py::class_<python::Client>(m, "Client")
      .def(
          py::init([](std::vector<std::string> servers, std::vector<std::string> etcd,
                      std::string job, std::string name, int64_t staleness, std::string wire_dtype,
                      int64_t connect_timeout_ms, std::optional<std::string> curve_keys,
                      std::string curve_client, bool shared_memory, int64_t shm_ring_mb,
                      int stripes, bool register_worker, uint64_t worker_id, int64_t heartbeat_ms) {
            ConnectOptions o;
            o.servers = std::move(servers);
            o.etcd = std::move(etcd);
            o.job = std::move(job);
            o.name = std::move(name);
            o.staleness = staleness;
            o.wire_dtype = std::move(wire_dtype);
            o.connect_timeout_ms = connect_timeout_ms;
            o.curve_keys = std::move(curve_keys);
            o.curve_client = std::move(curve_client);
            o.shared_memory = shared_memory;
            o.shm_ring_mb = shm_ring_mb;
            o.stripes = stripes;
            o.register_worker = register_worker;
            o.worker_id = worker_id;
            o.heartbeat_ms = heartbeat_ms;
            auto c = std::make_unique<python::Client>(o);
            c->set_registered(register_worker);
            return c;
          }),
          py::arg("servers"), py::arg("etcd"), py::arg("job"), py::arg("name"),
          py::arg("staleness"), py::arg("wire_dtype"), py::arg("connect_timeout_ms"),
          py::arg("curve_keys"), py::arg("curve_client"), py::arg("shared_memory"),
          py::arg("shm_ring_mb"), py::arg("stripes"), py::arg("register_worker"),
          py::arg("worker_id"), py::arg("heartbeat_ms"))
      .def("create_table", &python::Client::CreateTable, py::arg("name"), py::arg("shape"),
           py::arg("optimizer"), py::arg("lr"), py::arg("momentum"), py::arg("beta1"),
           py::arg("beta2"), py::arg("epsilon"), py::arg("weight_decay"), py::arg("init"),
           py::arg("init_scale"), py::arg("seed"), py::arg("sparse"), py::arg("l1"),
           py::arg("ftrl_beta"), py::arg("clip_value"), py::arg("admit_after"),
           py::arg("expire_after_clocks"))
      .def("open_table", &python::Client::OpenTable, py::arg("name"), py::arg("shape"))
      .def("pull", &python::Client::Pull, py::arg("table"), py::arg("out"))
      .def("start_pulls", &python::Client::StartPulls, py::arg("tables"), py::arg("outs"),
           py::arg("for_clock"), py::keep_alive<0, 1>())
      .def("pull_rows", &python::Client::PullRows, py::arg("table"), py::arg("keys"),
           py::arg("out"))
      .def("push", &python::Client::Push, py::arg("table"), py::arg("grad"), py::arg("wait"))
      .def("push_tensor", &python::Client::PushTensor, py::arg("table"), py::arg("tensor"))
      .def("push_sparse_tensor", &python::Client::PushSparseTensor, py::arg("table"),
           py::arg("keys"), py::arg("grads"))
      .def("push_rows", &python::Client::PushRows, py::arg("table"), py::arg("keys"),
           py::arg("grads"), py::arg("wait"))
      .def("pull_sparse", &python::Client::PullSparse, py::arg("table"), py::arg("keys"),
           py::arg("out"), py::arg("for_clock"))
      .def("push_sparse", &python::Client::PushSparse, py::arg("table"), py::arg("keys"),
           py::arg("grads"), py::arg("wait"))
      .def("clock", &python::Client::Clock)
      .def("wait", &python::Client::WaitPending)
      .def("next_chunk", &python::Client::NextChunk, py::arg("plan"), py::arg("done"))
      .def_property_readonly("needs_rejoin", &python::Client::needs_rejoin)
      .def("rejoin", &python::Client::Rejoin)
      .def("stats", &python::Client::Stats)
      .def("checkpoint", &python::Client::Checkpoint)
      .def("leave", &python::Client::Leave)
      .def("close", &python::Client::Close)
      .def_property_readonly("closed", &python::Client::closed)
      .def_property_readonly("current_clock", &python::Client::clock)
      .def_property_readonly("staleness", &python::Client::staleness)
      .def_property_readonly("worker_id", &python::Client::worker_id)
      .def_property_readonly("num_shards", &python::Client::num_shards)
      .def("counters", &python::Client::Counters)
      .def("binding_times", &python::Client::BindingTimes)
      .def("reset_binding_times", &python::Client::ResetBindingTimes);
}

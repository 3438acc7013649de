// EtcdCoordinator and the etcd ShardDirectory (etcd_coordinator.h) over the gateway client
// (etcd_client.h). Thread-safe: a mutex guards the registration state (never held across a
// request to etcd); LeaseValid reads atomics; one keep-alive thread per joined coordinator.
#include "leash/common/etcd_coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>

#include "etcd_client.h"

namespace leash {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

Status CheckJob(const std::string& job) {
  bool ok = !job.empty() && std::all_of(job.begin(), job.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
  if (!ok) {
    return InvalidArgument("job name '" + job +
                           "' must be letters, digits, '.', '_' or '-' (it names etcd keys)");
  }
  return Status::Ok();
}

// The keys of one job (etcd_coordinator.h).
struct Keys {
  std::string prefix;
  std::string Shape() const { return prefix + "shape"; }
  std::string Shard(uint32_t s) const { return prefix + "shards/" + std::to_string(s) + "/"; }
  std::string Live(uint32_t s, uint32_t r) const { return Shard(s) + "live/" + std::to_string(r); }
  std::string Primary(uint32_t s) const { return Shard(s) + "primary"; }
  std::string Term(uint32_t s) const { return Shard(s) + "term"; }
  std::string InSync(uint32_t s) const { return Shard(s) + "in_sync"; }
};

std::string ShapeJson(JobShape shape) {
  return json{{"num_shards", shape.num_shards}, {"replicas", shape.replicas}}.dump();
}

// "answers" is written only when true: a replica without --backup-answers writes the same
// record as before, and a record without it reads as false (ParseAddressFields).
std::string AddressJson(const ReplicaAddress& a) {
  json j{{"replica", a.replica}, {"endpoint", a.endpoint}, {"boot_id", a.boot_id}};
  if (a.answers) j["answers"] = true;
  return j.dump();
}

std::string PrimaryJson(uint64_t term, const ReplicaAddress& a) {
  json j{{"term", term}, {"replica", a.replica}, {"endpoint", a.endpoint}, {"boot_id", a.boot_id}};
  if (a.answers) j["answers"] = true;
  return j.dump();
}

Result<json> ParseValue(const etcd::KeyValue& kv) {
  json j = json::parse(kv.value, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return Internal("etcd key " + kv.key + " holds '" + kv.value.substr(0, 100) +
                    "', not Leash's JSON; was it written by another program?");
  }
  return j;
}

template <typename T>
T Field(const json& j, const char* name, T fallback = T{}) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    return fallback;
  }
}

Result<JobShape> ParseShape(const etcd::KeyValue& kv) {
  LEASH_ASSIGN_OR_RETURN(json j, ParseValue(kv));
  JobShape shape{Field<uint32_t>(j, "num_shards"), Field<uint32_t>(j, "replicas")};
  if (shape.num_shards == 0 || shape.replicas == 0) {
    return Internal("etcd key " + kv.key + " holds no job shape: " + kv.value.substr(0, 100));
  }
  return shape;
}

// A replica's address from a live or primary record (AddressJson, PrimaryJson).
ReplicaAddress ParseAddressFields(const json& j) {
  return ReplicaAddress{Field<uint32_t>(j, "replica"), Field<std::string>(j, "endpoint"),
                        Field<uint64_t>(j, "boot_id"), Field<bool>(j, "answers")};
}

Result<ReplicaAddress> ParseAddress(const etcd::KeyValue& kv) {
  LEASH_ASSIGN_OR_RETURN(json j, ParseValue(kv));
  return ParseAddressFields(j);
}

Result<std::vector<uint32_t>> ParseInSync(const etcd::KeyValue& kv) {
  LEASH_ASSIGN_OR_RETURN(json j, ParseValue(kv));
  if (!j.is_array()) return Internal("etcd key " + kv.key + " holds no list: " + kv.value);
  std::vector<uint32_t> set;
  for (const json& e : j) {
    if (!e.is_number_unsigned()) return Internal("etcd key " + kv.key + " holds " + kv.value);
    set.push_back(e.get<uint32_t>());
  }
  std::sort(set.begin(), set.end());
  return set;
}

std::string ShapeText(JobShape s) {
  return std::to_string(s.num_shards) + " shards x " + std::to_string(s.replicas) + " replicas";
}

bool ParseIndex(std::string_view text, uint32_t* out) {
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && p == text.data() + text.size();
}

// One job's view from a prefix read of its keys.
Result<ClusterView> BuildView(const Keys& keys, const std::string& job,
                              const etcd::RangeResult& range) {
  ClusterView view;
  view.revision = range.revision;
  const etcd::KeyValue* shape_kv = nullptr;
  for (const etcd::KeyValue& kv : range.kvs) {
    if (kv.key == keys.Shape()) shape_kv = &kv;
  }
  if (shape_kv == nullptr) {
    return NotFound("no replica of job '" + job +
                    "' has registered in etcd yet; start the servers with the same --etcd and "
                    "--job");
  }
  LEASH_ASSIGN_OR_RETURN(JobShape shape, ParseShape(*shape_kv));
  view.num_shards = shape.num_shards;
  view.replicas = shape.replicas;
  view.shards.resize(shape.num_shards);
  for (uint32_t s = 0; s < shape.num_shards; ++s) view.shards[s].shard = s;
  const std::string shards = keys.prefix + "shards/";
  for (const etcd::KeyValue& kv : range.kvs) {
    if (kv.key.rfind(shards, 0) != 0) continue;
    std::string_view rest = std::string_view(kv.key).substr(shards.size());
    size_t slash = rest.find('/');
    uint32_t s = 0;
    if (slash == std::string_view::npos || !ParseIndex(rest.substr(0, slash), &s) ||
        s >= shape.num_shards) {
      continue;  // not a key of this shape: ignored
    }
    std::string_view name = rest.substr(slash + 1);
    ShardView& shard = view.shards[s];
    if (name == "primary") {
      LEASH_ASSIGN_OR_RETURN(json j, ParseValue(kv));
      shard.term = Field<uint64_t>(j, "term");
      shard.primary = ParseAddressFields(j);
    } else if (name == "in_sync") {
      LEASH_ASSIGN_OR_RETURN(shard.in_sync, ParseInSync(kv));
    } else if (name.rfind("live/", 0) == 0) {
      LEASH_ASSIGN_OR_RETURN(ReplicaAddress a, ParseAddress(kv));
      shard.live.push_back(std::move(a));
    }
  }
  for (ShardView& shard : view.shards) {
    std::sort(
        shard.live.begin(), shard.live.end(),
        [](const ReplicaAddress& a, const ReplicaAddress& b) { return a.replica < b.replica; });
  }
  return view;
}

Result<std::unique_ptr<etcd::Client>> NewClient(const EtcdOptions& options,
                                                milliseconds request_timeout) {
  etcd::ClientOptions o;
  o.endpoints = options.endpoints;
  o.request_timeout = request_timeout;
  o.connect_timeout = std::min(request_timeout, milliseconds(1000));
  return etcd::Client::Create(std::move(o));
}

// Logs a failing etcd once, then at most every 10 s while it keeps failing, and its return.
class OutageLog {
 public:
  explicit OutageLog(std::string what) : what_(std::move(what)) {}
  void Failed(const Status& s) {
    auto now = Clock::now();
    if (!failing_) {
      failing_ = true;
      since_ = last_ = now;
      failures_ = 1;
      spdlog::warn("{}: {}", what_, s.message());
      return;
    }
    ++failures_;
    if (now - last_ >= std::chrono::seconds(10)) {
      last_ = now;
      spdlog::warn("{}: still failing after {} s ({} attempts): {}", what_,
                   std::chrono::duration_cast<std::chrono::seconds>(now - since_).count(),
                   failures_, s.message());
    }
  }
  void Succeeded() {
    if (!failing_) return;
    failing_ = false;
    spdlog::info("{}: etcd answers again after {} ms", what_,
                 std::chrono::duration_cast<milliseconds>(Clock::now() - since_).count());
  }

 private:
  std::string what_;
  bool failing_ = false;
  Clock::time_point since_, last_;
  uint64_t failures_ = 0;
};

}  // namespace

Result<std::vector<std::string>> ParseEtcdEndpoints(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view part = text.substr(start, comma - start);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
    if (!part.empty()) {
      std::string e(part);
      if (e.find("://") == std::string::npos) e = "http://" + e;
      while (!e.empty() && e.back() == '/') e.pop_back();
      out.push_back(std::move(e));
    }
    start = comma + 1;
  }
  if (out.empty()) {
    return InvalidArgument("--etcd names no endpoint; pass e.g. --etcd http://127.0.0.1:2379");
  }
  return out;
}

std::string EtcdJobPrefix(std::string_view job) { return "/leash/" + std::string(job) + "/"; }

// ---------------------------------------------------------------------------- coordinator

struct EtcdCoordinator::Impl {
  EtcdOptions options;
  JobShape shape;
  Keys keys;
  std::unique_ptr<etcd::Client> client;     // requests of the caller's threads
  std::unique_ptr<etcd::Client> keepalive;  // the keep-alive thread's, with a shorter timeout

  // Lock-free for LeaseValid(): the steady-clock time (ns) until which the lease is certainly
  // alive, and whether the term held was won under a lease since lost.
  std::atomic<int64_t> valid_until_ns{0};
  std::atomic<bool> term_lost{false};
  std::atomic<bool> paused{false};

  mutable std::mutex mu;
  std::condition_variable cv;
  bool joined = false;    // guarded by mu
  bool stopping = false;  // guarded by mu
  uint32_t shard = 0;
  ReplicaAddress self;
  int64_t lease_id = 0;  // 0 while lost and not registered again
  std::chrono::seconds ttl{0};
  uint64_t held_term = 0;
  std::string held_value;  // the primary key's value this replica wrote for held_term
  std::thread thread;      // guarded by mu

  milliseconds Margin() const {
    return std::max(milliseconds(200), std::chrono::duration_cast<milliseconds>(ttl) / 5);
  }
  // The lease is alive until at least `sent` + its TTL (etcd renews it on receipt).
  void Renewed(Clock::time_point sent, std::chrono::seconds granted) {
    auto until = sent + granted - Margin();
    valid_until_ns.store(
        std::chrono::duration_cast<std::chrono::nanoseconds>(until.time_since_epoch()).count());
  }

  // Grants a lease and registers `self` under it.
  Result<etcd::Lease> Register(uint32_t s, const ReplicaAddress& a, etcd::Client& c,
                               Clock::time_point* sent) {
    auto want = std::chrono::ceil<std::chrono::seconds>(options.ttl);
    *sent = Clock::now();
    LEASH_ASSIGN_OR_RETURN(etcd::Lease lease,
                           c.LeaseGrant(std::max(want, std::chrono::seconds(1))));
    Status put = c.Put(keys.Live(s, a.replica), AddressJson(a), lease.id).status();
    if (!put.ok()) {
      (void)c.LeaseRevoke(lease.id);
      return put;
    }
    return lease;
  }

  void KeepAliveLoop() {
    OutageLog outage("etcd keep-alive of shard " + std::to_string(shard) + " replica " +
                     std::to_string(self.replica));
    std::unique_lock<std::mutex> lock(mu);
    const milliseconds interval = std::chrono::duration_cast<milliseconds>(ttl) / 3;
    const milliseconds retry = std::min(milliseconds(250), interval / 2);
    auto next = Clock::now() + interval;
    while (!stopping) {
      cv.wait_until(lock, next, [&] { return stopping; });
      if (stopping) break;
      if (Clock::now() < next) continue;
      if (paused.load()) {
        next = Clock::now() + retry;
        continue;
      }
      const int64_t lease = lease_id;
      const uint32_t s = shard;
      const ReplicaAddress a = self;
      lock.unlock();
      const auto sent = Clock::now();
      Status failure;
      bool lost = false;
      std::optional<etcd::Lease> regranted;
      Clock::time_point regrant_sent;
      if (lease != 0) {
        Result<int64_t> r = keepalive->LeaseKeepAlive(lease);
        if (r.ok() && *r > 0) {
          Renewed(sent, std::chrono::seconds(*r));
        } else if (r.ok()) {
          lost = true;
        } else {
          failure = r.status();
        }
      }
      if (lost || lease == 0) {
        valid_until_ns.store(0);
        if (lost) {
          spdlog::warn(
              "etcd lease of shard {} replica {} expired (cut off from etcd for the TTL); "
              "registering again under a new lease",
              s, a.replica);
        }
        Result<etcd::Lease> g = Register(s, a, *keepalive, &regrant_sent);
        if (g.ok()) {
          regranted = *g;
        } else {
          failure = g.status();
        }
      }
      if (failure.ok()) {
        outage.Succeeded();
      } else {
        outage.Failed(failure);
      }
      lock.lock();
      if (lost || lease == 0) {
        lease_id = 0;
        if (held_term != 0) term_lost.store(true);
      }
      if (regranted && !stopping) {
        lease_id = regranted->id;
        ttl = regranted->ttl;
        Renewed(regrant_sent, regranted->ttl);
        spdlog::info("shard {} replica {} registered again in etcd (lease {:x})", s, a.replica,
                     regranted->id);
      } else if (regranted) {
        lock.unlock();
        (void)keepalive->LeaseRevoke(regranted->id);
        lock.lock();
      }
      next = failure.ok() ? sent + interval : Clock::now() + retry;
    }
  }

  void StopThread() {
    std::thread t;
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
      t = std::move(thread);
    }
    cv.notify_all();
    if (t.joinable()) t.join();
    std::lock_guard<std::mutex> lock(mu);
    stopping = false;
  }
};

EtcdCoordinator::EtcdCoordinator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EtcdCoordinator::~EtcdCoordinator() { impl_->StopThread(); }

Result<std::unique_ptr<EtcdCoordinator>> EtcdCoordinator::Create(const EtcdOptions& options,
                                                                 JobShape shape) {
  LEASH_RETURN_IF_ERROR(CheckJob(options.job));
  if (shape.num_shards == 0 || shape.replicas == 0) {
    return InvalidArgument("a job needs at least one shard and one replica, not " +
                           ShapeText(shape));
  }
  if (options.ttl < milliseconds(1000)) {
    return InvalidArgument("the etcd lease TTL must be at least 1 s, not " +
                           std::to_string(options.ttl.count()) + " ms");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->shape = shape;
  impl->keys.prefix = EtcdJobPrefix(options.job);
  LEASH_ASSIGN_OR_RETURN(impl->client, NewClient(options, options.request_timeout));
  // A keep-alive must not outlast its interval.
  const milliseconds keepalive_timeout = std::max(milliseconds(200), options.ttl / 3);
  LEASH_ASSIGN_OR_RETURN(impl->keepalive, NewClient(options, keepalive_timeout));
  return std::unique_ptr<EtcdCoordinator>(new EtcdCoordinator(std::move(impl)));
}

Status EtcdCoordinator::Join(uint32_t shard, const ReplicaAddress& self) {
  Impl& m = *impl_;
  if (shard >= m.shape.num_shards) {
    return InvalidArgument("shard " + std::to_string(shard) + " is outside the job's " +
                           std::to_string(m.shape.num_shards) + " shards");
  }
  if (self.replica >= m.shape.replicas) {
    return InvalidArgument("replica " + std::to_string(self.replica) + " is outside the job's " +
                           std::to_string(m.shape.replicas) + " replicas");
  }
  if (self.endpoint.empty()) return InvalidArgument("a replica needs an endpoint to register");
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.joined) {
      return FailedPrecondition("this coordinator already joined shard " + std::to_string(m.shard) +
                                "; Leave first");
    }
  }
  // The job's shape: recorded by the first replica, checked by every later one.
  const std::string shape_json = ShapeJson(m.shape);
  LEASH_ASSIGN_OR_RETURN(etcd::TxnResult t,
                         m.client->Txn({etcd::Compare::CreateRevision(m.keys.Shape(), 0)},
                                       {etcd::Operation::Put(m.keys.Shape(), shape_json)},
                                       {etcd::Operation::Range(m.keys.Shape())}));
  if (!t.succeeded && !t.ranges.empty() && !t.ranges[0].kvs.empty()) {
    LEASH_ASSIGN_OR_RETURN(JobShape recorded, ParseShape(t.ranges[0].kvs[0]));
    if (recorded.num_shards != m.shape.num_shards || recorded.replicas != m.shape.replicas) {
      return FailedPrecondition("job '" + m.options.job + "' in etcd has " + ShapeText(recorded) +
                                ", but this replica was started with " + ShapeText(m.shape) +
                                "; use the job's --shards and --replicas, or another --job");
    }
  }
  Clock::time_point sent;
  LEASH_ASSIGN_OR_RETURN(etcd::Lease lease, m.Register(shard, self, *m.client, &sent));
  {
    std::unique_lock<std::mutex> lock(m.mu);
    if (m.joined) {  // a concurrent Join won
      lock.unlock();
      (void)m.client->LeaseRevoke(lease.id);
      return FailedPrecondition("this coordinator already joined shard " + std::to_string(m.shard) +
                                "; Leave first");
    }
    m.joined = true;
    m.shard = shard;
    m.self = self;
    m.lease_id = lease.id;
    m.ttl = lease.ttl;
    m.held_term = 0;
    m.held_value.clear();
    m.term_lost.store(false);
    m.Renewed(sent, lease.ttl);
    m.thread = std::thread([&m] { m.KeepAliveLoop(); });  // it waits for the lock
  }
  spdlog::info("shard {} replica {} ({}) joined job '{}' in etcd at {} (lease {:x}, TTL {} s)",
               shard, self.replica, self.endpoint, m.options.job, m.client->EndpointsString(),
               lease.id, lease.ttl.count());
  return Status::Ok();
}

Status EtcdCoordinator::Leave() {
  Impl& m = *impl_;
  m.StopThread();
  int64_t lease = 0;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (!m.joined) return Status::Ok();
    lease = m.lease_id;
    m.joined = false;
    m.lease_id = 0;
    m.held_term = 0;
    m.held_value.clear();
    m.term_lost.store(false);
    m.valid_until_ns.store(0);
  }
  if (lease == 0) return Status::Ok();
  return m.client->LeaseRevoke(lease);
}

bool EtcdCoordinator::LeaseValid() const {
  return !impl_->term_lost.load() && NowNs() < impl_->valid_until_ns.load();
}

std::chrono::milliseconds EtcdCoordinator::ttl() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->ttl;
}

void EtcdCoordinator::PauseKeepAlivesForTesting(bool paused) { impl_->paused.store(paused); }

Result<std::optional<uint64_t>> EtcdCoordinator::Campaign() {
  Impl& m = *impl_;
  uint32_t shard = 0;
  ReplicaAddress self;
  int64_t lease = 0;
  std::string held_value;
  uint64_t held_term = 0;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (!m.joined) return FailedPrecondition("Campaign before Join");
    shard = m.shard;
    self = m.self;
    lease = m.lease_id;
    held_value = m.held_value;
    held_term = m.held_term;
  }
  if (lease == 0) {
    return Unavailable("the etcd lease of shard " + std::to_string(shard) + " replica " +
                       std::to_string(self.replica) +
                       " expired; it is registering again, campaign after that");
  }
  LEASH_ASSIGN_OR_RETURN(etcd::RangeResult r, m.client->Range(m.keys.Shard(shard), true));
  int64_t in_sync_mod = 0;
  int64_t term_mod = 0;
  uint64_t term = 0;
  std::vector<uint32_t> in_sync;
  for (const etcd::KeyValue& kv : r.kvs) {
    if (kv.key == m.keys.Primary(shard)) {
      if (!held_value.empty() && kv.value == held_value && !m.term_lost.load()) {
        return std::optional<uint64_t>(held_term);  // already primary
      }
      return std::optional<uint64_t>();
    }
    if (kv.key == m.keys.InSync(shard)) {
      in_sync_mod = kv.mod_revision;
      LEASH_ASSIGN_OR_RETURN(in_sync, ParseInSync(kv));
    } else if (kv.key == m.keys.Term(shard)) {
      term_mod = kv.mod_revision;
      auto [end, ec] = std::from_chars(kv.value.data(), kv.value.data() + kv.value.size(), term);
      if (ec != std::errc() || end != kv.value.data() + kv.value.size()) {
        return Internal("etcd key " + kv.key + " holds '" + kv.value + "', not a term");
      }
    }
  }
  if (!in_sync.empty() && !std::binary_search(in_sync.begin(), in_sync.end(), self.replica)) {
    return std::optional<uint64_t>();  // may miss acknowledged entries: not eligible
  }
  const uint64_t next = term + 1;
  const std::string value = PrimaryJson(next, self);
  Result<etcd::TxnResult> t =
      m.client->Txn({etcd::Compare::CreateRevision(m.keys.Primary(shard), 0),
                     etcd::Compare::ModRevision(m.keys.InSync(shard), in_sync_mod),
                     etcd::Compare::ModRevision(m.keys.Term(shard), term_mod)},
                    {etcd::Operation::Put(m.keys.Primary(shard), value, lease),
                     etcd::Operation::Put(m.keys.Term(shard), std::to_string(next))},
                    {});
  if (!t.ok() && t.status().code() == StatusCode::kNotFound) {
    return Unavailable("the etcd lease of shard " + std::to_string(shard) + " replica " +
                       std::to_string(self.replica) + " expired while campaigning (" +
                       t.status().message() + "); it registers again, campaign after that");
  }
  if (!t.ok()) return t.status();
  if (!t->succeeded) return std::optional<uint64_t>();  // someone else moved first
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.lease_id != lease || !m.joined) {
      // The lease was lost meanwhile: the key went with it.
      return std::optional<uint64_t>();
    }
    m.held_term = next;
    m.held_value = value;
    m.term_lost.store(false);
  }
  spdlog::info("shard {} replica {} ({}) is primary of term {}", shard, self.replica, self.endpoint,
               next);
  return std::optional<uint64_t>(next);
}

Status EtcdCoordinator::SetInSync(uint64_t term, const std::vector<uint32_t>& in_sync) {
  Impl& m = *impl_;
  std::vector<uint32_t> set = in_sync;
  std::sort(set.begin(), set.end());
  set.erase(std::unique(set.begin(), set.end()), set.end());
  uint32_t shard = 0;
  std::string held_value;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (!m.joined) return FailedPrecondition("SetInSync before Join");
    shard = m.shard;
    if (!std::binary_search(set.begin(), set.end(), m.self.replica)) {
      return InvalidArgument("the in-sync set of shard " + std::to_string(shard) +
                             " must hold its primary, replica " + std::to_string(m.self.replica));
    }
    for (uint32_t r : set) {
      if (r >= m.shape.replicas) {
        return InvalidArgument("replica " + std::to_string(r) + " is outside the job's " +
                               std::to_string(m.shape.replicas) + " replicas");
      }
    }
    if (term == 0 || term != m.held_term) {
      return FailedPrecondition("replica " + std::to_string(m.self.replica) +
                                " is not primary of shard " + std::to_string(shard) + " in term " +
                                std::to_string(term) + "; stop acting as primary");
    }
    if (m.term_lost.load()) {
      m.held_term = 0;
      m.held_value.clear();
      m.term_lost.store(false);
      return FailedPrecondition("the etcd lease under which replica " +
                                std::to_string(m.self.replica) + " became primary of shard " +
                                std::to_string(shard) + " in term " + std::to_string(term) +
                                " expired; stop acting as primary");
    }
    held_value = m.held_value;
  }
  LEASH_ASSIGN_OR_RETURN(
      etcd::TxnResult t,
      m.client->Txn({etcd::Compare::Value(m.keys.Primary(shard), held_value)},
                    {etcd::Operation::Put(m.keys.InSync(shard), json(set).dump())}, {}));
  if (t.succeeded) return Status::Ok();
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.held_term == term) {
      m.held_term = 0;
      m.held_value.clear();
      m.term_lost.store(false);
    }
  }
  return FailedPrecondition("shard " + std::to_string(shard) + " has a primary other than term " +
                            std::to_string(term) +
                            " of this replica (deposed); stop acting as primary");
}

Status EtcdCoordinator::Resign(uint64_t term) {
  Impl& m = *impl_;
  uint32_t shard = 0;
  std::string held_value;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (!m.joined || term == 0 || term != m.held_term) return Status::Ok();
    shard = m.shard;
    held_value = m.held_value;
    if (m.term_lost.load()) {
      m.held_term = 0;
      m.held_value.clear();
      m.term_lost.store(false);
      return Status::Ok();
    }
  }
  LEASH_RETURN_IF_ERROR(m.client
                            ->Txn({etcd::Compare::Value(m.keys.Primary(shard), held_value)},
                                  {etcd::Operation::Delete(m.keys.Primary(shard))}, {})
                            .status());
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.held_term == term) {
    m.held_term = 0;
    m.held_value.clear();
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------- directory

namespace {

// A job's directory in etcd. View() reads the job's keys (one range request). WaitForChange
// asks etcd nothing per call: a thread of its own (started by the first WaitForChange)
// keeps one watch of the job's keys open, re-opened every kWatchOpen or after an error
// from the revision it had reached, and wakes the waiters on each change it reports; they
// then read the view anew. With no change a waiter gets the last view read as it stands
// (the open watch vouches for it up to the revision etcd last reported). So a follower
// that waits in a loop costs etcd one range per change and one watch per kWatchOpen,
// instead of a watch (and, as a timed-out watch closes its connection, a new connection)
// per wait.
class EtcdShardDirectory final : public ShardDirectory {
 public:
  static constexpr milliseconds kWatchOpen{30000};
  static constexpr milliseconds kRetry{200};

  EtcdShardDirectory(std::string job, std::unique_ptr<etcd::Client> client)
      : job_(std::move(job)), client_(std::move(client)) {
    keys_.prefix = EtcdJobPrefix(job_);
  }

  ~EtcdShardDirectory() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_.store(true);
    }
    cv_.notify_all();
    // The watch notices within about a second (libcurl's progress callback).
    if (thread_.joinable()) thread_.join();
  }

  Result<ClusterView> View() override {
    LEASH_ASSIGN_OR_RETURN(etcd::RangeResult r, client_->Range(keys_.prefix, true));
    LEASH_ASSIGN_OR_RETURN(ClusterView v, BuildView(keys_, job_, r));
    std::lock_guard<std::mutex> lock(mu_);
    if (!cached_ || v.revision >= cached_->revision) cached_ = v;
    return v;
  }

  Result<ClusterView> WaitForChange(int64_t after_revision, milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    std::unique_lock<std::mutex> lock(mu_);
    if (!thread_.joinable()) {
      // Every change from after_revision + 1 on is reported.
      covered_from_ = after_revision + 1;
      thread_ = std::thread([this, from = after_revision + 1] { Follow(from); });
    } else if (after_revision + 1 < covered_from_) {
      // Older than what the watch covers: whether it changed since is not known here.
      lock.unlock();
      return View();
    }
    cv_.wait_until(lock, deadline,
                   [&] { return stop_.load() || changed_ > after_revision || failing_; });
    // Unchanged, as far as an open watch that missed nothing says: the last view stands.
    if (changed_ <= after_revision && open_ && !failing_ && cached_ &&
        cached_->revision + 1 >= covered_from_ && changed_ <= cached_->revision) {
      ClusterView v = *cached_;
      v.revision = std::max(v.revision, reached_);
      return v;
    }
    const bool failing = failing_;
    lock.unlock();
    Result<ClusterView> v = View();
    if (failing && v.ok()) {
      // etcd answers again but the watch has not reopened yet: the caller would be back at
      // once and read again, in a loop, every follower at the moment etcd returns. Held
      // until the watch is open again (its next try is at most kRetry away), or the timeout.
      lock.lock();
      cv_.wait_until(lock, std::min(deadline, Clock::now() + 3 * kRetry),
                     [&] { return stop_.load() || open_; });
    }
    return v;
  }

 private:
  void Follow(int64_t from) {
    while (!stop_.load()) {
      Status st = client_->WatchStream(
          keys_.prefix, from, kWatchOpen, &stop_,
          [&](const etcd::WatchResult& r) { return OnWatchResponse(r, &from); });
      std::unique_lock<std::mutex> lock(mu_);
      open_ = false;
      if (st.ok()) continue;  // the watch's time was up (or compacted): open it again
      if (!failing_) {
        spdlog::debug("etcd watch of {} failed (retrying every {} ms): {}", keys_.prefix,
                      kRetry.count(), st.ToString());
      }
      failing_ = true;  // waiters read the view (and get etcd's error) instead of waiting
      cv_.notify_all();
      cv_.wait_for(lock, kRetry, [this] { return stop_.load(); });
    }
  }

  // One message of the open watch; `*from` is where the next watch starts. False ends it.
  bool OnWatchResponse(const etcd::WatchResult& r, int64_t* from) {
    std::lock_guard<std::mutex> lock(mu_);
    failing_ = false;
    if (r.compacted) {
      // What changed before the oldest kept revision is lost to the watch: waiters read the
      // view anew, and the watch goes on from there.
      open_ = false;
      *from = r.compact_revision;
      covered_from_ = *from;
      changed_ = std::max(changed_, *from);
      cv_.notify_all();
      return false;
    }
    open_ = true;
    reached_ = std::max(reached_, r.revision);
    if (!r.events.empty()) {
      changed_ = std::max(changed_, r.revision);
      cv_.notify_all();
    }
    *from = std::max(*from, r.revision + 1);
    return true;
  }

  std::string job_;
  Keys keys_;
  std::unique_ptr<etcd::Client> client_;  // the watch holds a connection of its pool
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::optional<ClusterView> cached_;  // the newest view View() read
  int64_t covered_from_ = 0;           // the watch reports every change from this revision
  int64_t changed_ = 0;                // the newest revision with a change the watch reported
  int64_t reached_ = 0;                // the watch has reported every change up to here
  bool open_ = false;                  // a watch is open and has answered
  bool failing_ = false;               // the last attempt to watch failed
};

}  // namespace

Result<std::unique_ptr<ShardDirectory>> NewEtcdShardDirectory(const EtcdOptions& options) {
  LEASH_RETURN_IF_ERROR(CheckJob(options.job));
  LEASH_ASSIGN_OR_RETURN(auto client, NewClient(options, options.request_timeout));
  return std::unique_ptr<ShardDirectory>(new EtcdShardDirectory(options.job, std::move(client)));
}

}  // namespace leash

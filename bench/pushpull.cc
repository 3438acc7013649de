// Push/pull microbenchmark: real leash-server shards on loopback applying a real
// optimizer update to every push, driven by leash::Client workers with 1 or 8 requests in
// flight, over the socket and (--modes) with same-host shared memory, against the raw
// ZeroMQ ceiling measured in the same run (a plain DEALER/ROUTER echo in another process
// for round trips, 1 or 8 in flight, and a plain PUSH/PULL stream to another process for
// one-way throughput, over 1 or more connections), and the shard's optimizer update alone.
// With --servers it measures running shards instead, or with --etcd replicated shards that
// the clients follow through the directory, as leash-worker does (bench/replication.py). Writes
// JSON and a markdown summary. Single-threaded driver plus one thread per worker.
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <memory>
#include <mutex>
#include <numeric>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "bench_table.h"
#include "leash/common/curve_keys.h"
#include "leash/common/etcd_coordinator.h"
#include "leash/common/finite.h"
#include "leash/common/flags.h"
#include "leash/common/zmq_transport.h"
#include "leash/ps/table.h"
#include "leash/worker/client.h"
#include "shm_segment.h"

namespace {

using SteadyClock = std::chrono::steady_clock;

// --socket-buffer: SO_SNDBUF and SO_RCVBUF of the raw sockets (0: the kernel's autotuning).
int g_socket_buffer = 0;
// Push rows: Push(const float*) (the client copies the gradient) instead of handing it over.
bool g_push_copy = false;
double g_warmup_seconds = 0;                                       // --warmup-seconds
int64_t g_shm_ring_mb = leash::ZmqOptions{}.shm_ring_bytes >> 20;  // --shm-ring-mb

void Tune(zmq::socket_t& s) {
  if (g_socket_buffer > 0) {
    s.set(zmq::sockopt::sndbuf, g_socket_buffer);
    s.set(zmq::sockopt::rcvbuf, g_socket_buffer);
  }
}

struct Sample {
  std::string op;
  std::string system;
  int64_t floats = 0;
  int shards = 0;
  int workers = 0;
  int inflight = 0;
  double ops_per_s = 0;
  double mb_per_s = 0;
  double p50_us = 0;
  double p99_us = 0;
  double client_cpu_us = -1;  // Leash rows: the clients' process CPU (all threads) per op;
                              // raw one-way between two processes: the sender's
  double server_cpu_us = -1;  // Leash rows with shards started here: the shards' CPU per op;
                              // raw one-way between two processes: the receiver's
  int64_t warmup_ops = 0;     // Leash rows: ops run unmeasured first (--warmup-seconds)
};

// The CPU time (user and system) of a rusage, in µs.
double RusageUs(const rusage& u) {
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e6 +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// This process's CPU time (user and system, all threads) in µs.
double ProcessCpuUs() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return RusageUs(u);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// --curve-keys: the Leash shards and clients use CURVE with these keys (leashctl keygen DIR
// --server --client bench). Empty: plain ZMTP.
std::string g_curve_keys;

// --servers: running shards to measure (e.g. a replicated shard's primary) instead of
// shards started here; the Leash cells then use as many shards as it names.
std::vector<std::string> g_servers;

// --etcd and --job: replicated shards, found (and followed) through etcd; the Leash cells
// use as many shards as the job has.
std::string g_etcd, g_job = "leash";
std::shared_ptr<leash::ShardDirectory> g_directory;  // with --etcd
leash::ClusterView g_view;                           // its view when the run began

int FreePort() {
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::rep);
  s.bind("tcp://127.0.0.1:*");
  std::string ep = s.get(zmq::sockopt::last_endpoint);
  return std::stoi(ep.substr(ep.rfind(':') + 1));
}

class Shards {
 public:
  Shards(const std::string& bin, int n, const std::string& dir, int io_threads = 1) {
    for (int i = 0; i < n; ++i)
      endpoints_.push_back("tcp://127.0.0.1:" + std::to_string(FreePort()));
    for (int i = 0; i < n; ++i) {
      pid_t pid = fork();
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        std::string log = dir + "/shard" + std::to_string(i) + ".log";
        FILE* f = std::freopen(log.c_str(), "w", stderr);
        (void)f;
        std::vector<std::string> args = {bin,
                                         "--shard=" + std::to_string(i),
                                         "--num-shards=" + std::to_string(n),
                                         "--bind=" + endpoints_[static_cast<size_t>(i)],
                                         "--data-dir=" + dir + "/shard" + std::to_string(i),
                                         "--checkpoint-interval=0",
                                         "--no-sync",
                                         "--log-level=warn",
                                         "--io-threads=" + std::to_string(io_threads)};
        if (!g_curve_keys.empty()) args.push_back("--curve-keys=" + g_curve_keys);
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        execv(argv[0], argv.data());
        _exit(127);
      }
      pids_.push_back(pid);
    }
  }
  // Stops the shards with SIGTERM (so a profiler wrapped around one writes its output),
  // SIGKILL for any still running after 30 s.
  ~Shards() {
    for (pid_t p : pids_)
      if (p > 0) kill(p, SIGTERM);  // <= 0: reaped by Exited()
    auto until = SteadyClock::now() + std::chrono::seconds(30);
    for (pid_t p : pids_) {
      while (p > 0 && waitpid(p, nullptr, WNOHANG) == 0) {
        if (SteadyClock::now() > until) {
          kill(p, SIGKILL);
          waitpid(p, nullptr, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  }
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  // The shards that have exited (reaped here), each as "shard I exited with status S (see
  // LOG)"; empty if all still run. For a client that could not reach them.
  std::string Exited(const std::string& dir) {
    std::string out;
    for (size_t i = 0; i < pids_.size(); ++i) {
      int status = 0;
      if (pids_[i] <= 0 || waitpid(pids_[i], &status, WNOHANG) != pids_[i]) continue;
      pids_[i] = -1;
      std::string how = WIFEXITED(status)
                            ? "exited with status " + std::to_string(WEXITSTATUS(status))
                            : "was killed by signal " + std::to_string(WTERMSIG(status));
      out += (out.empty() ? "" : "; ") + std::string("shard ") + std::to_string(i) + " " + how +
             " (its log: " + dir + "/shard" + std::to_string(i) + ".log)";
    }
    return out;
  }
  // Whether a socket listens on TCP `port` (from /proc/net/tcp: no connection is made, which
  // a shard would log as a failed handshake). True where /proc/net/tcp cannot be read: the
  // client's connect then waits as before.
  static bool Listening(int port) {
    std::ifstream f("/proc/net/tcp");
    if (!f) return true;
    std::string line;
    std::getline(f, line);  // the header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string slot, local, remote, state;
      in >> slot >> local >> remote >> state;
      const size_t colon = local.find(':');
      if (state == "0A" && colon != std::string::npos &&
          std::stoi(local.substr(colon + 1), nullptr, 16) == port)
        return true;
    }
    return false;
  }
  // Waits (at most 30 s) until every shard listens on its port; false, with
  // why, as soon as one has exited (Exited()) or at the deadline. So that a shard that
  // cannot start is named at once, not after the client's 30 s connect timeout.
  bool WaitListening(const std::string& dir, std::string* why) {
    const auto until = SteadyClock::now() + std::chrono::seconds(30);
    for (size_t i = 0; i < endpoints_.size(); ++i) {
      const int port = std::stoi(endpoints_[i].substr(endpoints_[i].rfind(':') + 1));
      while (true) {
        *why = Exited(dir);
        if (!why->empty()) return false;
        if (Listening(port)) break;
        if (SteadyClock::now() > until) {
          *why = "shard " + std::to_string(i) + " did not listen on " + endpoints_[i] +
                 " within 30 s (its log: " + dir + "/shard" + std::to_string(i) + ".log)";
          return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    return true;
  }
  // The shards' CPU time so far (user and system, all threads) in µs, from /proc; -1 if
  // unreadable.
  double CpuUs() const {
    double total = 0;
    for (pid_t p : pids_) {
      std::ifstream f("/proc/" + std::to_string(p) + "/stat");
      std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      // Fields after the command name (which may hold spaces) in parentheses: utime and
      // stime are the 12th and 13th of them.
      const size_t close = stat.rfind(')');
      if (close == std::string::npos) return -1;
      std::istringstream rest(stat.substr(close + 1));
      std::string field;
      unsigned long long utime = 0, stime = 0;
      for (int i = 1; i <= 13 && rest >> field; ++i) {
        if (i == 12) utime = std::stoull(field);
        if (i == 13) stime = std::stoull(field);
      }
      total += static_cast<double>(utime + stime) * 1e6 / static_cast<double>(sysconf(_SC_CLK_TCK));
    }
    return total;
  }

 private:
  std::vector<std::string> endpoints_;
  std::vector<pid_t> pids_;
};

// Runs `submit` keeping `inflight` requests outstanding for `seconds`; returns latencies (us).
template <typename Submit>
std::vector<double> Drive(Submit submit, int inflight, double seconds, int64_t* ops) {
  std::vector<double> lat;
  std::deque<std::pair<leash::Future, SteadyClock::time_point>> q;
  auto end = SteadyClock::now() + std::chrono::duration<double>(seconds);
  *ops = 0;
  while (SteadyClock::now() < end || !q.empty()) {
    if (SteadyClock::now() < end && static_cast<int>(q.size()) < inflight) {
      q.emplace_back(submit(), SteadyClock::now());
      continue;
    }
    leash::Status st = q.front().first.get();
    if (!st.ok()) {
      std::fprintf(stderr, "request failed: %s\n", st.ToString().c_str());
      std::exit(1);
    }
    lat.push_back(
        std::chrono::duration<double, std::micro>(SteadyClock::now() - q.front().second).count());
    q.pop_front();
    ++*ops;
  }
  return lat;
}

std::vector<Sample> RunLeash(const std::string& bin, const std::string& dir, int64_t floats, int n,
                             int inflight, double seconds, int64_t spin_us, bool shm, int stripes,
                             const std::vector<std::string>& op_names) {
  std::unique_ptr<Shards> started;
  if (g_servers.empty() && g_etcd.empty()) started = std::make_unique<Shards>(bin, n, dir, stripes);
  if (started) {
    std::string why;
    if (!started->WaitListening(dir, &why)) {
      std::fprintf(stderr, "%s\n", why.c_str());
      std::exit(1);
    }
  }
  std::vector<std::string> endpoints = started ? started->endpoints() : g_servers;
  if (g_directory) endpoints = leash::PrimaryEndpoints(g_view);
  leash::ZmqContext ctx(stripes);
  std::vector<std::unique_ptr<leash::Client>> clients;
  for (int w = 0; w < n; ++w) {
    leash::ClientOptions o;
    o.name = "bench" + std::to_string(w);
    o.staleness =
        int64_t{1} << 40;  // pulls never wait for clocks: this measures transport and update cost
    o.reply_spin_us = spin_us;
    o.directory = g_directory;
    o.directory_view = g_view;
    leash::ZmqOptions zo;
    zo.shared_memory = shm;
    zo.shm_ring_bytes = g_shm_ring_mb << 20;
    zo.stripes = stripes;
    if (!g_curve_keys.empty()) zo.curve = leash::LoadCurveClientKeys(g_curve_keys, "bench").value();
    auto c =
        leash::Client::Connect(std::move(leash::ConnectZmqClient(ctx, endpoints, zo).value()), o);
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
      if (started) {
        const std::string exited = started->Exited(dir);
        if (!exited.empty()) std::fprintf(stderr, "%s\n", exited.c_str());
      }
      std::exit(1);
    }
    clients.push_back(std::move(*c));
  }
  // Running shards keep their tables across cells: one table per size and mode there.
  const leash::TableSpec t = leash::bench::MomentumTable(
      started != nullptr
          ? std::string("bench")
          : "bench" + std::to_string(floats) + (shm ? "shm" : "") + std::to_string(inflight) +
                (stripes > 1 ? "s" + std::to_string(stripes) : ""),
      floats);
  auto table = clients[0]->CreateTable(t).value();
  if (shm) {
    // The offer is answered asynchronously: wait (bounded) until every client reaches every
    // shard, and every backup that answers its pushes, through shared memory, so the rows
    // measure it and not the socket.
    auto until = SteadyClock::now() + std::chrono::seconds(5);
    auto reached = [&](const leash::ClientCounters& k) {
      return k.shared_memory_shards >= n && k.shared_memory_backups >= k.answering_backups;
    };
    for (auto& c : clients) {
      while (!reached(c->counters()) && SteadyClock::now() < until) {
        (void)c->Pull(table, std::vector<float>(static_cast<size_t>(floats)).data()).get();
      }
      if (!reached(c->counters()))
        std::fprintf(stderr,
                     "shared memory not reached with every shard and answering backup; rows "
                     "are partly socket\n");
    }
  }
  std::vector<Sample> out;
  for (const std::string& op : op_names) {
    std::vector<std::vector<double>> lat(static_cast<size_t>(n));
    std::vector<int64_t> ops(static_cast<size_t>(n)), unmeasured(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    // Each worker first runs the op unmeasured for --warmup-seconds (first touches of the
    // table, its optimizer state and the rings; connections' buffers growing), then waits
    // until every worker has: the clock and the CPU counters start there.
    std::mutex m;
    std::condition_variable cv;
    int warmed = 0;
    bool go = false;
    for (int w = 0; w < n; ++w) {
      threads.emplace_back([&, w] {
        // The gradient handed over (Push of a shared_ptr: sent from these floats, never
        // changed), or with --push-copy copied by every Push.
        auto owned = std::make_shared<std::vector<float>>(static_cast<size_t>(floats), 1e-3f);
        const std::shared_ptr<const float> grad(owned, owned->data());
        const std::vector<float>& buf = *owned;
        leash::Client* c = clients[static_cast<size_t>(w)].get();
        std::vector<std::vector<float>> outs(static_cast<size_t>(inflight),
                                             std::vector<float>(static_cast<size_t>(floats)));
        // pull_in_place: the values where the replies brought them (Client::PullInPlace),
        // each kept until its slot is pulled into again, as a reader of them would.
        std::vector<leash::PulledValues> views(static_cast<size_t>(inflight));
        size_t k = 0;
        auto submit = [&] {
          if (op == "push") return g_push_copy ? c->Push(table, buf.data()) : c->Push(table, grad);
          if (op == "pull_in_place") return c->PullInPlace(table, &views[k++ % views.size()]);
          return c->Pull(table, outs[k++ % outs.size()].data());
        };
        if (g_warmup_seconds > 0)
          (void)Drive(submit, inflight, g_warmup_seconds, &unmeasured[static_cast<size_t>(w)]);
        {
          std::unique_lock<std::mutex> lock(m);
          ++warmed;
          cv.notify_all();
          cv.wait(lock, [&] { return go; });
        }
        lat[static_cast<size_t>(w)] =
            Drive(submit, inflight, seconds, &ops[static_cast<size_t>(w)]);
      });
    }
    SteadyClock::time_point t0;
    double cpu0 = 0, server_cpu0 = -1;
    {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return warmed == n; });
      t0 = SteadyClock::now();
      cpu0 = ProcessCpuUs();
      server_cpu0 = started ? started->CpuUs() : -1;
      go = true;
      cv.notify_all();
    }
    for (auto& th : threads) th.join();
    double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    std::vector<double> all;
    for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
    int64_t total = std::accumulate(ops.begin(), ops.end(), int64_t{0});
    Sample s{op,
             shm ? "leash shm" : stripes > 1 ? "leash striped " + std::to_string(stripes) : "leash",
             floats,
             n,
             n,
             inflight};
    s.ops_per_s = static_cast<double>(total) / secs;
    s.warmup_ops = std::accumulate(unmeasured.begin(), unmeasured.end(), int64_t{0});
    s.mb_per_s = s.ops_per_s * static_cast<double>(floats) * 4 / 1e6;
    s.p50_us = Percentile(all, 0.5);
    s.p99_us = Percentile(all, 0.99);
    if (total > 0) s.client_cpu_us = (ProcessCpuUs() - cpu0) / static_cast<double>(total);
    if (total > 0 && server_cpu0 >= 0) {
      // The shards answer each request before its op counts, but a shard may still apply
      // the last pushes: wait for its CPU to settle (bounded) before reading it.
      double before = started->CpuUs();
      for (int i = 0; i < 20; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        const double now = started->CpuUs();
        if (now == before) break;
        before = now;
      }
      if (before >= 0) s.server_cpu_us = (before - server_cpu0) / static_cast<double>(total);
    }
    out.push_back(s);
  }
  return out;
}

// With `check`, the echo reads every payload it receives once, checking it for NaN and Inf
// as a shard checks each gradient before applying it (leash::AllFinite): what any server must
// pay to touch the bytes the kernel just wrote, which the plain echo never reads.
void Echo(zmq::socket_t& router, const std::atomic<bool>& stop, bool check = false) {
  router.set(zmq::sockopt::rcvtimeo, 100);
  bool warned = false;
  while (!stop) {
    zmq::message_t id, body;
    if (!router.recv(id)) continue;
    (void)router.recv(body);
    if (check && !leash::AllFinite(static_cast<const float*>(body.data()), body.size() / 4) &&
        !warned) {
      std::fprintf(stderr, "raw echo: the payload is not all finite (the bench's own bug)\n");
      warned = true;
    }
    router.send(id, zmq::send_flags::sndmore);
    zmq::message_t small(8);
    router.send(small, zmq::send_flags::none);  // an acknowledgement, as a push gets
  }
}

// Raw ZeroMQ round trip: DEALER -> ROUTER echo, `inflight` messages outstanding. The echo
// is a thread sharing the client's context (and its one ZeroMQ I/O thread), or, with
// `other_process`, a forked process with its own context, as a Leash shard is.
Sample RawRoundTrip(int64_t floats, double seconds, bool other_process = false, int inflight = 1,
                    bool check = false) {
  std::string ep = "tcp://127.0.0.1:" + std::to_string(FreePort());
  pid_t child = -1;
  if (other_process) {
    child = fork();  // no ZeroMQ context or other thread is alive here
    if (child == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      zmq::context_t cctx;
      zmq::socket_t router(cctx, zmq::socket_type::router);
      Tune(router);
      router.bind(ep);
      std::atomic<bool> never{false};
      Echo(router, never, check);
      _exit(0);
    }
  }
  zmq::context_t ctx;
  zmq::socket_t router(ctx, zmq::socket_type::router);
  if (!other_process) router.bind(ep);
  std::atomic<bool> stop{false};
  std::thread echo([&] {
    if (!other_process) Echo(router, stop, check);
  });
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  Tune(dealer);
  dealer.connect(ep);
  std::vector<char> payload(static_cast<size_t>(floats) * 4, 1);
  std::vector<double> lat;
  std::deque<SteadyClock::time_point> sent;
  auto t0 = SteadyClock::now();
  auto end = t0 + std::chrono::duration<double>(seconds);
  while (SteadyClock::now() < end || !sent.empty()) {
    if (SteadyClock::now() < end && static_cast<int>(sent.size()) < inflight) {
      sent.push_back(SteadyClock::now());
      dealer.send(zmq::buffer(payload), zmq::send_flags::none);
      continue;
    }
    zmq::message_t r;
    (void)dealer.recv(r);
    lat.push_back(
        std::chrono::duration<double, std::micro>(SteadyClock::now() - sent.front()).count());
    sent.pop_front();
  }
  double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  stop = true;
  echo.join();
  if (child > 0) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  }
  std::string op = other_process ? "round trip, 2 processes" : "round trip";
  if (check) op += ", payload checked";
  Sample out{op, "raw zmq", floats, 1, 1, inflight};
  out.ops_per_s = static_cast<double>(lat.size()) / secs;
  out.mb_per_s = out.ops_per_s * static_cast<double>(floats) * 4 / 1e6;
  out.p50_us = Percentile(lat, 0.5);
  out.p99_us = Percentile(lat, 0.99);
  return out;
}

// The oldest record of `ring`'s queue of `s`, waiting on `bell` as a Leash reader does
// (dozing, then polling the FIFO); nullptr if the queue is corrupt.
const leash::shm::QueueSlot* WaitFront(leash::shm::ShmSegment& s, uint32_t ring,
                                       leash::shm::Bell& bell) {
  while (true) {
    auto f = s.Front(ring);
    if (!f.ok()) return nullptr;
    if (*f != nullptr) return *f;
    if (!s.Doze(ring)) continue;
    pollfd p{bell.fd(), POLLIN, 0};
    (void)::poll(&p, 1, 1000);
    s.Wake(ring);
    bell.Drain();
  }
}

// Raw same-host round trip through a shared-memory segment's queues, the path Leash's
// same-host messages take (shm_segment.h), without Leash's messages: the payload one way
// (inline in a slot when it fits, else a frame of the ring that the reader copies out, as a
// shard does), an 8-byte acknowledgement back, a waiting side woken through its FIFO bell.
// A forked process echoes, as a shard is another process.
Sample RawShmRoundTrip(int64_t floats, double seconds) {
  namespace shm = leash::shm;
  Sample out{"round trip, 2 processes", "raw shm", floats, 1, 1, 1};
  auto seg = shm::ShmSegment::Create(size_t{16} << 20);
  if (!seg.ok() || !(*seg)->Activate().ok() || !(*seg)->MakeBells().ok()) {
    std::fprintf(stderr, "raw shm row skipped: %s\n",
                 seg.ok() ? "no bells" : seg.status().ToString().c_str());
    return out;
  }
  std::shared_ptr<shm::ShmSegment> s = *seg;
  const std::string name = s->name();
  const uint64_t token = s->token();
  pid_t child = fork();
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    auto theirs = shm::ShmSegment::Open(name, token);
    if (!theirs.ok()) _exit(1);
    shm::Bell wake_me(*(*theirs)->OpenBell(0)), ring_them(*(*theirs)->OpenBell(1));
    std::vector<uint8_t> sink(static_cast<size_t>(floats) * 4);
    while (const shm::QueueSlot* slot = WaitFront(**theirs, 0, wake_me)) {
      if (slot->generation == 0) {
        std::memcpy(sink.data(), slot->bytes, std::min<size_t>(slot->size, sink.size()));
      } else {
        (void)(*theirs)->CopyOut({0, slot->generation, slot->offset, slot->size});
      }
      (*theirs)->Pop(0);
      const uint64_t ack = 0;
      if ((*theirs)->Enqueue(1, reinterpret_cast<const uint8_t*>(&ack), sizeof ack) ==
          shm::ShmSegment::Posted::kRing)
        ring_them.Ring();
    }
    _exit(0);
  }
  shm::ShmWriter writer(s, 0, /*reclaim_ms=*/0);
  shm::Bell ring_them(*s->OpenBell(0)), wake_me(*s->OpenBell(1));
  std::vector<uint8_t> payload(static_cast<size_t>(floats) * 4, 1);
  std::vector<double> lat;
  auto t0 = SteadyClock::now();
  auto end = t0 + std::chrono::duration<double>(seconds);
  while (SteadyClock::now() < end) {
    auto sent = SteadyClock::now();
    shm::ShmSegment::Posted posted = shm::ShmSegment::Posted::kFull;
    if (payload.size() <= shm::kSlotInline) {
      posted = s->Enqueue(0, payload.data(), payload.size());
    } else if (auto d = writer.Put(leash::Frame::Wrap(payload.data(), payload.size(), nullptr))) {
      posted = s->Enqueue(0, *d);
    }
    if (posted == shm::ShmSegment::Posted::kFull) break;  // cannot happen one at a time
    if (posted == shm::ShmSegment::Posted::kRing) ring_them.Ring();
    if (WaitFront(*s, 1, wake_me) == nullptr) break;
    s->Pop(1);
    lat.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - sent).count());
  }
  double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  out.ops_per_s = static_cast<double>(lat.size()) / secs;
  out.mb_per_s = out.ops_per_s * static_cast<double>(floats) * 4 / 1e6;
  out.p50_us = Percentile(lat, 0.5);
  out.p99_us = Percentile(lat, 0.99);
  return out;
}

// Raw ZeroMQ one-way throughput: PUSH -> PULL stream, at most 8 messages queued by the
// sender (the high-water mark), as 8 pushes in flight. The receiver is a thread sharing the
// sender's context (and its one I/O thread), or, with `other_process`, a forked process
// with its own context, as a Leash shard is; then the time runs until the receiver has the
// last message (an end marker behind each stream, answered over a pipe), so the figure is
// delivered bytes, not bytes handed to the sending socket. With `connections` > 1 (two
// processes only) the stream is striped: that many PUSH sockets, each its own TCP
// connection, sent to in turn, and that many ZeroMQ I/O threads on both sides.
Sample RawOneWay(int64_t floats, double seconds, bool other_process = false, int connections = 1) {
  std::string ep = "tcp://127.0.0.1:" + std::to_string(FreePort());
  std::string op = other_process ? "one-way, 2 processes" : "one-way";
  if (connections > 1) op += ", " + std::to_string(connections) + " connections";
  int pipefd[2] = {-1, -1};
  pid_t child = -1;
  if (other_process) {
    if (pipe(pipefd) != 0) return Sample{op, "raw zmq", floats, 1, 1, 8};
    child = fork();  // no ZeroMQ context or other thread is alive here
    if (child == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(pipefd[0]);
      zmq::context_t cctx(connections);
      zmq::socket_t pull(cctx, zmq::socket_type::pull);
      Tune(pull);
      pull.bind(ep);
      int64_t n = 0;
      for (int ends = 0; ends < connections;) {
        zmq::message_t m;
        if (!pull.recv(m)) continue;
        if (m.size() == 1) {
          ++ends;  // an end marker
        } else {
          ++n;
        }
      }
      ssize_t w = write(pipefd[1], &n, sizeof n);
      _exit(w == static_cast<ssize_t>(sizeof n) ? 0 : 1);
    }
    close(pipefd[1]);
  }
  zmq::context_t ctx(connections);
  zmq::socket_t pull(ctx, zmq::socket_type::pull);
  std::atomic<int64_t> received{0};
  std::atomic<bool> stop{false};
  std::thread rx;
  if (!other_process) {
    pull.bind(ep);
    rx = std::thread([&] {
      pull.set(zmq::sockopt::rcvtimeo, 100);
      while (!stop) {
        zmq::message_t m;
        if (pull.recv(m)) ++received;
      }
    });
  }
  std::vector<zmq::socket_t> push;
  for (int i = 0; i < connections; ++i) {
    push.emplace_back(ctx, zmq::socket_type::push);
    push.back().set(zmq::sockopt::sndhwm, std::max(1, 8 / connections));
    Tune(push.back());
    push.back().connect(ep);
  }
  std::vector<char> payload(static_cast<size_t>(floats) * 4, 1);
  auto t0 = SteadyClock::now();
  const double cpu0 = ProcessCpuUs();
  auto end = t0 + std::chrono::duration<double>(seconds);
  for (size_t i = 0; SteadyClock::now() < end; ++i)
    push[i % push.size()].send(zmq::buffer(payload), zmq::send_flags::none);
  double secs = 0;
  double sender_cpu = -1, receiver_cpu = -1;  // two processes: each side's CPU in µs
  if (other_process) {
    char marker = 0;
    for (auto& p : push) p.send(zmq::buffer(&marker, 1), zmq::send_flags::none);
    int64_t n = 0;
    if (read(pipefd[0], &n, sizeof n) == static_cast<ssize_t>(sizeof n)) received = n;
    secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    sender_cpu = ProcessCpuUs() - cpu0;
    close(pipefd[0]);
    struct rusage ru {};
    if (wait4(child, nullptr, 0, &ru) == child) receiver_cpu = RusageUs(ru);
  } else {
    secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    stop = true;
    rx.join();
  }
  Sample out{op, "raw zmq", floats, 1, 1, 8};
  out.ops_per_s = static_cast<double>(received.load()) / secs;
  out.mb_per_s = out.ops_per_s * static_cast<double>(floats) * 4 / 1e6;
  if (received.load() > 0 && sender_cpu >= 0 && receiver_cpu >= 0) {
    // The receiver's CPU includes its start (a context and a bind), small beside seconds of
    // 4 MB messages; the sender's includes the end markers' wait.
    out.client_cpu_us = sender_cpu / static_cast<double>(received.load());
    out.server_cpu_us = receiver_cpu / static_cast<double>(received.load());
  }
  return out;
}

// The shard's optimizer update alone: momentum (as the Leash rows' table) on `floats`
// values, in this process, with the ps core the shard uses. p50/p99 of one update.
// `cold`: in turn on as many tables and gradients as take 256 MiB, so that each update finds
// its table, momentum and gradient out of the caches (as a shard does when its state and the
// pushes in flight are larger than the last-level cache, or share it with another process).
Sample UpdateTime(int64_t floats, double seconds, bool cold = false) {
  const leash::TableSpec t = leash::bench::MomentumTable("bench", floats);
  const int64_t set_bytes = floats * 12;  // values, momentum, gradient
  const size_t sets = cold ? static_cast<size_t>(std::max<int64_t>(
                                 2, ((int64_t{256} << 20) + set_bytes - 1) / set_bytes))
                           : 1;
  std::vector<leash::ps::Table> tables;
  std::vector<std::vector<float>> grads;
  for (size_t i = 0; i < sets; ++i) {
    tables.push_back(leash::ps::Table::Create(0, t, leash::RowRange{0, t.rows}).value());
    grads.emplace_back(static_cast<size_t>(floats), 1e-3f);
  }
  std::vector<double> lat;
  auto t0 = SteadyClock::now();
  auto end = t0 + std::chrono::duration<double>(seconds);
  for (size_t i = 0; SteadyClock::now() < end; i = (i + 1) % sets) {
    auto s = SteadyClock::now();
    tables[i].Apply(leash::Rows::Range(0, t.rows), grads[i].data());
    lat.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - s).count());
  }
  double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  Sample out{
      cold ? "momentum update, out of cache" : "momentum update", "shard update", floats, 1, 0, 1};
  out.ops_per_s = static_cast<double>(lat.size()) / secs;
  out.mb_per_s = out.ops_per_s * static_cast<double>(floats) * 4 / 1e6;
  out.p50_us = Percentile(lat, 0.5);
  out.p99_us = Percentile(lat, 0.99);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string server = "build/server/leash-server";
  std::string sizes = "1024,65536,1048576";
  std::string out = "bench/results";
  std::string modes = "socket,shm";
  std::string shard_counts = "1,2";
  std::string inflights = "1,8";
  std::string ops = "push,pull";
  std::string stripes = "2,4";
  bool raw = true;
  std::string raw_rows = "rtt,rtt2,rtt2check,rtt2x8,shm2,oneway,oneway2,update";
  int64_t socket_buffer = 0;
  double seconds = 2;
  int64_t spin_us = 0;
  leash::Flags flags("leash-bench-pushpull",
                     "Push/pull microbenchmark against the raw ZeroMQ ceiling.");
  flags.String("server-bin", &server, "leash-server executable");
  flags.String("sizes", &sizes, "floats per request");
  flags.Double("seconds", &seconds, "duration of each measurement");
  flags.Double("warmup-seconds", &g_warmup_seconds,
               "Leash cells: run each op this long unmeasured first (first touches of the "
               "table, its optimizer state and the shared-memory rings), then measure");
  flags.String("out", &out, "directory for pushpull.json and pushpull.md");
  flags.Int("shm-ring-mb", &g_shm_ring_mb,
            "Leash shm rows: the most each of the clients' shared-memory rings grows to, in MiB");
  flags.Int("reply-spin-us", &spin_us,
            "ClientOptions::reply_spin_us of the Leash clients (0: sleep at once)");
  flags.String("curve-keys", &g_curve_keys,
               "CURVE keys of the Leash shards and clients (leashctl keygen DIR --server --client "
               "bench); empty: plain ZMTP. The raw ZeroMQ rows stay plain");
  flags.String("modes", &modes,
               "Leash rows: 'socket' (everything through the loopback socket, as between hosts), "
               "'shm' (the client offers same-host shared memory, as leash-worker does) and/or "
               "'stripedN' (the socket over N connections per shard, leash-worker --stripes N, "
               "the shards with --io-threads N; at sizes of at least 1 MiB per shard)");
  flags.String("shards", &shard_counts, "Leash cells: shards (and as many workers)");
  flags.String("inflight", &inflights, "Leash cells: requests in flight per worker");
  flags.String("ops", &ops,
               "Leash cells: push, pull and/or pull_in_place (Client::PullInPlace: the values "
               "read where the replies brought them, not copied into the caller's buffer)");
  flags.Bool("raw", &raw, "measure the raw ZeroMQ rows and the update alone too");
  flags.String("raw-rows", &raw_rows,
               "which raw rows: rtt (same process), rtt2 (two processes), rtt2check (two "
               "processes, the echo checking each payload for NaN/Inf as a shard does), rtt2x8 "
               "(8 in flight), "
               "shm2 (two processes through a shared-memory segment's queues, as same-host Leash "
               "messages go), oneway, oneway2 (with --stripes), update (the optimizer alone), "
               "update_cold (the same on state out of the caches; not in the default list)");
  flags.String("stripes", &stripes,
               "raw one-way to another process over this many connections too, at sizes of "
               "65536 floats and more (empty: none)");
  std::string servers;
  flags.String("servers", &servers,
               "measure these running shards (comma-separated endpoints, e.g. a replicated "
               "shard's primary) instead of starting leash-server; --shards is then their "
               "number");
  flags.String("etcd", &g_etcd,
               "measure replicated shards found through etcd (e.g. http://127.0.0.1:2379), "
               "followed as leash-worker follows them; --shards is then the job's number");
  flags.String("job", &g_job, "with --etcd: the job's name in etcd");
  flags.Bool("push-copy", &g_push_copy,
             "Leash push rows: Push(const float*), which copies the gradient, instead of "
             "handing it over (Push of a shared_ptr, sent from the caller's floats)");
  flags.Int("socket-buffer", &socket_buffer,
            "SO_SNDBUF/SO_RCVBUF of the raw ZeroMQ sockets in bytes (0: kernel autotuning)");
  if (auto code = flags.ParseOrExitCode(argc, argv)) return *code;
  g_socket_buffer = static_cast<int>(socket_buffer);
  if (g_shm_ring_mb < 1 || g_shm_ring_mb > leash::kMaxShmRingMb) {
    std::fprintf(stderr, "--shm-ring-mb: need MiB in [1, %lld], got %lld\n",
                 static_cast<long long>(leash::kMaxShmRingMb),
                 static_cast<long long>(g_shm_ring_mb));
    return 2;
  }
  if (g_warmup_seconds < 0) {
    std::fprintf(stderr, "--warmup-seconds: need seconds >= 0\n");
    return 2;
  }
  for (const auto& op : leash::SplitList(ops)) {
    if (op != "push" && op != "pull" && op != "pull_in_place") {
      std::fprintf(stderr, "--ops: unknown op '%s' (push, pull, pull_in_place)\n", op.c_str());
      return 2;
    }
  }
  g_servers = leash::SplitList(servers);
  if (!g_servers.empty() && !g_etcd.empty()) {
    std::fprintf(stderr, "--servers and --etcd: give one of them\n");
    return 2;
  }
  if (!g_servers.empty()) shard_counts = std::to_string(g_servers.size());
  // Shards it starts itself: a path that is not an executable would only show as a client
  // waiting 30 s for shards that never came up.
  const bool leash_cells = !leash::SplitList(modes).empty() && !leash::SplitList(ops).empty();
  if (g_servers.empty() && g_etcd.empty() && leash_cells && access(server.c_str(), X_OK) != 0) {
    std::fprintf(stderr,
                 "--server-bin '%s' is not an executable file (%s): build leash-server, or give "
                 "its path (e.g. --server-bin build/server/leash-server from the repository)\n",
                 server.c_str(), std::strerror(errno));
    return 2;
  }
  if (!g_etcd.empty()) {
    leash::EtcdOptions eo;
    eo.job = g_job;
    auto parsed = leash::ParseEtcdEndpoints(g_etcd);
    if (!parsed.ok()) {
      std::fprintf(stderr, "--etcd: %s\n", parsed.status().ToString().c_str());
      return 2;
    }
    eo.endpoints = std::move(*parsed);
    auto d = leash::NewEtcdShardDirectory(eo);
    auto v = d.ok() ? leash::ResolvePrimaries(**d, 60000)
                    : leash::Result<leash::ClusterView>(d.status());
    if (!v.ok()) {
      std::fprintf(stderr, "--etcd %s: %s\n", g_etcd.c_str(), v.status().ToString().c_str());
      return 1;
    }
    shard_counts = std::to_string(v->num_shards);
    g_directory = std::move(*d);
    g_view = std::move(*v);
  }
  char tmpl[] = "/tmp/leash-bench-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::vector<Sample> samples;
  for (const auto& sz : leash::SplitList(sizes)) {
    int64_t floats = std::stoll(sz);
    size_t first = samples.size();
    auto want = [&](const char* row) {
      auto rows = leash::SplitList(raw_rows);
      return raw && std::find(rows.begin(), rows.end(), row) != rows.end();
    };
    if (want("rtt")) samples.push_back(RawRoundTrip(floats, seconds));
    if (want("rtt2")) samples.push_back(RawRoundTrip(floats, seconds, /*other_process=*/true));
    if (want("rtt2check")) {
      samples.push_back(RawRoundTrip(floats, seconds, /*other_process=*/true, /*inflight=*/1,
                                     /*check=*/true));
    }
    if (want("shm2")) samples.push_back(RawShmRoundTrip(floats, seconds));
    if (want("rtt2x8")) {
      samples.push_back(RawRoundTrip(floats, seconds, /*other_process=*/true, /*inflight=*/8));
    }
    if (want("oneway")) samples.push_back(RawOneWay(floats, seconds));
    if (want("oneway2")) samples.push_back(RawOneWay(floats, seconds, /*other_process=*/true));
    if (want("oneway2") && floats >= 65536) {
      for (const auto& k : leash::SplitList(stripes))
        samples.push_back(RawOneWay(floats, seconds, /*other_process=*/true, std::stoi(k)));
    }
    if (want("update")) samples.push_back(UpdateTime(floats, seconds));
    if (want("update_cold")) samples.push_back(UpdateTime(floats, seconds, /*cold=*/true));
    for (const auto& ns : leash::SplitList(shard_counts)) {
      int n = std::stoi(ns);
      for (const auto& fs : leash::SplitList(inflights)) {
        int inflight = std::stoi(fs);
        // Socket and shared memory back to back in each cell, so noise hits both alike.
        for (const auto& mode : leash::SplitList(modes)) {
          if (mode.empty()) continue;
          int striped = 1;
          if (mode.rfind("striped", 0) == 0) {
            striped = std::stoi(mode.substr(7));
            // Below the client's threshold nothing is striped: the row would be 'leash' again.
            if (floats * 4 / n < (int64_t{1} << 20)) continue;
          } else if (mode != "socket" && mode != "shm") {
            std::fprintf(stderr, "--modes: unknown mode '%s' (socket, shm, stripedN)\n",
                         mode.c_str());
            return 2;
          }
          auto r =
              RunLeash(server, dir + "/" + sz + "-" + ns + "-" + fs + "-" + mode, floats, n,
                       inflight, seconds, spin_us, mode == "shm", striped, leash::SplitList(ops));
          samples.insert(samples.end(), r.begin(), r.end());
        }
      }
    }
    for (size_t i = first; i < samples.size(); ++i) {
      const Sample& s = samples[i];
      std::printf(
          "%-12s %-36s %8lld floats %d shard(s) %d worker(s) %d in flight: %9.0f ops/s %8.1f "
          "MB/s p50 %8.1f us p99 %8.1f us\n",
          s.system.c_str(), s.op.c_str(), static_cast<long long>(s.floats), s.shards, s.workers,
          s.inflight, s.ops_per_s, s.mb_per_s, s.p50_us, s.p99_us);
      std::fflush(stdout);
    }
  }
  std::string cmd = "rm -rf " + dir;
  if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir.c_str());

  auto find = [&](const std::string& sys, const std::string& op, int64_t floats, int n,
                  int inflight) -> const Sample* {
    for (const auto& s : samples) {
      if (s.system == sys && s.op == op && s.floats == floats && s.shards == n &&
          s.inflight == inflight) {
        return &s;
      }
    }
    return nullptr;
  };
  std::ostringstream md, js;
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) < 0) load[0] = -1;
  md << "# Push/pull microbenchmark\n\nReal leash-server shards on loopback (momentum update on "
        "every push), "
     << "leash::Client workers, over the socket (`leash`) and with same-host shared memory "
        "(`leash shm`, frames of 32 KiB and more through the segment), and over the socket "
        "striped over N connections per shard (`leash striped N`, --stripes N, the shards with "
        "--io-threads N); raw ZeroMQ and the update alone measured in the same run. "
     << seconds << " s per cell, " << std::thread::hardware_concurrency() << " cores, load average "
     << load[0] << " at the end, client reply spin " << spin_us << " us, pushes "
     << (g_push_copy ? "copied by the client (Push(const float*))"
                     : "handed over (Push of a shared_ptr: sent from the caller's floats)")
     << ".\n\n"
     << "| system | op | floats | shards x workers | in flight | ops/s | MB/s | p50 us | p99 us "
        "|\n|---|---|---|---|---|---|---|---|---|\n";
  js << "{\n  \"benchmark\": \"pushpull\",\n  \"seconds\": " << seconds
     << ",\n  \"loadavg\": " << load[0]
     << ",\n  \"curve\": " << (g_curve_keys.empty() ? "false" : "true")
     << ",\n  \"push_copy\": " << (g_push_copy ? "true" : "false") << ",\n  \"samples\": [\n";
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    char row[320];
    std::snprintf(row, sizeof row, "| %s | %s | %lld | %dx%d | %d | %.0f | %.1f | %.1f | %.1f |\n",
                  s.system.c_str(), s.op.c_str(), static_cast<long long>(s.floats), s.shards,
                  s.workers, s.inflight, s.ops_per_s, s.mb_per_s, s.p50_us, s.p99_us);
    md << row;
    js << "    {\"system\": \"" << s.system << "\", \"op\": \"" << s.op
       << "\", \"floats\": " << s.floats << ", \"shards\": " << s.shards
       << ", \"workers\": " << s.workers << ", \"inflight\": " << s.inflight
       << ", \"ops_per_s\": " << s.ops_per_s << ", \"mb_per_s\": " << s.mb_per_s
       << ", \"p50_us\": " << s.p50_us << ", \"p99_us\": " << s.p99_us
       << ", \"client_cpu_us\": " << s.client_cpu_us << ", \"server_cpu_us\": " << s.server_cpu_us
       << ", \"warmup_ops\": " << s.warmup_ops << "}" << (i + 1 < samples.size() ? ",\n" : "\n");
  }
  js << "  ],\n  \"ratios\": {";
  md << "\n## Against the raw ZeroMQ ceiling (socket rows; the issue's targets)\n\n";
  bool first = true;
  auto ratio = [&](const std::string& key, double v, const std::string& text) {
    md << "- " << text << " = **" << v << "x**\n";
    js << (first ? "" : ", ") << "\"" << key << "\": " << v;
    first = false;
  };
  const Sample* rtt4k = find("raw zmq", "round trip, 2 processes", 1024, 1, 1);
  const Sample* rtt256k = find("raw zmq", "round trip, 2 processes", 65536, 1, 1);
  const Sample* upd256k = find("shard update", "momentum update", 65536, 1, 1);
  const Sample* chk256k = find("raw zmq", "round trip, 2 processes, payload checked", 65536, 1, 1);
  const Sample* one4m = find("raw zmq", "one-way, 2 processes", 1048576, 1, 8);
  for (const char* op : {"push", "pull", "pull_in_place"}) {
    std::string o = op;
    if (auto* l = find("leash", o, 1024, 1, 1); l && rtt4k) {
      ratio(o + "_4KB_p50_over_raw_rtt", l->p50_us / rtt4k->p50_us,
            "4 KB " + o + ", 1 in flight: p50 " + std::to_string(l->p50_us) +
                " us over the raw two-process round trip " + std::to_string(rtt4k->p50_us) +
                " us (target <= 1.2x)");
    }
    if (auto* l = find("leash", o, 65536, 1, 1); l && rtt256k && upd256k) {
      double bound = rtt256k->p50_us + (o == "push" ? upd256k->p50_us : 0.0);
      ratio(o + "_256KB_p50_over_raw_rtt_plus_update", l->p50_us / bound,
            "256 KB " + o + ", 1 in flight: p50 " + std::to_string(l->p50_us) +
                " us over raw round trip " + std::to_string(rtt256k->p50_us) + " us" +
                (o == "push" ? " + update " + std::to_string(upd256k->p50_us) + " us" : "") +
                " (target <= 1x)");
    }
    // The same bound with the echo reading its payload once (rtt2check): the part of the
    // gap that is touching the received bytes, which the plain echo never does.
    if (auto* l = find("leash", o, 65536, 1, 1); l && chk256k && upd256k && o == "push") {
      double bound = chk256k->p50_us + upd256k->p50_us;
      ratio("push_256KB_p50_over_raw_checked_rtt_plus_update", l->p50_us / bound,
            "256 KB push, 1 in flight: p50 " + std::to_string(l->p50_us) +
                " us over the raw round trip with the echo checking the payload " +
                std::to_string(chk256k->p50_us) + " us + update " +
                std::to_string(upd256k->p50_us) +
                " us (what the target leaves out: reading "
                "the gradient once)");
    }
    if (auto* l = find("leash", o, 1048576, 1, 8); l && one4m) {
      ratio(o + "_4MB_8inflight_over_raw_oneway", l->mb_per_s / one4m->mb_per_s,
            "4 MB " + o + ", 8 in flight: " + std::to_string(l->mb_per_s) +
                " MB/s over raw single-socket one-way to another process " +
                std::to_string(one4m->mb_per_s) + " MB/s (target >= 1.5x)");
    }
  }
  md << "\n## Shared memory over socket (same cell, same run)\n\n";
  for (const auto& s : samples) {
    if (s.system != "leash") continue;
    if (auto* m = find("leash shm", s.op, s.floats, s.shards, s.inflight)) {
      std::string key = s.op + "_" + std::to_string(s.floats * 4 / 1024) + "KB_" +
                        std::to_string(s.shards) + "x" + std::to_string(s.workers) + "_" +
                        std::to_string(s.inflight) + "inflight_shm_over_socket_ops";
      ratio(key, m->ops_per_s / s.ops_per_s,
            std::to_string(s.floats * 4 / 1024) + " KB " + s.op + " " + std::to_string(s.shards) +
                "x" + std::to_string(s.workers) + ", " + std::to_string(s.inflight) +
                " in flight: ops/s with shared memory over socket");
    }
  }
  js << "}\n}\n";
  std::fputs(md.str().c_str(), stdout);
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  std::ofstream json_file(out + "/pushpull.json");
  std::ofstream md_file(out + "/pushpull.md");
  if (ec || !(json_file << js.str()) || !(md_file << md.str())) {
    std::fprintf(stderr,
                 "leash-bench-pushpull: cannot write pushpull.json and pushpull.md in %s%s%s\n",
                 out.c_str(), ec ? ": " : "", ec ? ec.message().c_str() : "");
    return 1;
  }
  return 0;
}

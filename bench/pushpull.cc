// Push/pull microbenchmark: real leash-server shards on loopback applying a real
// optimizer update to every push, driven by leash::Client workers with 1 or 8 requests in
// flight, against the raw ZeroMQ ceiling measured in the same run (a plain DEALER/ROUTER
// echo for round trips and a plain PUSH/PULL stream for one-way throughput).
// Writes JSON and a markdown summary. Single-threaded driver plus one thread per worker.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <future>
#include <numeric>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "leash/common/curve_keys.h"
#include "leash/common/flags.h"
#include "leash/common/zmq_transport.h"
#include "leash/worker/client.h"

namespace {

using SteadyClock = std::chrono::steady_clock;

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
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// --curve-keys: the Leash shards and clients use CURVE with these keys (leashctl keygen DIR
// --server --client bench). Empty: plain ZMTP.
std::string g_curve_keys;

int FreePort() {
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::rep);
  s.bind("tcp://127.0.0.1:*");
  std::string ep = s.get(zmq::sockopt::last_endpoint);
  return std::stoi(ep.substr(ep.rfind(':') + 1));
}

class Shards {
 public:
  Shards(const std::string& bin, int n, const std::string& dir) {
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
                                         "--log-level=warn"};
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
  ~Shards() {
    for (pid_t p : pids_) kill(p, SIGKILL);
    for (pid_t p : pids_) waitpid(p, nullptr, 0);
  }
  const std::vector<std::string>& endpoints() const { return endpoints_; }

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
                             int inflight, double seconds, int64_t spin_us) {
  Shards shards(bin, n, dir);
  leash::ZmqContext ctx;
  std::vector<std::unique_ptr<leash::Client>> clients;
  for (int w = 0; w < n; ++w) {
    leash::ClientOptions o;
    o.name = "bench" + std::to_string(w);
    o.staleness =
        int64_t{1} << 40;  // pulls never wait for clocks: this measures transport and update cost
    o.reply_spin_us = spin_us;
    leash::ZmqOptions zo;
    if (!g_curve_keys.empty()) zo.curve = leash::LoadCurveClientKeys(g_curve_keys, "bench").value();
    auto c = leash::Client::Connect(
        std::move(leash::ConnectZmqClient(ctx, shards.endpoints(), zo).value()), o);
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
      std::exit(1);
    }
    clients.push_back(std::move(*c));
  }
  leash::TableSpec t;
  t.name = "bench";
  t.cols = 64;
  t.rows = static_cast<uint64_t>(floats / 64);
  t.optimizer.kind = leash::OptimizerKind::kMomentum;
  t.optimizer.lr = 1e-6f;
  auto table = clients[0]->CreateTable(t).value();
  std::vector<Sample> out;
  for (const char* op : {"push", "pull"}) {
    std::vector<std::vector<double>> lat(static_cast<size_t>(n));
    std::vector<int64_t> ops(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    auto t0 = SteadyClock::now();
    for (int w = 0; w < n; ++w) {
      threads.emplace_back([&, w] {
        std::vector<float> buf(static_cast<size_t>(floats), 1e-3f);
        leash::Client* c = clients[static_cast<size_t>(w)].get();
        std::vector<std::vector<float>> outs(static_cast<size_t>(inflight),
                                             std::vector<float>(static_cast<size_t>(floats)));
        size_t k = 0;
        lat[static_cast<size_t>(w)] = Drive(
            [&] {
              if (std::string(op) == "push") return c->Push(table, buf.data());
              return c->Pull(table, outs[k++ % outs.size()].data());
            },
            inflight, seconds, &ops[static_cast<size_t>(w)]);
      });
    }
    for (auto& th : threads) th.join();
    double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    std::vector<double> all;
    for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
    int64_t total = std::accumulate(ops.begin(), ops.end(), int64_t{0});
    Sample s{op, "leash", floats, n, n, inflight};
    s.ops_per_s = static_cast<double>(total) / secs;
    s.mb_per_s = s.ops_per_s * static_cast<double>(floats) * 4 / 1e6;
    s.p50_us = Percentile(all, 0.5);
    s.p99_us = Percentile(all, 0.99);
    out.push_back(s);
  }
  return out;
}

void Echo(zmq::socket_t& router, const std::atomic<bool>& stop) {
  router.set(zmq::sockopt::rcvtimeo, 100);
  while (!stop) {
    zmq::message_t id, body;
    if (!router.recv(id)) continue;
    (void)router.recv(body);
    router.send(id, zmq::send_flags::sndmore);
    zmq::message_t small(8);
    router.send(small, zmq::send_flags::none);  // an acknowledgement, as a push gets
  }
}

// Raw ZeroMQ round trip: DEALER -> ROUTER echo, one message in flight. The echo is a
// thread sharing the client's context (and its one ZeroMQ I/O thread), or, with
// `other_process`, a forked process with its own context, as a Leash shard is.
Sample RawRoundTrip(int64_t floats, double seconds, bool other_process = false) {
  std::string ep = "tcp://127.0.0.1:" + std::to_string(FreePort());
  pid_t child = -1;
  if (other_process) {
    child = fork();  // no ZeroMQ context or other thread is alive here
    if (child == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      zmq::context_t cctx;
      zmq::socket_t router(cctx, zmq::socket_type::router);
      router.bind(ep);
      std::atomic<bool> never{false};
      Echo(router, never);
      _exit(0);
    }
  }
  zmq::context_t ctx;
  zmq::socket_t router(ctx, zmq::socket_type::router);
  if (!other_process) router.bind(ep);
  std::atomic<bool> stop{false};
  std::thread echo([&] {
    if (!other_process) Echo(router, stop);
  });
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.connect(ep);
  std::vector<char> payload(static_cast<size_t>(floats) * 4, 1);
  std::vector<double> lat;
  auto end = SteadyClock::now() + std::chrono::duration<double>(seconds);
  auto t0 = SteadyClock::now();
  while (SteadyClock::now() < end) {
    auto s = SteadyClock::now();
    dealer.send(zmq::buffer(payload), zmq::send_flags::none);
    zmq::message_t r;
    (void)dealer.recv(r);
    lat.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - s).count());
  }
  double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  stop = true;
  echo.join();
  if (child > 0) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  }
  Sample out{other_process ? "round trip, 2 processes" : "round trip", "raw zmq", floats, 1, 1, 1};
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
// last message (an end marker behind the stream, answered over a pipe), so the figure is
// delivered bytes, not bytes handed to the sending socket.
Sample RawOneWay(int64_t floats, double seconds, bool other_process = false) {
  std::string ep = "tcp://127.0.0.1:" + std::to_string(FreePort());
  int pipefd[2] = {-1, -1};
  pid_t child = -1;
  if (other_process) {
    if (pipe(pipefd) != 0) return Sample{"one-way, 2 processes", "raw zmq", floats, 1, 1, 8};
    child = fork();  // no ZeroMQ context or other thread is alive here
    if (child == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(pipefd[0]);
      zmq::context_t cctx;
      zmq::socket_t pull(cctx, zmq::socket_type::pull);
      pull.bind(ep);
      int64_t n = 0;
      for (;;) {
        zmq::message_t m;
        if (!pull.recv(m)) continue;
        if (m.size() == 1) break;  // the end marker
        ++n;
      }
      ssize_t w = write(pipefd[1], &n, sizeof n);
      _exit(w == static_cast<ssize_t>(sizeof n) ? 0 : 1);
    }
    close(pipefd[1]);
  }
  zmq::context_t ctx;
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
  zmq::socket_t push(ctx, zmq::socket_type::push);
  push.set(zmq::sockopt::sndhwm, 8);
  push.connect(ep);
  std::vector<char> payload(static_cast<size_t>(floats) * 4, 1);
  auto t0 = SteadyClock::now();
  auto end = t0 + std::chrono::duration<double>(seconds);
  while (SteadyClock::now() < end) push.send(zmq::buffer(payload), zmq::send_flags::none);
  double secs = 0;
  if (other_process) {
    char marker = 0;
    push.send(zmq::buffer(&marker, 1), zmq::send_flags::none);
    int64_t n = 0;
    if (read(pipefd[0], &n, sizeof n) == static_cast<ssize_t>(sizeof n)) received = n;
    secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    close(pipefd[0]);
    waitpid(child, nullptr, 0);
  } else {
    secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    stop = true;
    rx.join();
  }
  Sample out{other_process ? "one-way, 2 processes" : "one-way", "raw zmq", floats, 1, 1, 8};
  out.ops_per_s = static_cast<double>(received.load()) / secs;
  out.mb_per_s = out.ops_per_s * static_cast<double>(floats) * 4 / 1e6;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string server = "build/server/leash-server";
  std::string sizes = "1024,65536,1048576";
  std::string out = "bench/results";
  double seconds = 2;
  int64_t spin_us = 0;
  leash::Flags flags("leash-bench-pushpull",
                     "Push/pull microbenchmark against the raw ZeroMQ ceiling.");
  flags.String("server-bin", &server, "leash-server executable");
  flags.String("sizes", &sizes, "floats per request");
  flags.Double("seconds", &seconds, "duration of each measurement");
  flags.String("out", &out, "directory for pushpull.json and pushpull.md");
  flags.Int("reply-spin-us", &spin_us,
            "ClientOptions::reply_spin_us of the Leash clients (0: sleep at once)");
  flags.String("curve-keys", &g_curve_keys,
               "CURVE keys of the Leash shards and clients (leashctl keygen DIR --server --client "
               "bench); empty: plain ZMTP. The raw ZeroMQ rows stay plain");
  if (auto st = flags.Parse(argc, argv); !st.ok() || flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), st.ok() ? stdout : stderr);
    return st.ok() ? 0 : 2;
  }
  char tmpl[] = "/tmp/leash-bench-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::vector<Sample> samples;
  for (const auto& sz : leash::SplitList(sizes)) {
    int64_t floats = std::stoll(sz);
    samples.push_back(RawRoundTrip(floats, seconds));
    samples.push_back(RawRoundTrip(floats, seconds, /*other_process=*/true));
    samples.push_back(RawOneWay(floats, seconds));
    samples.push_back(RawOneWay(floats, seconds, /*other_process=*/true));
    for (int n : {1, 2}) {
      for (int inflight : {1, 8}) {
        auto r = RunLeash(server,
                          dir + "/" + sz + "-" + std::to_string(n) + "-" + std::to_string(inflight),
                          floats, n, inflight, seconds, spin_us);
        samples.insert(samples.end(), r.begin(), r.end());
      }
    }
    for (size_t i = samples.size() - 12; i < samples.size(); ++i) {
      const Sample& s = samples[i];
      std::printf(
          "%-8s %-10s %8lld floats %d shard(s) %d worker(s) %d in flight: %9.0f ops/s %8.1f MB/s "
          "p50 %8.1f us p99 %8.1f us\n",
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
      if (s.system == sys && s.op == op && s.floats == floats &&
          (sys != "leash" || (s.shards == n && s.inflight == inflight))) {
        return &s;
      }
    }
    return nullptr;
  };
  std::ostringstream md, js;
  md << "# Push/pull microbenchmark\n\nReal leash-server shards on loopback (momentum update on "
        "every push), "
     << "leash::Client workers; raw ZeroMQ measured in the same run. " << seconds << " s per cell, "
     << std::thread::hardware_concurrency() << " cores, client reply spin " << spin_us << " us"
     << (g_curve_keys.empty() ? "" : ", Leash rows with CURVE") << ".\n\n"
     << "| system | op | floats | shards x workers | in flight | ops/s | MB/s | p50 us | p99 us "
        "|\n|---|---|---|---|---|---|---|---|---|\n";
  js << "{\n  \"benchmark\": \"pushpull\",\n  \"seconds\": " << seconds
     << ",\n  \"curve\": " << (g_curve_keys.empty() ? "false" : "true") << ",\n  \"samples\": [\n";
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    char row[256];
    std::snprintf(row, sizeof row, "| %s | %s | %lld | %dx%d | %d | %.0f | %.1f | %.1f | %.1f |\n",
                  s.system.c_str(), s.op.c_str(), static_cast<long long>(s.floats), s.shards,
                  s.workers, s.inflight, s.ops_per_s, s.mb_per_s, s.p50_us, s.p99_us);
    md << row;
    js << "    {\"system\": \"" << s.system << "\", \"op\": \"" << s.op
       << "\", \"floats\": " << s.floats << ", \"shards\": " << s.shards
       << ", \"workers\": " << s.workers << ", \"inflight\": " << s.inflight
       << ", \"ops_per_s\": " << s.ops_per_s << ", \"mb_per_s\": " << s.mb_per_s
       << ", \"p50_us\": " << s.p50_us << ", \"p99_us\": " << s.p99_us << "}"
       << (i + 1 < samples.size() ? ",\n" : "\n");
  }
  js << "  ],\n  \"ratios\": {";
  md << "\n## Against the raw ZeroMQ ceiling\n\n";
  bool first = true;
  if (auto* l = find("leash", "push", 1024, 1, 1); l != nullptr) {
    if (auto* r = find("raw zmq", "round trip", 1024, 1, 1)) {
      double ratio = l->p50_us / r->p50_us;
      md << "- 4 KB push, one in flight: p50 " << l->p50_us << " us vs raw round trip " << r->p50_us
         << " us = **" << ratio << "x** (target <= 1.3x)\n";
      js << "\"push_4KB_p50_over_raw_rtt\": " << ratio;
      first = false;
    }
    if (auto* r = find("raw zmq", "round trip, 2 processes", 1024, 1, 1)) {
      double ratio = l->p50_us / r->p50_us;
      md << "- the same against the raw round trip to an echo in another process (its own ZeroMQ "
            "context, as a "
         << "shard has): " << r->p50_us << " us = **" << ratio << "x**\n";
      js << (first ? "" : ", ") << "\"push_4KB_p50_over_raw_rtt_2_processes\": " << ratio;
      first = false;
    }
  }
  if (auto* l = find("leash", "push", 1048576, 1, 8); l != nullptr) {
    if (auto* r = find("raw zmq", "one-way", 1048576, 1, 1)) {
      double ratio = l->mb_per_s / r->mb_per_s;
      md << "- 4 MB push, 8 in flight: " << l->mb_per_s << " MB/s vs raw one-way " << r->mb_per_s
         << " MB/s = **" << ratio * 100 << "%** (target >= 80%)\n";
      js << (first ? "" : ", ") << "\"push_4MB_throughput_over_raw\": " << ratio;
      first = false;
    }
    if (auto* r = find("raw zmq", "one-way, 2 processes", 1048576, 1, 1)) {
      double ratio = l->mb_per_s / r->mb_per_s;
      md << "- the same against the raw one-way stream to a receiver in another process (delivered "
            "bytes): "
         << r->mb_per_s << " MB/s = **" << ratio * 100 << "%**\n";
      js << (first ? "" : ", ") << "\"push_4MB_throughput_over_raw_2_processes\": " << ratio;
    }
  }
  js << "}\n}\n";
  std::ofstream(out + "/pushpull.json") << js.str();
  std::ofstream(out + "/pushpull.md") << md.str();
  std::fputs(md.str().c_str(), stdout);
  return 0;
}

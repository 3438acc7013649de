// leash-worker: trains a built-in model on Fashion-MNIST against a Leash cluster
// (--servers) or alone in this process (--local, the baseline); with --metrics-bind its
// progress as Prometheus metrics on HTTP. SIGTERM/SIGINT: finish the current step, push
// it, leave the job, exit 0. Configuration in config.h; this file only wires the parts.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "config.h"
#include "leash/common/cli.h"
#include "leash/common/curve_keys.h"
#include "leash/common/etcd_coordinator.h"
#include "leash/common/metrics.h"
#include "leash/common/wire.h"
#include "leash/common/zmq_transport.h"
#include "leash/kernels/blas_core.h"
#include "leash/kernels/kernels.h"
#include "leash/worker/client.h"
#include "leash/worker/dataset.h"
#include "leash/worker/model.h"
#include "leash/worker/params.h"
#include "leash/worker/trainer.h"
#include "leash/worker/worker_metrics.h"
#include "movielens.h"
#include "proportional.h"

namespace {

using leash::worker::WorkerConfig;

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

// Set by UseTheCpusBlasKernels for the process it restarts: the kernels OpenBLAS chose first.
constexpr const char* kBlasFellBackTo = "LEASH_OPENBLAS_FELL_BACK_TO";
// Why UseTheCpusBlasKernels could not restart this process (then it goes on as it is).
std::string g_blas_restart_error;

// OpenBLAS picks its kernels when it loads, before main; on a CPU it does not know it takes
// its pre-AVX ones (blas_core.h). Then, unless the user chose them (OPENBLAS_CORETYPE), this
// process restarts itself (same PID, arguments and environment) with OPENBLAS_CORETYPE naming
// the kernels for the CPU's widest vectors. If the restart fails, training goes on as it is.
void UseTheCpusBlasKernels(char** argv) {
  namespace cpu = leash::kernels::cpu;
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;  // the user's choice, or ours already
  const std::string core = cpu::OpenBlasCore();
  const std::string better = cpu::BetterOpenBlasCore(core, cpu::HostIsa());
  if (better.empty()) return;
  // The executable's path, not /proc/self/exe itself: tools that run the worker (valgrind)
  // answer readlink with the worker's path, while /proc/self/exe is their own binary.
  char self[4096];
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    g_blas_restart_error = len < 0 ? std::strerror(errno) : "empty path";
    return;
  }
  self[len] = '\0';
  ::setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  ::setenv(kBlasFellBackTo, core.c_str(), 1);
  ::execv(self, argv);
  g_blas_restart_error = std::strerror(errno);  // still here: LogBlasKernels says so
  ::unsetenv("OPENBLAS_CORETYPE");
  ::unsetenv(kBlasFellBackTo);
}

// What UseTheCpusBlasKernels did, and the kernels in use, for a worker computing on the CPU.
void LogBlasKernels() {
  namespace cpu = leash::kernels::cpu;
  const std::string core = cpu::OpenBlasCore();
  const std::string better = cpu::BetterOpenBlasCore(core, cpu::HostIsa());
  const char* fell = std::getenv(kBlasFellBackTo);
  const std::string first = fell != nullptr ? fell : "";
  ::unsetenv(kBlasFellBackTo);
  if (!g_blas_restart_error.empty()) {
    spdlog::warn(
        "OpenBLAS took this CPU for one without AVX and computes with its {} kernels, about 2.5x "
        "slower; restarting with better ones failed ({}). Set OPENBLAS_CORETYPE={} in the "
        "environment",
        core, g_blas_restart_error, better);
  } else if (!first.empty() && !better.empty()) {
    spdlog::warn(
        "OpenBLAS fell back to its {} kernels on this CPU and ignored OPENBLAS_CORETYPE={} (a "
        "build without them?); its matrix products run about 2.5x slower than they could",
        core, better);
  } else if (!first.empty()) {
    spdlog::info(
        "OpenBLAS did not know this CPU and took its {} kernels (no AVX); leash-worker restarted "
        "itself with OPENBLAS_CORETYPE={} and computes with those (set OPENBLAS_CORETYPE to "
        "choose others)",
        first, core);
  } else {
    spdlog::info("OpenBLAS {} kernels", core);
  }
}

// After SIGTERM/SIGINT the worker finishes its step, pushes and leaves. If that cannot
// happen in `grace_s` (a shard is unreachable and a pull or push waits for it), it exits
// anyway rather than hang: the shards evict it when its lease expires.
void LeaveWatchdog(int64_t grace_s, const std::atomic<bool>* done) {
  while (!g_stop.load() && !done->load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(grace_s);
  while (!done->load()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      spdlog::error(
          "could not finish the step and leave within {} s of the stop signal (is a "
          "shard unreachable?); exiting without leaving: the shards will evict this "
          "worker when its lease expires",
          grace_s);
      spdlog::shutdown();
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// Runs LeaveWatchdog on a thread from construction to destruction.
class Watchdog {
 public:
  explicit Watchdog(int64_t grace_s) : thread_(LeaveWatchdog, grace_s, &done_) {}
  ~Watchdog() {
    done_.store(true);
    thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// A failed step of the start: the exit code and why.
struct Failure {
  int code;
  std::string message;
};

Failure Fail(const std::string& what, const leash::Status& st, int code = 1) {
  return {code, what + ": " + st.ToString()};
}

// Everything a worker trains with, built from its config. Members are destroyed in the
// reverse order: the metrics before the client they read, the client before its context
// and while the watchdog still runs, the metrics endpoint last.
struct Worker {
  std::string name;
  std::unique_ptr<leash::MetricsServer> metrics_server;
  std::unique_ptr<leash::kernels::Context> device;
  std::optional<leash::worker::Dataset> train;
  std::optional<leash::worker::Dataset> test;
  std::unique_ptr<leash::worker::Model> model;
  std::optional<Watchdog> watchdog;        // from the signal handlers on
  std::unique_ptr<leash::ZmqContext> zmq;  // an I/O thread per stripe
  std::unique_ptr<leash::Client> client;
  std::unique_ptr<leash::worker::ParamStore> params;
  std::unique_ptr<leash::worker::WorkerMetrics> metrics;
  leash::worker::TrainOptions train_options;
};

std::string DefaultName() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return std::string(host) + ":" + std::to_string(getpid());
}

// The metrics endpoint, the device, the data and the model.
std::optional<Failure> BuildCompute(const WorkerConfig& c, Worker& w) {
  if (!c.metrics_bind.empty()) {
    auto m = leash::MetricsServer::Start(c.metrics_bind);
    if (!m.ok()) return Fail("metrics", m.status());
    w.metrics_server = std::move(*m);
  }
  // The click-through model computes on the CPU: --device auto means the CPU for it.
  const bool ctr_auto = c.model == leash::worker::ModelKind::kCtr && c.device == "auto";
  auto dev = leash::kernels::ParseDevice(ctr_auto ? "cpu" : c.device);
  if (!dev.ok()) return Fail("--device", dev.status());
  auto ctx = leash::kernels::Context::Create(*dev, static_cast<int>(c.threads));
  if (!ctx.ok()) return Fail("cannot set up device " + c.device, ctx.status());
  w.device = std::move(*ctx);
  if (ctr_auto) {
    spdlog::info("--device auto: the click-through model computes on the CPU, {} BLAS thread(s)",
                 c.threads);
  } else if (c.device == "auto" && dev->type == leash::kernels::DeviceType::kCpu) {
    spdlog::info(
        "--device auto: {}; computing on the CPU with {} BLAS thread(s)",
        leash::kernels::CudaBuilt() ? "no usable GPU found" : "this build has no CUDA support",
        c.threads);
  } else {
    spdlog::info("computing on {}", leash::kernels::DeviceName(*dev));
  }
  if (dev->type == leash::kernels::DeviceType::kCpu) LogBlasKernels();

  if (c.model == leash::worker::ModelKind::kCtr) {
    // --data left at its (Fashion-MNIST) default means MovieLens' own default.
    const std::string dir = c.data == WorkerConfig{}.data ? "" : c.data;
    spdlog::info("loading MovieLens-100k from {}",
                 dir.empty() ? leash::worker::kMovieLensDefaultDir : dir);
    auto data = leash::worker::LoadMovieLens(dir);
    if (!data.ok()) return Fail("MovieLens-100k", data.status());
    w.train = std::move(data->train);
    w.test = std::move(data->test);
  } else {
    spdlog::info("loading Fashion-MNIST from {}", c.data);
    auto train = leash::worker::LoadFashionMnist(c.data, true);
    if (!train.ok()) return Fail("training set", train.status());
    auto test = leash::worker::LoadFashionMnist(c.data, false);
    if (!test.ok()) return Fail("test set", test.status());
    w.train = std::move(*train);
    w.test = std::move(*test);
  }
  w.train->Truncate(c.train_limit);
  w.test->Truncate(c.test_limit);
  // Working in proportion to speed, a worker's batch may be up to the whole global batch.
  const int64_t max_batch = std::max(c.batch, c.global_batch);
  auto model =
      c.model == leash::worker::ModelKind::kCnn ? leash::worker::MakeCnn(*w.device, max_batch)
      : c.model == leash::worker::ModelKind::kCtr
          ? leash::worker::MakeCtr(*w.device, leash::worker::MovieLensSlotFields(), c.embedding_dim,
                                   c.hidden, max_batch, static_cast<float>(c.embedding_scale))
          : leash::worker::MakeMlp(*w.device, w.train->features(), c.hidden, 10, max_batch);
  if (!model.ok()) return Fail("model", model.status());
  w.model = std::move(*model);
  return std::nullopt;
}

// The parameter store (a client of the cluster, or local tables), its tables, the
// metrics and the training options.
std::optional<Failure> BuildTraining(const WorkerConfig& c, Worker& w) {
  if (c.local) {
    w.params = leash::worker::MakeLocalParams();
  } else {
    leash::ZmqOptions zopts;
    zopts.shared_memory = c.shared_memory;
    zopts.shm_ring_bytes = c.shm_ring_mb << 20;
    zopts.send_delay_ms = static_cast<int>(c.send_delay_ms);
    zopts.stripes = c.stripes;
    w.zmq = std::make_unique<leash::ZmqContext>(c.stripes);
    if (!c.curve_keys.empty()) {
      auto keys = leash::LoadCurveClientKeys(c.curve_keys, c.curve_client);
      if (!keys.ok()) return Failure{2, "--curve-keys: " + keys.status().message()};
      zopts.curve = std::move(*keys);
      spdlog::info("CURVE security on: key pair '{}' from {}", c.curve_client, c.curve_keys);
    }
    std::vector<std::string> servers = c.servers;
    bool replicated = false;
    leash::ClientOptions co;
    if (!c.etcd.empty()) {
      leash::EtcdOptions eo;
      eo.job = c.job;
      for (const std::string& e : c.etcd) {
        auto endpoints = leash::ParseEtcdEndpoints(e);
        if (!endpoints.ok()) return Fail("--etcd", endpoints.status());
        eo.endpoints.insert(eo.endpoints.end(), endpoints->begin(), endpoints->end());
      }
      auto directory = leash::NewEtcdShardDirectory(eo);
      if (!directory.ok()) return Fail("--etcd", directory.status());
      co.directory = std::move(*directory);
      auto view = leash::ResolvePrimaries(*co.directory, c.connect_timeout_s * 1000);
      if (!view.ok()) return Fail("cannot find the shards in etcd", view.status());
      servers = leash::PrimaryEndpoints(*view);
      spdlog::info("job '{}' in etcd: {} shard(s) x {} replica(s); following their primaries",
                   c.job, view->num_shards, view->replicas);
      replicated = view->replicas > 1;
      co.directory_view = std::move(*view);
    }
    if (c.curve_keys.empty() &&
        !std::all_of(servers.begin(), servers.end(), leash::IsLoopbackEndpoint)) {
      spdlog::warn(
          "connecting to shards on other hosts WITHOUT CURVE keys (--insecure): traffic is "
          "unauthenticated and unencrypted; use --curve-keys DIR (leashctl keygen DIR)");
    }
    auto transport = leash::ConnectZmqClient(*w.zmq, servers, zopts);
    if (!transport.ok()) return Fail(c.etcd.empty() ? "--servers" : "--etcd", transport.status());
    co.name = w.name;
    co.staleness = c.staleness;
    co.wire_dtype = c.wire_dtype;
    co.connect_timeout_ms = c.connect_timeout_s * 1000;
    auto client = leash::Client::Connect(std::move(*transport), co);
    if (!client.ok()) return Fail("cannot join the cluster", client.status());
    w.client = std::move(*client);
    w.params = leash::worker::MakeRemoteParams(w.client.get(), c.staleness,
                                               /*clock_with_pull=*/!replicated, c.pull_in_place);
  }
  leash::worker::OptimizerOptions opt;
  opt.kind = c.optimizer;
  opt.learning_rate = static_cast<float>(c.lr);
  opt.momentum = static_cast<float>(c.momentum);
  opt.weight_decay = static_cast<float>(c.weight_decay);
  opt.seed = static_cast<uint64_t>(c.seed);
  // --lr and --weight-decay are per push of a --batch mean gradient; under work in
  // proportion to speed the shards' optimizers get the rates that keep that step per sample.
  const leash::worker::OptimizerOptions dense_opt =
      leash::worker::ProportionalOptimizer(opt, c.global_batch, c.batch, c.clock_steps);
  if (auto st = w.params->Setup(w.model->params(), dense_opt); !st.ok()) {
    return Fail("creating tables", st);
  }
  if (const leash::worker::ParamSpec* sparse = w.model->sparse_param()) {
    leash::worker::OptimizerOptions sopt = opt;
    sopt.kind = c.sparse_optimizer;
    if (c.sparse_lr > 0) sopt.learning_rate = static_cast<float>(c.sparse_lr);
    // A sparse table takes a step per push: its rows are summed by no clock step.
    sopt = leash::worker::ProportionalOptimizer(sopt, c.global_batch, c.batch, false);
    if (auto st = w.params->SetupSparse(*sparse, sopt); !st.ok()) {
      return Fail("creating the sparse table", st);
    }
  }

  leash::worker::TrainOptions& to = w.train_options;
  to.epochs = c.epochs;
  to.batch = c.batch;
  to.chunk_size = c.chunk_size;
  to.accumulate = c.accumulate;
  to.seed = static_cast<uint64_t>(c.seed);
  to.log_every = c.log_every;
  to.evaluate = c.evaluate;
  to.eval_every = c.eval_every;
  to.step_delay_factor = c.step_delay_factor;
  to.slow_spells = c.slow_spells;
  if (c.slow_spells.enabled()) {
    spdlog::warn("--slow-spells: this worker ({} of {}) computes {}x slower in its {} s spells",
                 c.slow_spells.worker, c.slow_spells.workers, c.slow_spells.factor,
                 c.slow_spells.seconds);
  }
  to.global_batch = c.global_batch;
  to.clock_steps = c.clock_steps;
  if (c.global_batch > 0) {
    spdlog::info(
        "work in proportion to speed: the job trains {} samples per clock, this worker its "
        "share ({} until the speeds are known); the shards' {} at learning rate {},{} weight "
        "decay {}, on pushes weighted by their share, {} (--lr {} and --weight-decay {} are "
        "per batch of {}: the same step per sample)",
        c.global_batch, c.batch, leash::OptimizerName(c.optimizer), dense_opt.learning_rate,
        c.optimizer == leash::OptimizerKind::kMomentum
            ? fmt::format(" momentum {:.4g},", dense_opt.momentum)
            : std::string(),
        dense_opt.weight_decay,
        c.clock_steps ? "one step per clock on their sum" : "one step per push", c.lr,
        c.weight_decay, c.batch);
  }
  if (c.step_delay_factor > 1) {
    spdlog::warn("--step-delay-factor {}: this worker sleeps to compute {}x slower",
                 c.step_delay_factor, c.step_delay_factor);
  }
  to.label = c.local ? "[local]" : "[" + w.name + "]";
  if (w.metrics_server) {
    w.metrics = std::make_unique<leash::worker::WorkerMetrics>(w.metrics_server->registry(), w.name,
                                                               c.staleness, w.client.get());
    leash::worker::WorkerMetrics* metrics = w.metrics.get();
    to.on_step = [metrics](const leash::worker::StepReport& r) { metrics->OnStep(r); };
    to.on_epoch = [metrics](const leash::worker::EpochResult& r) { metrics->OnEpoch(r); };
    spdlog::info("metrics on {}", w.metrics_server->url());
  }
  return std::nullopt;
}

// Trains, leaves the job, prints the outcome and writes --metrics-out.
int Train(const WorkerConfig& c, Worker& w) {
  std::string hidden;
  for (int64_t h : c.hidden) hidden += (hidden.empty() ? "" : ",") + std::to_string(h);
  spdlog::info(
      "training {} on {} samples in chunks of {}, batch {}, staleness {}, {} lr {}, {} "
      "on the wire",
      c.model == leash::worker::ModelKind::kCnn ? std::string("CNN")
      : c.model == leash::worker::ModelKind::kCtr
          ? "click-through model, embeddings " + std::to_string(c.embedding_dim) + ", hidden " +
                hidden
          : "MLP " + hidden,
      w.train->count, c.chunk_size, c.batch, c.staleness, leash::OptimizerName(c.optimizer), c.lr,
      leash::DTypeName(c.wire_dtype));
  const leash::worker::TrainOptions& to = w.train_options;
  auto results = leash::worker::Train(*w.model, *w.params, *w.train, &*w.test, to, &g_stop);
  leash::Status finish = w.params->Finish();
  if (!results.ok()) {
    spdlog::error("training failed: {}", results.status().ToString());
    return 1;
  }
  if (!finish.ok()) spdlog::warn("leaving the job: {}", finish.ToString());
  std::vector<std::pair<std::string, double>> extra = {
      {"compute_seconds", results->compute_seconds},
      {"injected_delay_seconds", results->injected_delay_seconds},
      {"pull_seconds", results->pull_seconds},
      {"push_seconds", results->push_seconds},
      {"pushes_handed_over", static_cast<double>(results->pushes_handed_over)},
      {"gradient_buffers", static_cast<double>(results->gradient_buffers)},
      {"pushes_from_shared_memory", static_cast<double>(results->pushes_from_shared_memory)},
      {"params_read_in_place", static_cast<double>(results->params_read_in_place)},
      {"step_delay_factor", c.step_delay_factor},
      {"slow_spells_factor", c.slow_spells.factor},
      {"final_clock", static_cast<double>(w.params->clock())}};
  if (w.client) {
    auto n = w.client->counters();
    double iters = static_cast<double>(std::max<int64_t>(1, results->iterations));
    double sent = static_cast<double>(n.bytes_sent) / iters;
    double received = static_cast<double>(n.bytes_received) / iters;
    extra.push_back({"bytes_sent_per_iteration", sent});
    extra.push_back({"bytes_received_per_iteration", received});
    extra.push_back({"shared_memory_shards", n.shared_memory_shards});
    extra.push_back({"shared_memory_backups", n.shared_memory_backups});
    spdlog::info(
        "wire ({}): {} requests, {:.1f} MB sent, {:.1f} MB received, {} resent ({} for a "
        "backup's missing answer); per iteration {:.1f} KB sent, {:.1f} KB received; {} of {} "
        "shard(s) reached through shared memory",
        leash::DTypeName(c.wire_dtype), n.requests, n.bytes_sent / 1e6, n.bytes_received / 1e6,
        n.resends, n.backup_reply_resends, sent / 1e3, received / 1e3, n.shared_memory_shards,
        w.client->num_shards());
  }
  const auto& epochs_done = results->epochs;
  std::printf("%s trained %lld chunks%s\n", to.label.c_str(),
              static_cast<long long>(results->chunks_trained),
              results->rejoins > 0
                  ? (", rejoined " + std::to_string(results->rejoins) + " time(s)").c_str()
                  : "");
  if (!epochs_done.empty() && epochs_done.back().test_accuracy >= 0) {
    std::printf("%s final test accuracy %.2f%%\n", to.label.c_str(),
                epochs_done.back().test_accuracy * 100);
  }
  if (!c.metrics_out.empty()) {
    if (auto st = leash::worker::WriteResultsJson(c.metrics_out, c.local ? "local" : "cluster", to,
                                                  *results, extra);
        !st.ok()) {
      spdlog::error("metrics: {}", st.ToString());
      return 1;
    }
  }
  return 0;
}

int Run(const WorkerConfig& config) {
  Worker w;
  w.name = config.name.empty() ? DefaultName() : config.name;
  auto report = [](const Failure& f) {
    spdlog::error("{}", f.message);
    return f.code;
  };
  if (auto failure = BuildCompute(config, w)) return report(*failure);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  w.watchdog.emplace(std::max<int64_t>(1, config.leave_timeout_s));
  if (auto failure = BuildTraining(config, w)) return report(*failure);
  const int code = Train(config, w);
  if (code == 0 && config.wait_when_done && !g_stop.load()) {
    // A Deployment restarts a container that exits, even with 0: stay up, idle, until the
    // pod is removed (kubectl scale --replicas=0). The metrics endpoint keeps answering.
    std::fflush(stdout);
    spdlog::info(
        "the job is trained; waiting for SIGTERM or SIGINT to exit (--wait-when-done: scale the "
        "workers to 0 or delete them)");
    while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  UseTheCpusBlasKernels(argv);
  leash::worker::WorkerCommandLine line;
  auto start = leash::RunPrologue<WorkerConfig>(line.cli(), argc, argv, "worker",
                                                [&] { return line.Config(); });
  if (const int* code = std::get_if<int>(&start)) return *code;
  return Run(std::get<WorkerConfig>(start));
}

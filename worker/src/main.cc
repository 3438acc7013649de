// leash-worker: trains a built-in model on Fashion-MNIST against a Leash cluster
// (--servers) or alone in this process (--local, the baseline); with --metrics-bind its
// progress as Prometheus metrics on HTTP. SIGTERM/SIGINT: finish the current step, push
// it, leave the job, exit 0.
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <csignal>
#include <cstdio>
#include <memory>
#include <unistd.h>

#include "leash/common/curve_keys.h"
#include "leash/common/flags.h"
#include "leash/common/logging.h"
#include "leash/common/metrics.h"
#include "leash/common/zmq_transport.h"
#include "leash/kernels/kernels.h"
#include "leash/worker/client.h"
#include "leash/worker/dataset.h"
#include "leash/worker/model.h"
#include "leash/worker/params.h"
#include "leash/worker/trainer.h"
#include "leash/worker/worker_metrics.h"

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

// After SIGTERM/SIGINT the worker finishes its step, pushes and leaves. If that cannot
// happen in `grace_s` (a shard is unreachable and a pull or push waits for it), it exits
// anyway rather than hang: the shards evict it when its lease expires.
void LeaveWatchdog(int64_t grace_s, const std::atomic<bool>* done) {
  while (!g_stop.load() && !done->load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(grace_s);
  while (!done->load()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      spdlog::error("could not finish the step and leave within {} s of the stop signal (is a shard unreachable?); "
                    "exiting without leaving: the shards will evict this worker when its lease expires",
                    grace_s);
      spdlog::shutdown();
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

int Fail(const std::string& what, const leash::Status& st) {
  spdlog::error("{}: {}", what, st.ToString());
  return 1;
}

int Run(int argc, char** argv) {
  std::string servers;
  bool local = false;
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::string optimizer = "momentum";
  std::string wire_dtype = "fp32";
  std::string name;
  std::string hidden = "256,128";
  std::string model_name = "mlp";
  std::string log_level = "info";
  std::string metrics_out;
  std::string metrics_bind;
  std::string device = "auto";
  std::string curve_keys;
  std::string curve_client = leash::kDefaultCurveClient;
  int64_t staleness = 0, batch = 64, epochs = 3, seed = 1, threads = 1, chunk_size = 1024, accumulate = 1;
  int64_t log_every = 100, connect_timeout_s = 60, train_limit = 0, test_limit = 0, leave_timeout_s = 30;
  int64_t eval_every = 0;
  double lr = 0.01, momentum = 0.9, weight_decay = 0, step_delay_factor = 1;
  bool no_eval = false;
  bool no_shm = false;

  leash::Flags flags("leash-worker", "Trains a model on Fashion-MNIST with a Leash cluster (or --local, alone).");
  flags.String("servers", &servers, "comma-separated shard endpoints in shard order, e.g. tcp://127.0.0.1:7000,tcp://127.0.0.1:7001");
  flags.Bool("local", &local, "train in this process with no server (the baseline)");
  flags.Int("staleness", &staleness, "staleness bound s: iteration c reads once every worker finished c-s-1 (0 = bulk-synchronous)");
  flags.Int("batch", &batch, "examples per step");
  flags.Double("lr", &lr, "learning rate");
  flags.String("optimizer", &optimizer, "server-side optimizer: sgd, momentum, adam or adagrad");
  flags.Double("momentum", &momentum, "momentum of the momentum optimizer");
  flags.Double("weight-decay", &weight_decay, "L2 weight decay");
  flags.Int("epochs", &epochs, "epochs of the job: passes over the training set by all workers together");
  flags.String("data", &data, "directory holding the Fashion-MNIST IDX files (Debian: dataset-fashion-mnist)");
  flags.Int("seed", &seed, "seed of parameter initialization and shuffling");
  flags.Int("threads", &threads, "BLAS threads");
  flags.Int("chunk-size", &chunk_size, "samples per data chunk leased from shard 0");
  flags.Int("accumulate", &accumulate, "micro-batches of --batch examples whose gradients are averaged into one push");
  flags.String("name", &name, "worker name in logs and status (default: host:pid)");
  flags.String("model", &model_name, "mlp (784-hidden-10) or cnn (conv32-pool-conv64-pool-dense128-dense10)");
  flags.String("hidden", &hidden, "hidden layer sizes of the MLP");
  flags.String("wire-dtype", &wire_dtype, "encoding of pushes and pulls on the wire: fp32, fp16 or bf16");
  flags.String("device", &device, "cpu, cuda:N or auto");
  flags.Int("log-every", &log_every, "steps between progress lines");
  flags.Int("connect-timeout", &connect_timeout_s, "seconds to wait for every shard to answer at start");
  flags.Int("leave-timeout", &leave_timeout_s, "seconds after SIGTERM/SIGINT to finish the step and leave before exiting anyway");
  flags.Int("train-limit", &train_limit, "use only the first N training samples (0: all)");
  flags.Int("test-limit", &test_limit, "evaluate on only the first N test samples (0: all)");
  flags.Double("step-delay-factor", &step_delay_factor,
               "straggler injection for benchmarks: sleep (factor-1) x each step's compute time (1: none)");
  flags.Bool("no-eval", &no_eval, "skip the test-set evaluation after each epoch");
  flags.Bool("no-shm", &no_shm, "send pushes and pulls through the socket even to a shard on this host (by default "
             "large ones go through shared memory there)");
  flags.Int("eval-every", &eval_every,
            "also evaluate on the test set (--test-limit) every N of this worker's iterations, between them, for a "
            "finer accuracy curve in --metrics-out's \"evaluations\"; not counted as training time (0: never)");
  flags.String("metrics-out", &metrics_out, "write per-epoch results as JSON to this file");
  flags.String("metrics-bind", &metrics_bind,
               "serve Prometheus metrics at http://HOST:PORT/metrics, e.g. 0.0.0.0:9100 (empty: no metrics)");
  flags.String("curve-keys", &curve_keys, "CURVE keys directory (leashctl keygen): encrypt and authenticate the "
               "connections with this client's key pair and DIR/server.pub");
  flags.String("curve-client", &curve_client, "name of this worker's key pair in --curve-keys (DIR/NAME.key)");
  flags.String("log-level", &log_level, "trace, debug, info, warn or error");
  if (auto st = flags.Parse(argc, argv); !st.ok()) {
    std::fprintf(stderr, "leash-worker: %s\n", st.message().c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  if (auto st = leash::InitLogging("worker", log_level); !st.ok()) {
    std::fprintf(stderr, "leash-worker: %s\n", st.message().c_str());
    return 2;
  }
  if (!local && servers.empty()) {
    spdlog::error("no shards given: set --servers (or LEASH_SERVERS), or use --local to train without a server");
    return 2;
  }
  leash::ZmqOptions zopts;
  zopts.shared_memory = !no_shm;
  if (!curve_keys.empty() && !local) {
    auto keys = leash::LoadCurveClientKeys(curve_keys, curve_client);
    if (!keys.ok()) {
      spdlog::error("--curve-keys: {}", keys.status().message());
      return 2;
    }
    zopts.curve = std::move(*keys);
    spdlog::info("CURVE security on: key pair '{}' from {}", curve_client, curve_keys);
  }
  if (batch < 1 || epochs < 1 || staleness < 0 || threads < 1 || chunk_size < 1 || accumulate < 1 || !(lr > 0) ||
      !(step_delay_factor >= 1 && step_delay_factor < 1e6)) {
    spdlog::error("bad flags: need --batch >= 1, --epochs >= 1, --staleness >= 0, --threads >= 1, --chunk-size >= 1, "
                  "--accumulate >= 1, --lr > 0 and 1 <= --step-delay-factor < 1e6");
    return 2;
  }
  if (eval_every < 0) {
    spdlog::error("--eval-every must be >= 0 (0: no evaluation within epochs), got {}", eval_every);
    return 2;
  }
  leash::worker::OptimizerOptions opt;
  if (auto kind = leash::ParseOptimizer(optimizer); kind.ok()) {
    opt.kind = *kind;
  } else {
    spdlog::error("unknown --optimizer '{}' (use sgd, momentum, adam or adagrad)", optimizer);
    return 2;
  }
  opt.learning_rate = static_cast<float>(lr);
  opt.momentum = static_cast<float>(momentum);
  opt.weight_decay = static_cast<float>(weight_decay);
  opt.seed = static_cast<uint64_t>(seed);
  auto dtype = leash::ParseDType(wire_dtype);
  if (!dtype.ok()) return Fail("--wire-dtype", dtype.status());
  std::vector<int64_t> hidden_sizes;
  for (const auto& h : leash::SplitList(hidden)) {
    char* end = nullptr;
    long v = std::strtol(h.c_str(), &end, 10);
    if (*end != '\0' || v < 1) {
      spdlog::error("--hidden '{}' is not a list of positive sizes", hidden);
      return 2;
    }
    hidden_sizes.push_back(v);
  }
  std::unique_ptr<leash::MetricsServer> metrics_server;
  if (!metrics_bind.empty()) {
    if (auto a = leash::ParseMetricsBind(metrics_bind); !a.ok()) {
      spdlog::error("{}", a.status().message());
      return 2;
    }
    auto m = leash::MetricsServer::Start(metrics_bind);
    if (!m.ok()) return Fail("metrics", m.status());
    metrics_server = std::move(*m);
  }
  if (name.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    name = std::string(host) + ":" + std::to_string(getpid());
  }

  auto dev = leash::kernels::ParseDevice(device);
  if (!dev.ok()) return Fail("--device", dev.status());
  auto ctx = leash::kernels::Context::Create(*dev, static_cast<int>(threads));
  if (!ctx.ok()) return Fail("cannot set up device " + device, ctx.status());
  if (device == "auto" && dev->type == leash::kernels::DeviceType::kCpu) {
    spdlog::info("--device auto: {}; computing on the CPU with {} BLAS thread(s)",
                 leash::kernels::CudaBuilt() ? "no usable GPU found" : "this build has no CUDA support", threads);
  } else {
    spdlog::info("computing on {}", leash::kernels::DeviceName(*dev));
  }

  spdlog::info("loading Fashion-MNIST from {}", data);
  auto train = leash::worker::LoadFashionMnist(data, true);
  if (!train.ok()) return Fail("training set", train.status());
  auto test = leash::worker::LoadFashionMnist(data, false);
  if (!test.ok()) return Fail("test set", test.status());
  if (train_limit < 0 || test_limit < 0) {
    spdlog::error("--train-limit and --test-limit must be >= 0");
    return 2;
  }
  train->Truncate(train_limit);
  test->Truncate(test_limit);
  if (model_name != "mlp" && model_name != "cnn") {
    spdlog::error("unknown --model '{}' (use mlp or cnn)", model_name);
    return 2;
  }
  auto model = model_name == "cnn" ? leash::worker::MakeCnn(**ctx, batch)
                                   : leash::worker::MakeMlp(**ctx, train->features(), hidden_sizes, 10, batch);
  if (!model.ok()) return Fail("model", model.status());

  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  std::atomic<bool> done{false};
  std::thread watchdog(LeaveWatchdog, std::max<int64_t>(1, leave_timeout_s), &done);
  struct JoinWatchdog {
    std::atomic<bool>& done;
    std::thread& t;
    ~JoinWatchdog() {
      done.store(true);
      t.join();
    }
  } join_watchdog{done, watchdog};

  leash::ZmqContext zctx;
  std::unique_ptr<leash::Client> client;
  std::unique_ptr<leash::worker::ParamStore> params;
  if (local) {
    params = leash::worker::MakeLocalParams();
  } else {
    auto transport = leash::ConnectZmqClient(zctx, leash::SplitList(servers), zopts);
    if (!transport.ok()) return Fail("--servers", transport.status());
    leash::ClientOptions co;
    co.name = name;
    co.staleness = staleness;
    co.wire_dtype = *dtype;
    co.connect_timeout_ms = connect_timeout_s * 1000;
    auto c = leash::Client::Connect(std::move(*transport), co);
    if (!c.ok()) return Fail("cannot join the cluster", c.status());
    client = std::move(*c);
    params = leash::worker::MakeRemoteParams(client.get(), staleness);
  }
  if (auto st = params->Setup((*model)->params(), opt); !st.ok()) return Fail("creating tables", st);

  leash::worker::TrainOptions to;
  to.epochs = epochs;
  to.batch = batch;
  to.chunk_size = chunk_size;
  to.accumulate = accumulate;
  to.seed = static_cast<uint64_t>(seed);
  to.log_every = log_every;
  to.evaluate = !no_eval;
  to.eval_every = eval_every;
  to.step_delay_factor = step_delay_factor;
  if (step_delay_factor > 1) spdlog::warn("--step-delay-factor {}: this worker sleeps to compute {}x slower", step_delay_factor, step_delay_factor);
  to.label = local ? "[local]" : "[" + name + "]";
  std::unique_ptr<leash::worker::WorkerMetrics> metrics;
  if (metrics_server) {
    metrics = std::make_unique<leash::worker::WorkerMetrics>(metrics_server->registry(), name, staleness, client.get());
    to.on_step = [&](const leash::worker::StepReport& r) { metrics->OnStep(r); };
    to.on_epoch = [&](const leash::worker::EpochResult& r) { metrics->OnEpoch(r); };
    spdlog::info("metrics on {}", metrics_server->url());
  }
  spdlog::info("training {} on {} samples in chunks of {}, batch {}, staleness {}, {} lr {}, {} on the wire",
               model_name == "cnn" ? std::string("CNN") : "MLP " + hidden, train->count, chunk_size, batch, staleness, optimizer, lr, leash::DTypeName(*dtype));
  auto results = leash::worker::Train(**model, *params, *train, &*test, to, &g_stop);
  leash::Status finish = params->Finish();
  if (!results.ok()) return Fail("training failed", results.status());
  if (!finish.ok()) spdlog::warn("leaving the job: {}", finish.ToString());
  std::vector<std::pair<std::string, double>> extra = {
      {"compute_seconds", results->compute_seconds},
      {"injected_delay_seconds", results->injected_delay_seconds},
      {"step_delay_factor", step_delay_factor}};
  if (client) {
    auto c = client->counters();
    double iters = static_cast<double>(std::max<int64_t>(1, results->iterations));
    double sent = static_cast<double>(c.bytes_sent) / iters, received = static_cast<double>(c.bytes_received) / iters;
    extra.push_back({"bytes_sent_per_iteration", sent});
    extra.push_back({"bytes_received_per_iteration", received});
    extra.push_back({"shared_memory_shards", c.shared_memory_shards});
    spdlog::info("wire ({}): {} requests, {:.1f} MB sent, {:.1f} MB received, {} resent; per iteration {:.1f} KB sent, "
                 "{:.1f} KB received; {} of {} shard(s) reached through shared memory",
                 leash::DTypeName(*dtype), c.requests, c.bytes_sent / 1e6, c.bytes_received / 1e6, c.resends,
                 sent / 1e3, received / 1e3, c.shared_memory_shards, client->num_shards());
  }
  const auto& epochs_done = results->epochs;
  std::printf("%s trained %lld chunks%s\n", to.label.c_str(), static_cast<long long>(results->chunks_trained),
              results->rejoins > 0 ? (", rejoined " + std::to_string(results->rejoins) + " time(s)").c_str() : "");
  if (!epochs_done.empty() && epochs_done.back().test_accuracy >= 0) {
    std::printf("%s final test accuracy %.2f%%\n", to.label.c_str(), epochs_done.back().test_accuracy * 100);
  }
  if (!metrics_out.empty()) {
    if (auto st = leash::worker::WriteResultsJson(metrics_out, local ? "local" : "cluster", to, *results, extra);
        !st.ok()) {
      return Fail("metrics", st);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }

// Real multi-process clusters for integration and fault tests.
#include "support/cluster.h"

namespace leash::testing {

Cluster::Cluster(int n, std::string dir, std::vector<std::string> extra)
    : dir_(std::move(dir)), extra_(std::move(extra)) {
  for (int i = 0; i < n; ++i) endpoints_.push_back(Endpoint(FreePort()));
  shards_.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) Start(i);
}

void Cluster::Start(int i, const std::vector<std::string>& more) {
  std::vector<std::string> argv = {LEASH_SERVER_BIN,
                                   "--shard=" + std::to_string(i),
                                   "--num-shards=" + std::to_string(endpoints_.size()),
                                   "--bind=" + endpoints_[static_cast<size_t>(i)],
                                   "--data-dir=" + dir_ + "/shard" + std::to_string(i),
                                   "--checkpoint-interval=0",
                                   "--no-sync"};
  argv.insert(argv.end(), extra_.begin(), extra_.end());  // later flags win
  argv.insert(argv.end(), more.begin(), more.end());
  shards_[static_cast<size_t>(i)].reset();
  shards_[static_cast<size_t>(i)] =
      std::make_unique<Process>(argv, dir_ + "/shard" + std::to_string(i) + ".log");
}

std::string Cluster::servers() const {
  std::string s;
  for (const auto& e : endpoints_) s += (s.empty() ? "" : ",") + e;
  return s;
}

std::unique_ptr<Client> Cluster::Connect(const std::string& name, bool register_worker,
                                         const ZmqOptions& zmq) {
  auto t = ConnectZmqClient(ctx_, endpoints_, zmq);
  if (!t.ok()) return nullptr;
  ClientOptions o;
  o.name = name;
  o.register_worker = register_worker;
  o.connect_timeout_ms = 20000;
  auto c = Client::Connect(std::move(*t), o);
  return c.ok() ? std::move(*c) : nullptr;
}

Result<std::vector<ShardStats>> Cluster::Stats() {
  if (!observer_) observer_ = Connect("observer", false);
  if (!observer_) return Unavailable("cannot reach the cluster");
  return observer_->Stats();
}

std::unique_ptr<Process> Cluster::StartWorker(const std::string& name,
                                              std::vector<std::string> flags) {
  std::vector<std::string> argv = {LEASH_WORKER_BIN, "--servers=" + servers(), "--name=" + name,
                                   "--metrics-out=" + WorkerMetrics(name)};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return std::make_unique<Process>(argv, dir_ + "/" + name + ".log");
}

TableSpec Sgd1(const std::string& name, uint64_t rows, uint32_t cols) {
  TableSpec t;
  t.name = name;
  t.rows = rows;
  t.cols = cols;
  t.optimizer.kind = OptimizerKind::kSgd;
  t.optimizer.lr = 1.f;
  return t;
}

int64_t CountInFinalLog(const std::string& log, const std::string& what) {
  auto last = log.rfind("stopped cleanly");
  if (last == std::string::npos) return -1;
  std::string line = log.substr(last, log.find('\n', last) - last);
  auto at = line.find(" " + what);
  if (at == std::string::npos) return -1;
  auto start = line.find_last_not_of("0123456789", at - 1) + 1;
  if (start >= at) return -1;
  return std::stoll(line.substr(start, at - start));
}

}  // namespace leash::testing

// Replicated shards coordinated through etcd, as real processes (replicated_cluster.h).
#include "support/replicated_cluster.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "leash/common/curve_keys.h"
#include "leash/common/etcd_coordinator.h"

namespace leash::testing {

ReplicatedCluster::ReplicatedCluster(Options options) : options_(std::move(options)) {
  const int n = options_.num_shards * options_.replicas;
  if (options_.endpoints.empty()) {
    for (int i = 0; i < n; ++i) options_.endpoints.push_back(Endpoint(FreePort()));
  }
  if (static_cast<int>(options_.endpoints.size()) != n) {
    throw std::invalid_argument("ReplicatedCluster: need one endpoint per replica");
  }
  EtcdOptions o;
  o.endpoints = {options_.etcd};
  o.job = options_.job;
  auto d = NewEtcdShardDirectory(o);
  if (!d.ok()) throw std::runtime_error(d.status().ToString());
  directory_ = std::move(*d);
  replicas_.resize(static_cast<size_t>(n));
  for (int s = 0; s < options_.num_shards; ++s) {
    for (int r = 0; r < options_.replicas; ++r) Start(s, r);
  }
}

ReplicatedCluster::~ReplicatedCluster() {
  for (auto& r : replicas_) {
    if (r) r->Kill();
  }
}

void ReplicatedCluster::Start(int s, int r, bool without_keys) {
  std::string peers;
  for (int i = 0; i < options_.replicas; ++i) peers += (i ? "," : "") + endpoint(s, i);
  const std::string name = "shard" + std::to_string(s) + "-r" + std::to_string(r);
  std::vector<std::string> argv = {LEASH_SERVER_BIN,
                                   "--shard=" + std::to_string(s),
                                   "--num-shards=" + std::to_string(options_.num_shards),
                                   "--bind=" + endpoint(s, r),
                                   "--data-dir=" + options_.dir + "/" + name,
                                   "--replicas=" + std::to_string(options_.replicas),
                                   "--replica=" + std::to_string(r),
                                   "--peers=" + peers,
                                   "--etcd=" + options_.etcd,
                                   "--job=" + options_.job,
                                   "--etcd-ttl=" + std::to_string(options_.etcd_ttl_s),
                                   "--no-sync"};
  if (!options_.curve_keys.empty() && !without_keys) {
    argv.push_back("--curve-keys=" + options_.curve_keys);
  } else {
    argv.push_back("--insecure");
  }
  argv.insert(argv.end(), options_.extra.begin(), options_.extra.end());
  if (options_.on_host) argv = options_.on_host(s, r, std::move(argv));
  auto& slot = replicas_[Index(s, r)];
  slot.reset();  // killed (if still running) before its port is bound again
  slot = std::make_unique<Process>(std::move(argv), options_.dir + "/" + name + ".log");
}

std::optional<ShardView> ReplicatedCluster::View(int s) {
  auto v = directory_->View();
  if (!v.ok() || static_cast<int>(v->shards.size()) <= s) return std::nullopt;
  return v->shards[static_cast<size_t>(s)];
}

int ReplicatedCluster::Primary(int s) {
  auto v = View(s);
  return v && v->primary ? static_cast<int>(v->primary->replica) : -1;
}

int ReplicatedCluster::InSync(int s) {
  auto v = View(s);
  return v && v->primary ? static_cast<int>(v->in_sync.size()) : -1;
}

bool ReplicatedCluster::AllInSync() {
  auto v = directory_->View();
  if (!v.ok() || static_cast<int>(v->shards.size()) != options_.num_shards) return false;
  for (const ShardView& s : v->shards) {
    if (!s.primary || static_cast<int>(s.in_sync.size()) != options_.replicas) return false;
  }
  return true;
}

int ReplicatedCluster::KillPrimary(int s) {
  const int r = Primary(s);
  EXPECT_GE(r, 0) << "shard " << s << " has no primary";
  if (r >= 0) replica(s, r).Kill();
  return r;
}

std::unique_ptr<Client> ReplicatedCluster::Follower(const std::string& name, bool register_worker,
                                                    bool shared_memory) {
  auto view = ResolvePrimaries(*directory_, 30000);
  EXPECT_TRUE(view.ok()) << view.status();
  if (!view.ok()) return nullptr;
  ZmqOptions zo;
  zo.shared_memory = shared_memory;
  if (!options_.curve_keys.empty()) {
    auto keys = LoadCurveClientKeys(options_.curve_keys, "client");
    EXPECT_TRUE(keys.ok()) << keys.status();
    if (!keys.ok()) return nullptr;
    zo.curve = std::move(*keys);
  }
  auto t = ConnectZmqClient(ctx_, PrimaryEndpoints(*view), zo);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return nullptr;
  ClientOptions o;
  o.name = name;
  o.register_worker = register_worker;
  o.directory = directory_;
  o.directory_view = *view;
  auto c = Client::Connect(std::move(*t), o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

std::unique_ptr<Process> ReplicatedCluster::StartWorker(const std::string& name,
                                                        std::vector<std::string> flags) {
  std::vector<std::string> argv = {LEASH_WORKER_BIN, "--etcd=" + options_.etcd,
                                   "--job=" + options_.job, "--name=" + name,
                                   "--metrics-out=" + options_.dir + "/" + name + ".json"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return std::make_unique<Process>(argv, options_.dir + "/" + name + ".log");
}

std::string ReplicatedCluster::Logs() {
  std::string out;
  for (int s = 0; s < options_.num_shards; ++s) {
    for (int r = 0; r < options_.replicas; ++r) {
      if (replicas_[Index(s, r)]) {
        out += "--- shard " + std::to_string(s) + " replica " + std::to_string(r) + "\n" +
               replica(s, r).ReadLog();
      }
    }
  }
  return out;
}

}  // namespace leash::testing

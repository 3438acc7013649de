// Test support: real shards on an in-memory network; see memory_cluster.h.
#include "support/memory_cluster.h"

#include <spdlog/spdlog.h>

namespace leash::testing {
namespace {

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

MemoryCluster::MemoryCluster(int shards, server::ShardOptions options, uint64_t seed)
    : network_(seed) {
  for (int i = 0; i < shards; ++i) {
    auto node = std::make_unique<Node>();
    node->options = options;
    node->options.shard = static_cast<uint32_t>(i);
    node->options.num_shards = static_cast<uint32_t>(shards);
    shards_.push_back(std::move(node));
    Start(i);
  }
}

MemoryCluster::~MemoryCluster() {
  for (int i = 0; i < size(); ++i) Stop(i);
}

Result<std::unique_ptr<Client>> MemoryCluster::Connect(ClientOptions options) {
  std::vector<std::string> addresses;
  for (int i = 0; i < size(); ++i) addresses.push_back(Address(i));
  return Client::Connect(network_.Connect(addresses), std::move(options));
}

void MemoryCluster::Start(int i) {
  Node& n = *shards_.at(static_cast<size_t>(i));
  if (n.thread.joinable()) return;
  n.options.boot_id = 0;  // a new one for every start
  Node* node = &n;
  n.shard = std::make_unique<server::Shard>(n.options, &n.store,
                                            [node] { return SteadyMs() + node->skew_ms.load(); });
  auto recovered = n.shard->Recover();
  if (!recovered.ok())
    spdlog::error("shard {} did not recover: {}", i, recovered.status().ToString());
  n.transport = network_.Bind(Address(i));
  n.stop.store(false);
  n.thread = std::thread([node, i] {
    Status st =
        server::Serve(*node->shard, *node->transport, node->stop, [node](const server::Shard& s) {
          std::lock_guard<std::mutex> lock(node->view_mu);
          node->view.counters = s.counters();
          node->view.min_clock = s.min_clock();
          node->view.parked_pulls = s.parked_pulls();
          node->view.live_workers = s.live_workers();
        });
    if (!st.ok()) spdlog::error("shard {} stopped: {}", i, st.ToString());
  });
}

void MemoryCluster::Stop(int i) {
  Node& n = *shards_.at(static_cast<size_t>(i));
  if (!n.thread.joinable()) return;
  n.stop.store(true);
  n.transport->Wake();
  n.thread.join();
  n.transport.reset();
  n.shard.reset();
}

void MemoryCluster::Advance(int i, int64_t ms) {
  shards_.at(static_cast<size_t>(i))->skew_ms += ms;
}

MemoryCluster::View MemoryCluster::view(int i) {
  Node& n = *shards_.at(static_cast<size_t>(i));
  std::lock_guard<std::mutex> lock(n.view_mu);
  return n.view;
}

bool MemoryCluster::AdvanceUntil(int i, int64_t step_ms,
                                 const std::function<bool(const View&)>& condition,
                                 std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  do {
    Advance(i, step_ms);
    if (WaitFor(i, condition, std::chrono::milliseconds(50))) return true;
  } while (std::chrono::steady_clock::now() < deadline);
  return false;
}

bool MemoryCluster::WaitFor(int i, const std::function<bool(const View&)>& condition,
                            std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition(view(i))) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

}  // namespace leash::testing

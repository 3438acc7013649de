// Test support: the in-memory network of transports; see memory_transport.h.
#include "support/memory_transport.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>

namespace leash::testing {
namespace {

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// Messages waiting for one endpoint, by (due time, arrival order).
struct Inbox {
  struct Item {
    std::string address;  // the shard's
    PeerId peer;          // the client connection's
    int shard = 0;
    Message message;
    std::string user;  // the sending client's (to a shard)
  };
  std::multimap<std::pair<int64_t, uint64_t>, Item> items;
  std::condition_variable cv;
  bool woken = false;
};

struct MemoryNetwork::State {
  std::mutex mu;
  std::mt19937_64 random;
  std::vector<Rule> rules;
  std::map<std::pair<Direction, std::string>, Faults> faults;
  NetworkStats stats;
  uint64_t next_seq = 0;
  uint64_t next_peer = 0;
  std::map<std::string, Inbox*> servers;  // bound endpoints by address
  std::map<PeerId, Inbox*> clients;       // open connections by peer id

  const Faults& FaultsFor(Direction d, const std::string& address) {
    static const Faults kNone;
    if (auto it = faults.find({d, address}); it != faults.end()) return it->second;
    if (auto it = faults.find({d, ""}); it != faults.end()) return it->second;
    return kNone;
  }

  // Decides the packet's fate and queues its copies of `item` (whose message `packet`
  // shows the rules) in `to` (nullptr: nobody is there). Under mu.
  void Route(const Packet& packet, Inbox* to, Inbox::Item&& item) {
    ++stats.sent;
    if (to == nullptr) {
      ++stats.dropped;
      return;
    }
    std::optional<Verdict> verdict;
    for (const Rule& rule : rules) {
      verdict = rule(packet);
      if (verdict) break;
    }
    if (!verdict) {
      const Faults& f = FaultsFor(packet.direction, packet.address);
      std::uniform_real_distribution<double> coin(0, 1);
      verdict = Verdict{};
      if (f.drop > 0 && coin(random) < f.drop) {
        verdict->kind = Verdict::kDrop;
      } else if (f.duplicate > 0 && coin(random) < f.duplicate) {
        verdict->kind = Verdict::kDuplicate;
      }
      verdict->delay_ms = f.delay_ms;
      if (f.jitter_ms > 0) {
        verdict->delay_ms += std::uniform_int_distribution<int64_t>(0, f.jitter_ms)(random);
      }
    }
    if (verdict->kind == Verdict::kDrop) {
      ++stats.dropped;
      return;
    }
    int64_t due = NowUs() + verdict->delay_ms * 1000;
    if (verdict->kind == Verdict::kDuplicate) {
      ++stats.duplicated;
      to->items.emplace(std::make_pair(due, next_seq++), item);
    }
    to->items.emplace(std::make_pair(due, next_seq++), std::move(item));
    to->cv.notify_all();
  }

  // Drops what waits in `inbox` and matches `which`. Under mu.
  template <typename Pred>
  void Purge(Inbox& inbox, Pred which) {
    for (auto it = inbox.items.begin(); it != inbox.items.end();) {
      if (which(it->first.first, it->second)) {
        ++stats.dropped;
        it = inbox.items.erase(it);
      } else {
        ++it;
      }
    }
  }

  // The next message for `inbox` within `timeout`; nullopt on timeout or a wake.
  std::optional<Inbox::Item> Take(Inbox& inbox, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    const int64_t deadline = NowUs() + timeout.count() * 1000;
    while (true) {
      int64_t now = NowUs();
      if (!inbox.items.empty() && inbox.items.begin()->first.first <= now) {
        Inbox::Item item = std::move(inbox.items.begin()->second);
        inbox.items.erase(inbox.items.begin());
        ++stats.delivered;
        return item;
      }
      if (timeout.count() <= 0) return std::nullopt;
      if (inbox.woken) {
        inbox.woken = false;
        return std::nullopt;
      }
      if (now >= deadline) return std::nullopt;
      int64_t until = deadline;
      if (!inbox.items.empty()) until = std::min(until, inbox.items.begin()->first.first);
      inbox.cv.wait_for(lock, std::chrono::microseconds(until - now));
    }
  }

  void Wake(Inbox& inbox) {
    std::lock_guard<std::mutex> lock(mu);
    inbox.woken = true;
    inbox.cv.notify_all();
  }
};

namespace {

using State = MemoryNetwork::State;

class MemoryServer final : public ServerTransport {
 public:
  MemoryServer(std::shared_ptr<State> state, std::string address)
      : state_(std::move(state)), address_(std::move(address)) {}

  ~MemoryServer() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->servers.erase(address_);
    state_->Purge(inbox_, [](int64_t, const Inbox::Item&) { return true; });
    // What this shard sent that has not arrived yet dies with it.
    int64_t now = NowUs();
    for (auto& [peer, inbox] : state_->clients) {
      state_->Purge(*inbox, [&](int64_t due, const Inbox::Item& item) {
        return due > now && item.address == address_;
      });
    }
  }

  Inbox* inbox() { return &inbox_; }

  Result<std::optional<Inbound>> Receive(std::chrono::milliseconds timeout) override {
    std::optional<Inbox::Item> item = state_->Take(inbox_, timeout);
    if (!item) return std::optional<Inbound>();
    return std::optional<Inbound>(
        Inbound{std::move(item->peer), std::move(item->message), std::move(item->user)});
  }

  Status Send(const PeerId& peer, Message message) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->clients.find(peer);
    Inbox* to = it == state_->clients.end() ? nullptr : it->second;
    Inbox::Item item{address_, peer, to == nullptr ? 0 : ShardOf(peer), std::move(message), {}};
    Packet packet{Direction::kToClient, address_, peer, &item.message};
    state_->Route(packet, to, std::move(item));
    return Status::Ok();
  }

  void Wake() override { state_->Wake(inbox_); }

 private:
  static int ShardOf(const PeerId& peer) {
    // Peer ids are "client-<n>/<shard>".
    return std::stoi(peer.substr(peer.rfind('/') + 1));
  }

  std::shared_ptr<State> state_;
  std::string address_;
  Inbox inbox_;
};

class MemoryClient final : public ClientTransport {
 public:
  MemoryClient(std::shared_ptr<State> state, std::vector<std::string> addresses, std::string user)
      : state_(std::move(state)), addresses_(std::move(addresses)), user_(std::move(user)) {
    std::lock_guard<std::mutex> lock(state_->mu);
    client_ = state_->next_peer++;
    peers_.resize(addresses_.size());
    backup_peers_.resize(addresses_.size());
    backup_addresses_.resize(addresses_.size());
    for (size_t i = 0; i < addresses_.size(); ++i) Open(i);
  }

  ~MemoryClient() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    for (const PeerId& p : peers_) state_->clients.erase(p);
    for (const PeerId& p : backup_peers_) {
      if (!p.empty()) state_->clients.erase(p);
    }
  }

  int num_shards() const override { return static_cast<int>(addresses_.size()); }

  Status Send(int shard, Message message) override {
    auto i = static_cast<size_t>(shard);
    std::lock_guard<std::mutex> lock(state_->mu);
    if (i >= addresses_.size()) return SendToBackup(i - addresses_.size(), std::move(message));
    auto it = state_->servers.find(addresses_.at(i));
    Inbox* to = it == state_->servers.end() ? nullptr : it->second;
    Inbox::Item item{addresses_[i], peers_[i], shard, std::move(message), user_};
    Packet packet{Direction::kToShard, addresses_[i], peers_[i], &item.message};
    state_->Route(packet, to, std::move(item));
    return Status::Ok();
  }

  Result<std::optional<std::pair<int, Message>>> Receive(
      std::chrono::milliseconds timeout) override {
    std::optional<Inbox::Item> item = state_->Take(inbox_, timeout);
    if (!item) return std::optional<std::pair<int, Message>>();
    return std::optional<std::pair<int, Message>>(
        std::make_pair(item->shard, std::move(item->message)));
  }

  void Wake() override { state_->Wake(inbox_); }

  Status Reconnect(int shard) override {
    auto i = static_cast<size_t>(shard);
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->clients.erase(peers_.at(i));
    state_->Purge(inbox_, [&](int64_t, const Inbox::Item& item) { return item.peer == peers_[i]; });
    Open(i);
    return Status::Ok();
  }

  Status Retarget(int shard, const std::string& endpoint) override {
    auto i = static_cast<size_t>(shard);
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->clients.erase(peers_.at(i));
    state_->Purge(inbox_, [&](int64_t, const Inbox::Item& item) { return item.peer == peers_[i]; });
    addresses_[i] = endpoint;
    Open(i);
    return Status::Ok();
  }

  // Backup b's connection is peer "client-<n>.<k>/<num_shards + b>": what its shard sends
  // to it comes out of Receive as num_shards + b.
  Status ConnectBackup(int shard, const std::string& endpoint) override {
    if (shard < 0 || static_cast<size_t>(shard) >= addresses_.size()) {
      return InvalidArgument("no shard " + std::to_string(shard) + " to connect a backup of");
    }
    auto b = static_cast<size_t>(shard);
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!backup_peers_[b].empty()) {
      const PeerId old = backup_peers_[b];
      state_->clients.erase(old);
      state_->Purge(inbox_, [&](int64_t, const Inbox::Item& item) { return item.peer == old; });
      backup_peers_[b].clear();
    }
    backup_addresses_[b] = endpoint;
    if (endpoint.empty()) return Status::Ok();
    backup_peers_[b] = "client-" + std::to_string(client_) + "." + std::to_string(++opened_) + "/" +
                       std::to_string(addresses_.size() + b);
    state_->clients[backup_peers_[b]] = &inbox_;
    return Status::Ok();
  }

 private:
  // Send to backup connection b. Under mu.
  Status SendToBackup(size_t b, Message message) {
    if (b >= backup_peers_.size()) {
      return InvalidArgument("no shard " + std::to_string(b) + " to send to its backup");
    }
    if (backup_peers_[b].empty()) {
      return Unavailable("no connection to shard " + std::to_string(b) + "'s backup");
    }
    const std::string& address = backup_addresses_[b];
    auto it = state_->servers.find(address);
    Inbox* to = it == state_->servers.end() ? nullptr : it->second;
    Inbox::Item item{address, backup_peers_[b], static_cast<int>(addresses_.size() + b),
                     std::move(message), user_};
    Packet packet{Direction::kToShard, address, backup_peers_[b], &item.message};
    state_->Route(packet, to, std::move(item));
    return Status::Ok();
  }

  // A new peer id for connection i. Under mu.
  void Open(size_t i) {
    peers_[i] = "client-" + std::to_string(client_) + "." + std::to_string(++opened_) + "/" +
                std::to_string(i);
    state_->clients[peers_[i]] = &inbox_;
  }

  std::shared_ptr<State> state_;
  std::vector<std::string> addresses_;
  std::string user_;
  uint64_t client_ = 0;
  uint64_t opened_ = 0;
  std::vector<PeerId> peers_;  // under state_->mu
  // Per shard, its backup connection's peer id ("" while none is open) and address. Under
  // state_->mu.
  std::vector<PeerId> backup_peers_;
  std::vector<std::string> backup_addresses_;
  Inbox inbox_;
};

}  // namespace

MemoryNetwork::MemoryNetwork(uint64_t seed) : state_(std::make_shared<State>()) {
  state_->random.seed(seed);
}

MemoryNetwork::~MemoryNetwork() = default;

std::unique_ptr<ServerTransport> MemoryNetwork::Bind(const std::string& address) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->servers.count(address) != 0) return nullptr;
  auto server = std::make_unique<MemoryServer>(state_, address);
  state_->servers[address] = server->inbox();
  return server;
}

std::unique_ptr<ClientTransport> MemoryNetwork::Connect(const std::vector<std::string>& addresses,
                                                        const std::string& user) {
  return std::make_unique<MemoryClient>(state_, addresses, user);
}

void MemoryNetwork::SetFaults(Direction direction, const std::string& address, Faults faults) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->faults[{direction, address}] = faults;
}

void MemoryNetwork::AddRule(Rule rule) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->rules.push_back(std::move(rule));
}

void MemoryNetwork::ClearRules() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->rules.clear();
}

NetworkStats MemoryNetwork::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stats;
}

}  // namespace leash::testing

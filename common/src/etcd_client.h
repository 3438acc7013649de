// A small typed client of etcd's v3 JSON gateway (etcd 3.4: POST /v3/kv/*, /v3/lease/*,
// /v3/watch) over libcurl and nlohmann-json; the one adapter that turns etcd's and libcurl's
// errors into Status. Private to leash_etcd (EtcdCoordinator, EtcdShardDirectory) and its
// tests. Thread-safe: every method may be called from any thread at once (each call takes
// its own libcurl handle from a small pool, which keeps connections to etcd open).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "leash/common/status.h"

namespace leash::etcd {

// One key as etcd stores it (mvccpb.KeyValue); revisions are etcd's store revisions.
struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct RangeResult {
  int64_t revision = 0;  // the store revision the read saw
  std::vector<KeyValue> kvs;
};

// A comparison of a transaction (etcdserverpb.Compare). A missing key has create and mod
// revision 0 and no value (a value comparison on it fails).
struct Compare {
  enum class Target { kCreateRevision, kModRevision, kValue };
  enum class Op { kEqual, kNotEqual };
  std::string key;
  Target target = Target::kValue;
  Op op = Op::kEqual;
  int64_t revision = 0;
  std::string value;

  static Compare CreateRevision(std::string key, int64_t revision, Op op = Op::kEqual);
  static Compare ModRevision(std::string key, int64_t revision, Op op = Op::kEqual);
  static Compare Value(std::string key, std::string value, Op op = Op::kEqual);
};

// One operation of a transaction's branch.
struct Operation {
  enum class Kind { kPut, kDelete, kRange };
  Kind kind = Kind::kPut;
  std::string key;
  std::string value;    // kPut
  int64_t lease = 0;    // kPut: bind the key to this lease (0: none)
  bool prefix = false;  // kDelete, kRange: every key starting with `key`

  static Operation Put(std::string key, std::string value, int64_t lease = 0);
  static Operation Delete(std::string key, bool prefix = false);
  static Operation Range(std::string key, bool prefix = false);
};

struct TxnResult {
  bool succeeded = false;
  int64_t revision = 0;
  std::vector<RangeResult> ranges;  // the results of the branch's kRange operations, in order
};

struct Lease {
  int64_t id = 0;
  std::chrono::seconds ttl{0};  // as granted (etcd raises TTLs below its minimum)
};

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;
};

struct WatchResult {
  int64_t revision = 0;  // the store revision of the last message received (0 if none)
  std::vector<WatchEvent> events;
  // The start revision was compacted away: the watch saw nothing and the caller must
  // read again (compact_revision is the oldest revision still kept).
  bool compacted = false;
  int64_t compact_revision = 0;
};

struct ClientOptions {
  // "http://host:port" each; tried in order, starting from the last one that answered.
  std::vector<std::string> endpoints;
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds request_timeout{2000};  // of each unary request
};

class Client {
 public:
  // Checks the endpoints (non-empty, each "http://host:port" or "https://..."); contacts
  // nothing.
  static Result<std::unique_ptr<Client>> Create(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The key `key`, or with `prefix` every key starting with it, in key order.
  Result<RangeResult> Range(const std::string& key, bool prefix = false);
  // Returns the store revision of the write. NotFound if `lease` is not a live lease.
  Result<int64_t> Put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Returns the number of keys deleted.
  Result<int64_t> Delete(const std::string& key, bool prefix = false);
  // If every comparison holds, applies `success`, otherwise `failure`, atomically.
  Result<TxnResult> Txn(const std::vector<Compare>& compares, const std::vector<Operation>& success,
                        const std::vector<Operation>& failure);

  Result<Lease> LeaseGrant(std::chrono::seconds ttl);
  // Renews `id` once; returns its TTL in seconds, 0 if the lease has expired or was revoked.
  Result<int64_t> LeaseKeepAlive(int64_t id);
  // Revokes `id` and deletes its keys; OK if it had expired already.
  Status LeaseRevoke(int64_t id);

  // Watches every key starting with `prefix` from `start_revision` (inclusive) until the
  // first events arrive, `timeout` passes or `*cancel` turns true (polled at least once a
  // second); returns the events (none on timeout or cancellation). Unavailable if etcd
  // cannot be reached or closes the watch.
  Result<WatchResult> Watch(const std::string& prefix, int64_t start_revision,
                            std::chrono::milliseconds timeout,
                            const std::atomic<bool>* cancel = nullptr);
  // The same watch kept open: calls `on_response` with each message etcd sends (its
  // creation first, then each batch of events; `revision` is the message's store revision,
  // up to which every change is reported) until `timeout` passes, `*cancel` turns true,
  // `on_response` returns false, or etcd reports the start revision compacted (one last
  // call with `compacted` set). Ok in all those cases; Unavailable if etcd cannot be
  // reached or closes the watch.
  Status WatchStream(const std::string& prefix, int64_t start_revision,
                     std::chrono::milliseconds timeout, const std::atomic<bool>* cancel,
                     const std::function<bool(const WatchResult&)>& on_response);

  // "http://a:2379,http://b:2379", for messages.
  std::string EndpointsString() const;

 private:
  struct Handle;
  // What one POST brought back.
  struct Response {
    std::string body;        // unary answers only
    bool timed_out = false;  // a streamed answer reached its timeout
    bool cancelled = false;  // *cancel turned true
    std::string endpoint;    // who answered
  };
  explicit Client(ClientOptions options);

  // POSTs `body` (JSON) to `path` on the endpoints in turn (moving on only when one cannot
  // be connected to, so that no write is applied twice). `on_line` receives each
  // newline-terminated message of a streamed answer and returns false to end the transfer;
  // without it the whole body is returned.
  Result<Response> Post(std::string_view path, const std::string& body,
                        std::chrono::milliseconds timeout,
                        const std::function<bool(std::string_view)>* on_line = nullptr,
                        const std::atomic<bool>* cancel = nullptr);
  std::unique_ptr<Handle> Acquire();
  void Release(std::unique_ptr<Handle> handle);

  ClientOptions options_;
  std::atomic<size_t> preferred_{0};  // index of the endpoint that answered last
  std::mutex mu_;
  std::vector<std::unique_ptr<Handle>> idle_;  // guarded by mu_
};

// Base64 (etcd's JSON encoding of bytes), through OpenSSL.
std::string Base64Encode(std::string_view bytes);
Result<std::string> Base64Decode(std::string_view text);
// The smallest key greater than every key starting with `prefix` (etcd's range_end).
std::string PrefixEnd(std::string_view prefix);

}  // namespace leash::etcd

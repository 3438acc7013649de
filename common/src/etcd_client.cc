// The etcd v3 JSON gateway client (etcd_client.h): requests as JSON (keys and values in
// base64, 64-bit integers as strings), POSTed with libcurl; etcd's and libcurl's errors
// become Status here and nowhere else. Thread-safe (a mutex guards the pool of handles).
#include "etcd_client.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <charconv>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>

namespace leash::etcd {
namespace {

using json = nlohmann::json;

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// etcd writes int64 fields as JSON strings and leaves out zero values.
int64_t Int(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    std::from_chars(s.data(), s.data() + s.size(), v);
    return v;
  }
  return 0;
}

std::string Str(const json& j, const char* field) {
  auto it = j.find(field);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool Bool(const json& j, const char* field) {
  auto it = j.find(field);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

Result<KeyValue> ParseKv(const json& j) {
  KeyValue kv;
  LEASH_ASSIGN_OR_RETURN(kv.key, Base64Decode(Str(j, "key")));
  LEASH_ASSIGN_OR_RETURN(kv.value, Base64Decode(Str(j, "value")));
  kv.create_revision = Int(j, "create_revision");
  kv.mod_revision = Int(j, "mod_revision");
  kv.version = Int(j, "version");
  kv.lease = Int(j, "lease");
  return kv;
}

Result<RangeResult> ParseRange(const json& j) {
  RangeResult r;
  if (auto h = j.find("header"); h != j.end()) r.revision = Int(*h, "revision");
  if (auto kvs = j.find("kvs"); kvs != j.end() && kvs->is_array()) {
    for (const json& e : *kvs) {
      LEASH_ASSIGN_OR_RETURN(KeyValue kv, ParseKv(e));
      r.kvs.push_back(std::move(kv));
    }
  }
  return r;
}

json KeyRange(const std::string& key, bool prefix) {
  json j = {{"key", Base64Encode(key)}};
  if (prefix) j["range_end"] = Base64Encode(PrefixEnd(key));
  return j;
}

json OperationJson(const Operation& op) {
  switch (op.kind) {
    case Operation::Kind::kPut: {
      json put = {{"key", Base64Encode(op.key)}, {"value", Base64Encode(op.value)}};
      if (op.lease != 0) put["lease"] = std::to_string(op.lease);
      return {{"request_put", put}};
    }
    case Operation::Kind::kDelete:
      return {{"request_delete_range", KeyRange(op.key, op.prefix)}};
    case Operation::Kind::kRange:
      return {{"request_range", KeyRange(op.key, op.prefix)}};
  }
  LEASH_CHECK(false);
  return {};
}

json CompareJson(const Compare& c) {
  json j = {{"key", Base64Encode(c.key)},
            {"result", c.op == Compare::Op::kEqual ? "EQUAL" : "NOT_EQUAL"}};
  switch (c.target) {
    case Compare::Target::kCreateRevision:
      j["target"] = "CREATE";
      j["create_revision"] = std::to_string(c.revision);
      break;
    case Compare::Target::kModRevision:
      j["target"] = "MOD";
      j["mod_revision"] = std::to_string(c.revision);
      break;
    case Compare::Target::kValue:
      j["target"] = "VALUE";
      j["value"] = Base64Encode(c.value);
      break;
  }
  return j;
}

// gRPC status codes, as the gateway reports them.
Status FromGrpc(int code, const std::string& what) {
  switch (code) {
    case 3:  // InvalidArgument
      return InvalidArgument(what);
    case 5:  // NotFound
      return NotFound(what);
    case 8:  // ResourceExhausted (e.g. "database space exceeded")
      return ResourceExhausted(what + "; compact and defragment etcd or raise its quota");
    case 9:  // FailedPrecondition
      return FailedPrecondition(what);
    case 10:  // Aborted
      return Aborted(what);
    case 4:   // DeadlineExceeded ("request timed out": no quorum, slow disk)
    case 14:  // Unavailable ("no leader")
      return Unavailable(what);
    default:
      return Internal(what);
  }
}

// An error object of the gateway: {"error": "...", "message": "...", "code": 5} for unary
// calls, {"error": {"grpc_code": 5, "message": "..."}} inside a stream.
std::optional<Status> GatewayError(const json& j, const std::string& endpoint,
                                   std::string_view path) {
  auto it = j.find("error");
  if (it == j.end()) return std::nullopt;
  int code = 2;
  std::string message;
  if (it->is_object()) {
    code = static_cast<int>(Int(*it, "grpc_code"));
    message = Str(*it, "message");
  } else {
    code = static_cast<int>(Int(j, "code"));
    message = Str(j, "message");
    if (message.empty()) message = Str(j, "error");
  }
  return FromGrpc(code, "etcd at " + endpoint + " refused " + std::string(path) + ": " + message);
}

Result<json> ParseJson(std::string_view text, const std::string& endpoint, std::string_view path) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Internal(
        "etcd at " + endpoint + " answered " + std::string(path) +
        " with something that is not a JSON object: " + std::string(text.substr(0, 200)) +
        " (is it etcd 3.4 or newer, serving its v3 JSON gateway?)");
  }
  if (auto err = GatewayError(j, endpoint, path)) return *err;
  return j;
}

size_t WriteBody(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

struct StreamState {
  const std::function<bool(std::string_view)>* on_line = nullptr;
  std::string buffer;
  bool stopped = false;
};

size_t WriteStream(char* data, size_t size, size_t n, void* user) {
  auto* st = static_cast<StreamState*>(user);
  st->buffer.append(data, size * n);
  size_t start = 0;
  for (size_t nl; (nl = st->buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string_view line(st->buffer.data() + start, nl - start);
    if (line.find_first_not_of(" \r\t") == std::string_view::npos) continue;
    if (!(*st->on_line)(line)) {
      st->stopped = true;
      return 0;  // ends the transfer (CURLE_WRITE_ERROR, which Post expects)
    }
  }
  st->buffer.erase(0, start);
  return size * n;
}

int Progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* cancel = static_cast<const std::atomic<bool>*>(user);
  return cancel != nullptr && cancel->load(std::memory_order_relaxed) ? 1 : 0;
}

}  // namespace

struct Client::Handle {
  CURL* curl = nullptr;
  curl_slist* headers = nullptr;
  char error[CURL_ERROR_SIZE] = {};
  ~Handle() {
    if (headers != nullptr) curl_slist_free_all(headers);
    if (curl != nullptr) curl_easy_cleanup(curl);
  }
};

Compare Compare::CreateRevision(std::string key, int64_t revision, Op op) {
  return {std::move(key), Target::kCreateRevision, op, revision, {}};
}
Compare Compare::ModRevision(std::string key, int64_t revision, Op op) {
  return {std::move(key), Target::kModRevision, op, revision, {}};
}
Compare Compare::Value(std::string key, std::string value, Op op) {
  return {std::move(key), Target::kValue, op, 0, std::move(value)};
}

Operation Operation::Put(std::string key, std::string value, int64_t lease) {
  return {Kind::kPut, std::move(key), std::move(value), lease, false};
}
Operation Operation::Delete(std::string key, bool prefix) {
  return {Kind::kDelete, std::move(key), {}, 0, prefix};
}
Operation Operation::Range(std::string key, bool prefix) {
  return {Kind::kRange, std::move(key), {}, 0, prefix};
}

std::string Base64Encode(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

Result<std::string> Base64Decode(std::string_view text) {
  if (text.empty()) return std::string();
  if (text.size() % 4 != 0) {
    return Internal("etcd sent base64 of " + std::to_string(text.size()) +
                    " characters, not a multiple of 4");
  }
  std::string out(3 * (text.size() / 4), '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0) return Internal("etcd sent malformed base64: " + std::string(text.substr(0, 64)));
  // EVP_DecodeBlock counts the padding's zero bytes.
  size_t pad = 0;
  if (text.back() == '=') pad = text[text.size() - 2] == '=' ? 2 : 1;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

std::string PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(end.back());
    if (c < 0xff) {
      ++c;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key (etcd's "\0" range end)
}

Client::Client(ClientOptions options) : options_(std::move(options)) { GlobalInit(); }
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Create(ClientOptions options) {
  if (options.endpoints.empty()) {
    return InvalidArgument("no etcd endpoint given; pass --etcd http://host:2379");
  }
  for (const std::string& e : options.endpoints) {
    bool scheme = e.rfind("http://", 0) == 0 || e.rfind("https://", 0) == 0;
    size_t host = e.find("://") + 3;
    if (!scheme || e.size() <= host || e.find(':', host) == std::string::npos) {
      return InvalidArgument("etcd endpoint '" + e +
                             "' is not http://host:port (e.g. http://127.0.0.1:2379)");
    }
  }
  return std::unique_ptr<Client>(new Client(std::move(options)));
}

std::string Client::EndpointsString() const {
  std::string s;
  for (const std::string& e : options_.endpoints) s += (s.empty() ? "" : ",") + e;
  return s;
}

std::unique_ptr<Client::Handle> Client::Acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      auto h = std::move(idle_.back());
      idle_.pop_back();
      return h;
    }
  }
  auto h = std::make_unique<Handle>();
  h->curl = curl_easy_init();
  LEASH_CHECK(h->curl != nullptr);
  h->headers = curl_slist_append(nullptr, "Content-Type: application/json");
  return h;
}

void Client::Release(std::unique_ptr<Handle> handle) {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() < 4) idle_.push_back(std::move(handle));
}

Result<Client::Response> Client::Post(std::string_view path, const std::string& body,
                                      std::chrono::milliseconds timeout,
                                      const std::function<bool(std::string_view)>* on_line,
                                      const std::atomic<bool>* cancel) {
  const size_t n = options_.endpoints.size();
  const size_t first = preferred_.load(std::memory_order_relaxed) % n;
  std::string tried;
  for (size_t i = 0; i < n; ++i) {
    const size_t index = (first + i) % n;
    const std::string& endpoint = options_.endpoints[index];
    const std::string url = endpoint + std::string(path);
    std::unique_ptr<Handle> h = Acquire();
    CURL* c = h->curl;
    curl_easy_reset(c);
    h->error[0] = '\0';
    Response response;
    StreamState stream{on_line, {}, false};
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h->headers);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, h->error);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(std::min(options_.connect_timeout, timeout).count()));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(std::max<int64_t>(timeout.count(), 1)));
    if (on_line != nullptr) {
      curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, WriteStream);
      curl_easy_setopt(c, CURLOPT_WRITEDATA, &stream);
    } else {
      curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, WriteBody);
      curl_easy_setopt(c, CURLOPT_WRITEDATA, &response.body);
    }
    if (cancel != nullptr) {
      curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
      curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, Progress);
      curl_easy_setopt(c, CURLOPT_XFERINFODATA, cancel);
    }
    CURLcode rc = curl_easy_perform(c);
    long http = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
    curl_off_t connect_us = 0;
    curl_easy_getinfo(c, CURLINFO_CONNECT_TIME_T, &connect_us);
    std::string detail = h->error[0] != '\0' ? h->error : curl_easy_strerror(rc);
    Release(std::move(h));

    if (on_line != nullptr && rc == CURLE_OK && !stream.buffer.empty() && !stream.stopped) {
      (*on_line)(stream.buffer);  // a last message without its newline
    }
    const bool connected = connect_us > 0 || http != 0;
    if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
        (rc == CURLE_OPERATION_TIMEDOUT && !connected)) {
      // Nothing was sent: the next endpoint may be tried without applying anything twice.
      tried += (tried.empty() ? "" : "; ") + endpoint + ": " + detail;
      continue;
    }
    response.endpoint = endpoint;
    if (rc == CURLE_WRITE_ERROR && stream.stopped) rc = CURLE_OK;
    if (rc == CURLE_ABORTED_BY_CALLBACK && cancel != nullptr && cancel->load()) {
      response.cancelled = true;
      rc = CURLE_OK;
    }
    if (rc == CURLE_OPERATION_TIMEDOUT && on_line != nullptr && http == 200) {
      response.timed_out = true;
      rc = CURLE_OK;
    }
    if (rc != CURLE_OK) {
      return Unavailable("etcd at " + endpoint + " failed " + std::string(path) + ": " + detail +
                         (rc == CURLE_OPERATION_TIMEDOUT
                              ? " (no answer in " + std::to_string(timeout.count()) +
                                    " ms; a write may or may not have been applied)"
                              : ""));
    }
    preferred_.store(index, std::memory_order_relaxed);
    if (http != 200 && on_line == nullptr) {
      json j = json::parse(response.body, nullptr, false);
      if (!j.is_discarded() && j.is_object()) {
        if (auto err = GatewayError(j, endpoint, path)) return *err;
      }
      return Internal("etcd at " + endpoint + " answered " + std::string(path) + " with HTTP " +
                      std::to_string(http) + ": " + response.body.substr(0, 200) +
                      " (is it etcd 3.4 or newer, serving its v3 JSON gateway?)");
    }
    return response;
  }
  return Unavailable("etcd at " + EndpointsString() + " unreachable: " + tried +
                     "; start etcd or pass --etcd with its client URL");
}

Result<RangeResult> Client::Range(const std::string& key, bool prefix) {
  constexpr std::string_view kPath = "/v3/kv/range";
  LEASH_ASSIGN_OR_RETURN(Response r,
                         Post(kPath, KeyRange(key, prefix).dump(), options_.request_timeout));
  LEASH_ASSIGN_OR_RETURN(json j, ParseJson(r.body, r.endpoint, kPath));
  return ParseRange(j);
}

Result<int64_t> Client::Put(const std::string& key, const std::string& value, int64_t lease) {
  constexpr std::string_view kPath = "/v3/kv/put";
  json body = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  LEASH_ASSIGN_OR_RETURN(Response r, Post(kPath, body.dump(), options_.request_timeout));
  LEASH_ASSIGN_OR_RETURN(json j, ParseJson(r.body, r.endpoint, kPath));
  return Int(j.value("header", json::object()), "revision");
}

Result<int64_t> Client::Delete(const std::string& key, bool prefix) {
  constexpr std::string_view kPath = "/v3/kv/deleterange";
  LEASH_ASSIGN_OR_RETURN(Response r,
                         Post(kPath, KeyRange(key, prefix).dump(), options_.request_timeout));
  LEASH_ASSIGN_OR_RETURN(json j, ParseJson(r.body, r.endpoint, kPath));
  return Int(j, "deleted");
}

Result<TxnResult> Client::Txn(const std::vector<Compare>& compares,
                              const std::vector<Operation>& success,
                              const std::vector<Operation>& failure) {
  constexpr std::string_view kPath = "/v3/kv/txn";
  json body = {{"compare", json::array()}, {"success", json::array()}, {"failure", json::array()}};
  for (const Compare& c : compares) body["compare"].push_back(CompareJson(c));
  for (const Operation& op : success) body["success"].push_back(OperationJson(op));
  for (const Operation& op : failure) body["failure"].push_back(OperationJson(op));
  LEASH_ASSIGN_OR_RETURN(Response r, Post(kPath, body.dump(), options_.request_timeout));
  LEASH_ASSIGN_OR_RETURN(json j, ParseJson(r.body, r.endpoint, kPath));
  TxnResult t;
  t.succeeded = Bool(j, "succeeded");
  t.revision = Int(j.value("header", json::object()), "revision");
  if (auto rs = j.find("responses"); rs != j.end() && rs->is_array()) {
    for (const json& e : *rs) {
      if (auto range = e.find("response_range"); range != e.end()) {
        LEASH_ASSIGN_OR_RETURN(RangeResult rr, ParseRange(*range));
        t.ranges.push_back(std::move(rr));
      }
    }
  }
  return t;
}

Result<Lease> Client::LeaseGrant(std::chrono::seconds ttl) {
  constexpr std::string_view kPath = "/v3/lease/grant";
  json body = {{"TTL", std::to_string(ttl.count())}};
  LEASH_ASSIGN_OR_RETURN(Response r, Post(kPath, body.dump(), options_.request_timeout));
  LEASH_ASSIGN_OR_RETURN(json j, ParseJson(r.body, r.endpoint, kPath));
  if (std::string e = Str(j, "error"); !e.empty()) {
    return Unavailable("etcd at " + r.endpoint + " granted no lease: " + e);
  }
  Lease lease{Int(j, "ID"), std::chrono::seconds(Int(j, "TTL"))};
  if (lease.id == 0 || lease.ttl.count() <= 0) {
    return Internal("etcd at " + r.endpoint +
                    " granted a lease without an ID or TTL: " + r.body.substr(0, 200));
  }
  return lease;
}

Result<int64_t> Client::LeaseKeepAlive(int64_t id) {
  constexpr std::string_view kPath = "/v3/lease/keepalive";
  json body = {{"ID", std::to_string(id)}};
  std::optional<Result<int64_t>> answer;
  std::string endpoint;
  std::function<bool(std::string_view)> on_line = [&](std::string_view line) {
    Result<json> j = ParseJson(line, options_.endpoints[0], kPath);
    if (!j.ok()) {
      answer = j.status();
    } else {
      answer = Int(j->value("result", json::object()), "TTL");
    }
    return false;  // one answer is all a keep-alive needs
  };
  LEASH_ASSIGN_OR_RETURN(Response r, Post(kPath, body.dump(), options_.request_timeout, &on_line));
  if (!answer) {
    return Unavailable("etcd at " + r.endpoint + " closed " + std::string(kPath) +
                       " without an answer");
  }
  return *answer;
}

Status Client::LeaseRevoke(int64_t id) {
  constexpr std::string_view kPath = "/v3/lease/revoke";
  json body = {{"ID", std::to_string(id)}};
  Result<Response> r = Post(kPath, body.dump(), options_.request_timeout);
  if (!r.ok()) return r.status().code() == StatusCode::kNotFound ? Status::Ok() : r.status();
  Result<json> j = ParseJson(r->body, r->endpoint, kPath);
  if (!j.ok() && j.status().code() != StatusCode::kNotFound) return j.status();
  return Status::Ok();
}

Status Client::WatchStream(const std::string& prefix, int64_t start_revision,
                           std::chrono::milliseconds timeout, const std::atomic<bool>* cancel,
                           const std::function<bool(const WatchResult&)>& on_response) {
  constexpr std::string_view kPath = "/v3/watch";
  json create = KeyRange(prefix, true);
  create["start_revision"] = std::to_string(start_revision);
  json body = {{"create_request", create}};
  Status failed;
  bool created = false;
  bool ended = false;  // by on_response or a compaction
  std::function<bool(std::string_view)> on_line = [&](std::string_view line) {
    Result<json> j = ParseJson(line, options_.endpoints[0], kPath);
    if (!j.ok()) {
      failed = j.status();
      return false;
    }
    const json result = j->value("result", json::object());
    WatchResult out;
    if (auto h = result.find("header"); h != result.end()) out.revision = Int(*h, "revision");
    created = created || Bool(result, "created");
    if (Bool(result, "canceled")) {
      out.compact_revision = Int(result, "compact_revision");
      out.compacted = out.compact_revision > 0;
      if (!out.compacted) {
        failed = Unavailable("etcd cancelled the watch of " + prefix + ": " +
                             Str(result, "cancel_reason"));
        return false;
      }
      ended = true;
      (void)on_response(out);
      return false;
    }
    if (auto events = result.find("events"); events != result.end() && events->is_array()) {
      for (const json& e : *events) {
        WatchEvent ev;
        ev.type = Str(e, "type") == "DELETE" ? WatchEvent::Type::kDelete : WatchEvent::Type::kPut;
        Result<KeyValue> kv = ParseKv(e.value("kv", json::object()));
        if (!kv.ok()) {
          failed = kv.status();
          return false;
        }
        ev.kv = std::move(kv).value();
        out.events.push_back(std::move(ev));
      }
    }
    if (!on_response(out)) {
      ended = true;
      return false;
    }
    return true;
  };
  LEASH_ASSIGN_OR_RETURN(Response r, Post(kPath, body.dump(), timeout, &on_line, cancel));
  if (!failed.ok()) return failed;
  if (r.timed_out || r.cancelled || ended) return Status::Ok();
  return Unavailable("etcd at " + r.endpoint + " closed the watch of " + prefix +
                     (created ? "" : " before it started") + "; is etcd shutting down?");
}

Result<WatchResult> Client::Watch(const std::string& prefix, int64_t start_revision,
                                  std::chrono::milliseconds timeout,
                                  const std::atomic<bool>* cancel) {
  WatchResult out;
  LEASH_RETURN_IF_ERROR(
      WatchStream(prefix, start_revision, timeout, cancel, [&](const WatchResult& r) {
        out.revision = std::max(out.revision, r.revision);
        out.compacted = r.compacted;
        out.compact_revision = r.compact_revision;
        out.events.insert(out.events.end(), r.events.begin(), r.events.end());
        return out.events.empty();  // the first events end it
      }));
  return out;
}

}  // namespace leash::etcd

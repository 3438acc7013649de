// A keyed rate limit for what a misbehaving peer could otherwise make a process do
// without bound: write a log line, send an error reply. Per key (e.g. a peer and a
// reason), at most `per_key` events in each window of `window_ms`; across all keys at most
// `total`; keys beyond `max_keys` share one. Not thread-safe: one per request loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace leash {

class KeyedRateLimit {
 public:
  struct Options {
    uint64_t per_key = 5;       // events allowed per key and window
    uint64_t total = 50;        // events allowed per window, all keys together
    int64_t window_ms = 60000;  // a key's window starts with its first event
    size_t max_keys = 1024;     // keys tracked at once; the rest share the key "*"
  };

  // What Admit() decided for one event.
  struct Decision {
    bool allowed = false;
    // Allowed only: events of this key refused since the last one allowed (for a line
    // such as "... (N more like it suppressed)").
    uint64_t suppressed_before = 0;
  };

  explicit KeyedRateLimit(Options options);
  KeyedRateLimit() : KeyedRateLimit(Options{}) {}

  // Counts one event of `key` at `now_ms` (a monotonic clock) and decides whether it may
  // happen.
  Decision Admit(const std::string& key, int64_t now_ms);

  const Options& options() const { return options_; }
  uint64_t allowed() const { return allowed_; }
  uint64_t suppressed() const { return suppressed_; }
  size_t keys() const { return keys_.size(); }

 private:
  struct Window {
    int64_t start_ms = 0;
    uint64_t events = 0;      // in the current window
    uint64_t suppressed = 0;  // since the last allowed event
  };
  // Starts a new window for `w` when its current one has ended.
  void Roll(Window& w, int64_t now_ms) const;
  // Forgets keys whose window has ended with nothing suppressed to report.
  void Sweep(int64_t now_ms);

  Options options_;
  std::unordered_map<std::string, Window> keys_;
  Window total_;
  uint64_t allowed_ = 0;
  uint64_t suppressed_ = 0;
};

}  // namespace leash

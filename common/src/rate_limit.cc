// KeyedRateLimit: per-key and total windows of events. Not thread-safe.
#include "leash/common/rate_limit.h"

namespace leash {

KeyedRateLimit::KeyedRateLimit(Options options) : options_(options) {}

void KeyedRateLimit::Roll(Window& w, int64_t now_ms) const {
  if (w.events == 0 || now_ms - w.start_ms >= options_.window_ms || now_ms < w.start_ms) {
    w.start_ms = now_ms;
    w.events = 0;
  }
}

void KeyedRateLimit::Sweep(int64_t now_ms) {
  for (auto it = keys_.begin(); it != keys_.end();) {
    const Window& w = it->second;
    const bool ended = now_ms - w.start_ms >= options_.window_ms || now_ms < w.start_ms;
    it = ended && w.suppressed == 0 ? keys_.erase(it) : std::next(it);
  }
}

KeyedRateLimit::Decision KeyedRateLimit::Admit(const std::string& key, int64_t now_ms) {
  auto it = keys_.find(key);
  if (it == keys_.end()) {
    if (keys_.size() >= options_.max_keys) Sweep(now_ms);
    it = keys_.size() < options_.max_keys ? keys_.try_emplace(key).first
                                          : keys_.try_emplace("*").first;
  }
  Window& w = it->second;
  Roll(w, now_ms);
  Roll(total_, now_ms);
  ++w.events;
  ++total_.events;
  if (w.events > options_.per_key || total_.events > options_.total) {
    ++w.suppressed;
    ++suppressed_;
    return {};
  }
  ++allowed_;
  Decision d{true, w.suppressed};
  w.suppressed = 0;
  return d;
}

}  // namespace leash

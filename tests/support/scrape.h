// Test support: scraping a Prometheus endpoint over plain HTTP/1.0 on loopback (no curl
// needed) and parsing the text exposition format strictly enough to catch a malformed
// line. Not thread-safe.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "leash/common/status.h"
#include "support/process.h"

namespace leash::testing {

// GET http://127.0.0.1:`port``path`; the body on a 200 answer. Unavailable when nothing
// answers, Internal for another status code. Gives up after `timeout_ms`.
Result<std::string> HttpGet(int port, const std::string& path, int timeout_ms = 5000);

// Samples of a Prometheus text exposition: `name{label="value",...}` -> value, with the
// labels sorted by name as written (`name` alone without labels). Checks every line:
// `# HELP name text`, `# TYPE name counter|gauge|histogram|summary|untyped`, or a
// sample whose name is declared by a preceding TYPE line (histograms: _bucket/_sum/
// _count) and whose value is a number, +Inf, -Inf or NaN (in any case, as Prometheus
// reads them). InvalidArgument naming the line otherwise.
struct Scrape {
  std::map<std::string, double> samples;
  std::map<std::string, std::string> types;  // family name -> type

  // The value of `name` whose labels include `label`="`value`" (any labels when
  // `label` is empty); nullopt if none. With several matches, the first in name order.
  std::optional<double> Find(const std::string& name, const std::string& label = "",
                             const std::string& value = "") const;
};
Result<Scrape> ParsePrometheusText(const std::string& text);

// Scrapes 127.0.0.1:`port`/metrics every 20 ms until `pred(scrape)` holds and returns
// that scrape, so a test checks the very sample that showed the event it waited for.
// A failed or malformed scrape is retried. DeadlineExceeded, with the last failure or
// the last body, if `pred` never held before `deadline`: the deadline is there for a
// stuck run only, never a measure of speed.
template <typename Pred>
Result<Scrape> ScrapeWhen(int port, Pred pred, std::chrono::milliseconds deadline) {
  std::optional<Scrape> found;
  std::string last = "no scrape yet";
  bool held = WaitFor(
      [&] {
        auto body = HttpGet(port, "/metrics", 2000);
        if (!body.ok()) {
          last = body.status().ToString();
        } else if (auto scrape = ParsePrometheusText(*body); !scrape.ok()) {
          last = scrape.status().ToString();
        } else if (pred(*scrape)) {
          found = std::move(*scrape);
        } else {
          last = "the awaited condition does not hold in:\n" + *body;
        }
        return found.has_value();
      },
      deadline);
  if (held) return std::move(*found);
  return DeadlineExceeded("metrics on port " + std::to_string(port) + " after " +
                          std::to_string(deadline.count()) + " ms: " + last);
}

}  // namespace leash::testing

// The least work a backup adds to the machine, done without a backup: a process that applies
// the shard's optimizer update (momentum, as the pushed table's in leash-bench-pushpull) to
// --floats values at --rate updates a second, as a backup applies each logged push; with
// --copy it first copies the push into memory of its own (the one copy a backup with memory of
// its own needs at least). Gradients and copy sources cycle through --buffers of each (8: the
// pushes in flight), so the update reads them as a backup reads entries, not from one cached
// buffer. Its NaN check, its receive, any acknowledgement and every wake-up are left out: a
// lower bound on what a real backup does.
//
// bench/backup_floor.py runs it beside an unreplicated shard's 4 MB push row: if the shard
// cannot keep R=2's target rate while this runs at that rate, no backup on these cores can.
//
// Runs until SIGTERM or SIGINT (or --seconds), then prints JSON on stdout: the updates done,
// the rate asked and reached, the wall and CPU seconds, the median update and copy times.
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "bench_table.h"
#include "leash/common/flags.h"
#include "leash/ps/table.h"

namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

double Micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t floats = 1048576;
  double rate = 100;
  int64_t buffers = 8;
  bool copy = false;
  double seconds = 0;
  leash::Flags flags("leash-bench-backup-load",
                     "A backup's least work (its optimizer update, optionally one copy of each "
                     "push) at a given rate, without a backup (JSON on stdout at SIGTERM)");
  flags.Int("floats", &floats, "values per push (1048576: the 4 MB push row)");
  flags.Double("rate", &rate, "updates a second (the pushes a backup would apply)");
  flags.Int("buffers", &buffers,
            "gradients (and copy sources) cycled through: the pushes in flight");
  flags.Bool("copy", &copy, "copy each push into memory of its own before the update");
  flags.Double("seconds", &seconds, "stop after this long (0: at SIGTERM or SIGINT only)");
  if (auto code = flags.ParseOrExitCode(argc, argv)) return *code;
  if (floats < 64 || floats % 64 != 0 || floats > (int64_t{1} << 30)) {
    std::fprintf(stderr, "--floats must be a multiple of 64 in [64, 2^30], not %lld\n",
                 static_cast<long long>(floats));
    return 2;
  }
  if (!(rate > 0) || rate > 1e6 || buffers < 1 || buffers > 64 || seconds < 0) {
    std::fprintf(stderr, "--rate must be in (0, 1e6], --buffers in [1, 64], --seconds >= 0\n");
    return 2;
  }
  const leash::TableSpec t = leash::bench::MomentumTable("backup-load", floats);
  auto table = leash::ps::Table::Create(0, t, leash::RowRange{0, t.rows});
  if (!table.ok()) {
    std::fprintf(stderr, "cannot make the table: %s\n", table.status().ToString().c_str());
    return 1;
  }
  const auto n = static_cast<size_t>(floats);
  const auto k = static_cast<size_t>(buffers);
  std::vector<std::vector<float>> grads(k, std::vector<float>(n, 1e-3f));
  std::vector<std::vector<float>> sources(copy ? k : 0, std::vector<float>(n, 2e-3f));

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  const auto period = std::chrono::duration<double>(1.0 / rate);
  const double cpu0 = CpuSeconds();
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds > 0 ? seconds : 1e9));
  auto next = t0;
  std::vector<double> update_us, copy_us;
  double behind_us = 0;  // the most the schedule was late by
  int64_t done = 0;
  while (!g_stop && Clock::now() < end) {
    const auto now = Clock::now();
    if (now < next) {
      std::this_thread::sleep_until(next);
      continue;  // a signal may have come
    }
    behind_us = std::max(behind_us, Micros(next, now));
    // A process held off the cores for long does not catch up in a burst afterwards.
    if (now - next > std::chrono::seconds(1)) next = now;
    const size_t i = static_cast<size_t>(done) % k;
    auto s = Clock::now();
    if (copy) {
      std::memcpy(grads[i].data(), sources[i].data(), n * sizeof(float));
      auto c = Clock::now();
      copy_us.push_back(Micros(s, c));
      s = c;
    }
    table->Apply(leash::Rows::Range(0, t.rows), grads[i].data());
    update_us.push_back(Micros(s, Clock::now()));
    ++done;
    next += std::chrono::duration_cast<Clock::duration>(period);
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu = CpuSeconds() - cpu0;
  std::printf(
      "{\"floats\": %lld, \"copy\": %s, \"updates\": %lld, \"rate_asked\": %.3f, "
      "\"rate_reached\": %.3f, \"wall_s\": %.4f, \"cpu_s\": %.4f, \"cpu_us_per_update\": %.2f, "
      "\"update_p50_us\": %.2f, \"copy_p50_us\": %.2f, \"most_behind_us\": %.1f}\n",
      static_cast<long long>(floats), copy ? "true" : "false", static_cast<long long>(done), rate,
      wall > 0 ? static_cast<double>(done) / wall : 0.0, wall, cpu,
      done > 0 ? cpu / static_cast<double>(done) * 1e6 : 0.0, Median(update_us), Median(copy_us),
      behind_us);
  return 0;
}

// What it costs one core to read data another core has just written, against reading
// data it wrote itself: the floor under a worker and a shard on one host, which hand
// each other the model's gradient and values every iteration (bench/results/crosscore.md).
//
// Two threads, pinned to CPU 0 and CPU 1. Each round, interleaved:
//   same core:  A writes the buffer, then A copies it into its own destination;
//   cross core: A writes the buffer, then B copies it into its own destination.
// Only the copy is timed. Medians over the rounds, as JSON on stdout.
//
// Usage: leash-bench-crosscore [--bytes N] [--rounds R] [--shm]   (default: the MLP's
// 942,080 bytes, as the worker pushes and pulls them per iteration; 400 rounds). With --shm
// the written buffer is a POSIX shared-memory mapping, as a same-host ring is.
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "leash/common/flags.h"

namespace {

using Clock = std::chrono::steady_clock;

bool Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double CopyMicros(const float* src, std::vector<float>& dst) {
  auto t0 = Clock::now();
  std::memcpy(dst.data(), src, dst.size() * sizeof(float));
  auto t1 = Clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

void Write(float* v, size_t n, int round) { std::fill(v, v + n, static_cast<float>(round)); }

// A mapping of a POSIX shared-memory object of `bytes` (unlinked at once), or null.
float* MapShared(size_t bytes) {
  const std::string name = "/leash-bench-crosscore-" + std::to_string(::getpid());
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return nullptr;
  ::shm_unlink(name.c_str());
  void* p = ::ftruncate(fd, static_cast<off_t>(bytes)) == 0
                ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                : MAP_FAILED;
  ::close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<float*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t bytes_flag = 942080;
  int64_t rounds_flag = 400;
  bool shm = false;
  leash::Flags flags("leash-bench-crosscore",
                     "One core copying what another has just written, against the same copy "
                     "from its own cache (JSON on stdout)");
  flags.Int("bytes", &bytes_flag, "bytes copied per round (the default is the MLP's model)");
  flags.Int("rounds", &rounds_flag, "rounds, each timing both copies");
  flags.Bool("shm", &shm, "the written buffer is a POSIX shared-memory mapping, as a ring is");
  if (auto code = flags.ParseOrExitCode(argc, argv)) return *code;
  if (bytes_flag < static_cast<int64_t>(sizeof(float)) || rounds_flag < 1 ||
      rounds_flag > 1000000) {
    std::fprintf(stderr, "--bytes must be at least 4 and --rounds in [1, 1000000]\n");
    return 2;
  }
  const auto bytes = static_cast<size_t>(bytes_flag);
  const auto rounds = static_cast<int>(rounds_flag);
  if (std::thread::hardware_concurrency() < 2) {
    std::fprintf(stderr, "needs two CPUs (found %u)\n", std::thread::hardware_concurrency());
    return 1;
  }
  const size_t n = bytes / sizeof(float);
  std::vector<float> heap(shm ? 0 : n), dst_a(n), dst_b(n);
  float* src = shm ? MapShared(n * sizeof(float)) : heap.data();
  if (src == nullptr) {
    std::fprintf(stderr, "cannot map %zu bytes of shared memory: %s\n", n * sizeof(float),
                 std::strerror(errno));
    return 1;
  }
  std::atomic<int> turn{0};  // 1: B copies; 2: B is done; -1: B stops
  std::vector<double> same, cross;
  std::thread b([&] {
    if (!Pin(1)) std::fprintf(stderr, "cannot pin to CPU 1\n");
    Write(dst_b.data(), n, 0);
    while (true) {
      int t;
      while ((t = turn.load(std::memory_order_acquire)) == 0 || t == 2) std::this_thread::yield();
      if (t < 0) return;
      cross.push_back(CopyMicros(src, dst_b));
      turn.store(2, std::memory_order_release);
    }
  });
  if (!Pin(0)) std::fprintf(stderr, "cannot pin to CPU 0\n");
  Write(dst_a.data(), n, 0);
  for (int r = 0; r < rounds; ++r) {
    Write(src, n, 2 * r);
    same.push_back(CopyMicros(src, dst_a));
    Write(src, n, 2 * r + 1);
    turn.store(1, std::memory_order_release);
    while (turn.load(std::memory_order_acquire) != 2) std::this_thread::yield();
    turn.store(0, std::memory_order_release);
  }
  turn.store(-1, std::memory_order_release);
  b.join();
  const double s = Median(same), c = Median(cross);
  std::printf(
      "{\"bytes\": %zu, \"rounds\": %d, \"shm\": %s, \"same_core_copy_us\": %.2f, "
      "\"cross_core_copy_us\": %.2f, "
      "\"same_core_gb_per_s\": %.2f, \"cross_core_gb_per_s\": %.2f, \"cross_over_same\": %.3f}\n",
      bytes, rounds, shm ? "true" : "false", s, c, static_cast<double>(bytes) / s / 1e3,
      static_cast<double>(bytes) / c / 1e3, c / s);
  return 0;
}

// Test support: child processes (the real leash-server / leash-worker binaries), free
// loopback ports and temporary directories. A Process kills its child (by PID) when
// destroyed, so no test leaves a process behind whatever its outcome. Not thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace leash::testing {

class Process {
 public:
  // Starts `argv[0]` with `argv`; stdout and stderr go to `log_path` (appended).
  Process(std::vector<std::string> argv, std::string log_path);
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  // Sends `sig` to the child (if it is still ours to signal).
  void Signal(int sig);
  // Waits up to `timeout` for the child to exit; returns its exit code (128+signal if
  // killed), or nullopt on timeout.
  std::optional<int> Wait(std::chrono::milliseconds timeout);
  // SIGKILL and reap.
  void Kill();
  const std::string& log_path() const { return log_path_; }
  std::string ReadLog() const;

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::string log_path_;
};

// Runs `argv` (no shell) to completion, its output (stdout and stderr) in a fresh log file
// under `log_dir`. Returns its exit code (-1 if it ran past `timeout`: then it is killed)
// and its output.
std::pair<int, std::string> RunToCompletion(std::vector<std::string> argv,
                                            const std::string& log_dir,
                                            std::chrono::milliseconds timeout);

// A TCP port on 127.0.0.1 that was free a moment ago, outside the ephemeral range.
int FreePort();
std::string Endpoint(int port);

// The TCP sockets (IPv4 and IPv6) among the open descriptors of process `pid`, from its
// network namespace's /proc/PID/net/tcp{,6}: listeners and connections in every state.
struct TcpSocket {
  int local_port = 0;
  int remote_port = 0;  // 0 for a listener
  bool established = false;
  std::string inode;  // as in the descriptor's "socket:[INODE]"
};
std::vector<TcpSocket> TcpSocketsOf(pid_t pid);

// A fresh directory under $TMPDIR, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Polls `pred` every 20 ms until it holds or `timeout` passes.
template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds timeout) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    struct timespec ts {
      0, 20'000'000
    };
    nanosleep(&ts, nullptr);
  }
  return pred();
}

}  // namespace leash::testing

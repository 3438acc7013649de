// Test support: a real single-member etcd on free loopback ports with its own data
// directory, started and stopped by PID (through Process), for the coordinator's tests and
// the integration tests of replicated shards. Not thread-safe.
#pragma once

#include <memory>
#include <string>

#include "process.h"

namespace leash::testing {

class EtcdProcess {
 public:
  // The etcd executable ($LEASH_ETCD_BIN, else etcd on PATH or in /usr/bin), or "" if there
  // is none (tests then skip: `bash scripts/install-deps.sh` installs etcd-server).
  static std::string Binary();
  // Why tests that need etcd cannot run here ("" when they can): what to install.
  static std::string SkipReason();

  // Starts etcd with its data under `dir`, listening on `host` (an address of this network
  // namespace), and waits until it answers; throws std::runtime_error (with the end of its
  // log) if it does not within 20 s.
  explicit EtcdProcess(const std::string& dir, const std::string& host = "127.0.0.1");
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // The client URL, "http://<host>:<port>".
  const std::string& endpoint() const { return endpoint_; }
  bool running() { return process_ != nullptr && process_->running(); }
  // SIGKILL (no clean shutdown), reaped.
  void Kill();
  // Starts it again on the same ports and data directory, and waits until it answers.
  void Restart();
  // SIGSTOP / SIGCONT: a hung etcd (connections accepted, nothing answered), as a machine
  // that stalls or a network that drops packets shows it, rather than refused connections.
  void Pause();
  void Resume();
  std::string ReadLog() const;

 private:
  void Start();

  std::string dir_;
  std::string host_;
  std::string log_path_;
  int client_port_ = 0;
  int peer_port_ = 0;
  std::string endpoint_;
  std::unique_ptr<Process> process_;
};

}  // namespace leash::testing

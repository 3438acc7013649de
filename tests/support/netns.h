// Test support: "hosts" as network namespaces on one machine, joined by a bridge in a
// further namespace ("the switch") through veth pairs, so processes talk real TCP between
// addresses of their own (10.231.0.<i+1>, only inside namespaces this creates), links can
// go down and routes between two hosts can be cut. Used by multihost_test (shards and
// workers across hosts) and failover_test (a primary partitioned from its backup). Needs
// root and iproute2 (and util-linux's unshare for On()); Create() says why it cannot.
// Not thread-safe.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace leash::testing {

// The path of a system tool (Process execs without searching PATH); the name if not found.
std::string Tool(const std::string& name);

// Runs argv to completion (no shell; a bare tool name is looked up with Tool); its exit code
// (-1 on timeout) and output.
std::pair<int, std::string> RunCmd(const std::string& dir, std::vector<std::string> argv,
                                   std::chrono::seconds timeout = std::chrono::seconds(30));

// The namespaces: hosts <prefix>h<i> with address 10.231.0.<i+1>/24 on eth0, each wired
// to port p<i> of bridge br0 in <prefix>sw. Removed (with anything still in them killed by
// the kernel as their last reference goes) when destroyed.
class Hosts {
 public:
  // `dir` holds the commands' logs.
  Hosts(std::string dir, int n);
  ~Hosts();
  Hosts(const Hosts&) = delete;
  Hosts& operator=(const Hosts&) = delete;

  // Builds the network; the failing command's output when it cannot (then the test skips).
  std::string Create();

  std::string Ns(int i) const { return prefix_ + "h" + std::to_string(i); }
  static std::string Address(int i) { return "10.231.0." + std::to_string(i + 1); }

  // argv run on host i: in its network namespace, in a mount namespace of its own with a
  // private 64 MB /dev/shm (what a container gets). Each wrapper execs the next, so the
  // process keeps the pid Process knows.
  std::vector<std::string> On(int i, std::vector<std::string> argv) const;

  // Host i's link on the switch side: down cuts it off, up restores it. Returns the
  // command's output if it failed ("" if it worked).
  std::string Link(int i, bool up);

  // Cuts (true) or restores the route between hosts i and j in both directions (a
  // blackhole route to the other on each), leaving their other links alone: a partition
  // between two hosts that both still reach the rest. "" if it worked, else the output.
  std::string Partition(int i, int j, bool cut);

  // Whether any namespace of this run is still there.
  bool AnyLeft() const;

 private:
  // Namespaces of earlier runs whose test process is gone (a run killed mid-test).
  void RemoveStale();

  std::string dir_;
  int n_;
  std::string prefix_;
};

// Moves the calling thread into host namespace `ns` (setns) and back into the namespace it
// was in when destroyed. Threads and processes the thread starts meanwhile stay in `ns`
// (they inherit it), so a test can be "on" a host with its clients and the processes it
// starts. error() is non-empty if the move failed (nothing changed then).
class EnterNetns {
 public:
  explicit EnterNetns(const std::string& ns);
  ~EnterNetns();
  EnterNetns(const EnterNetns&) = delete;
  EnterNetns& operator=(const EnterNetns&) = delete;
  const std::string& error() const { return error_; }

 private:
  int home_fd_ = -1;
  std::string error_;
};

}  // namespace leash::testing

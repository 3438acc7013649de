// Network namespaces as hosts for multi-host and partition tests (netns.h).
#include "support/netns.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "support/process.h"

namespace leash::testing {

std::string Tool(const std::string& name) {
  for (const char* d : {"/usr/sbin/", "/usr/bin/", "/sbin/", "/bin/"}) {
    if (::access((d + name).c_str(), X_OK) == 0) return d + name;
  }
  return name;
}

std::pair<int, std::string> RunCmd(const std::string& dir, std::vector<std::string> argv,
                                   std::chrono::seconds timeout) {
  if (argv[0].find('/') == std::string::npos) argv[0] = Tool(argv[0]);
  return RunToCompletion(std::move(argv), dir, timeout);
}

Hosts::Hosts(std::string dir, int n) : dir_(std::move(dir)), n_(n) {
  prefix_ = "lsh" + std::to_string(::getpid()) + "-";
}

Hosts::~Hosts() {
  for (int i = 0; i < n_; ++i) RunCmd(dir_, {"ip", "netns", "del", Ns(i)});
  RunCmd(dir_, {"ip", "netns", "del", prefix_ + "sw"});
}

std::string Hosts::Create() {
  RemoveStale();
  std::vector<std::vector<std::string>> cmds = {
      {"ip", "netns", "add", prefix_ + "sw"},
      {"ip", "-n", prefix_ + "sw", "link", "add", "br0", "type", "bridge"},
      {"ip", "-n", prefix_ + "sw", "link", "set", "br0", "up"}};
  for (int i = 0; i < n_; ++i) {
    const std::string p = "p" + std::to_string(i);
    cmds.push_back({"ip", "netns", "add", Ns(i)});
    cmds.push_back({"ip", "link", "add", "eth0", "netns", Ns(i), "type", "veth", "peer", "name", p,
                    "netns", prefix_ + "sw"});
    cmds.push_back({"ip", "-n", prefix_ + "sw", "link", "set", p, "master", "br0"});
    cmds.push_back({"ip", "-n", prefix_ + "sw", "link", "set", p, "up"});
    cmds.push_back({"ip", "-n", Ns(i), "addr", "add", Address(i) + "/24", "dev", "eth0"});
    cmds.push_back({"ip", "-n", Ns(i), "link", "set", "eth0", "up"});
    cmds.push_back({"ip", "-n", Ns(i), "link", "set", "lo", "up"});
  }
  for (auto& c : cmds) {
    auto [code, out] = RunCmd(dir_, c);
    if (code != 0) {
      std::string line;
      for (auto& a : c) line += a + " ";
      return line + "-> " + out;
    }
  }
  return "";
}

std::vector<std::string> Hosts::On(int i, std::vector<std::string> argv) const {
  std::vector<std::string> w = {Tool("ip"),
                                "netns",
                                "exec",
                                Ns(i),
                                Tool("unshare"),
                                "--mount",
                                "--propagation",
                                "private",
                                "/bin/sh",
                                "-c",
                                "mount -t tmpfs -o size=64m leash-shm /dev/shm && exec \"$@\"",
                                "sh"};
  w.insert(w.end(), argv.begin(), argv.end());
  return w;
}

std::string Hosts::Link(int i, bool up) {
  auto [code, out] = RunCmd(dir_, {"ip", "-n", prefix_ + "sw", "link", "set",
                                   "p" + std::to_string(i), up ? "up" : "down"});
  return code == 0 ? "" : out;
}

std::string Hosts::Partition(int i, int j, bool cut) {
  for (auto [from, to] : {std::pair{i, j}, std::pair{j, i}}) {
    auto [code, out] = RunCmd(dir_, {"ip", "-n", Ns(from), "route", cut ? "add" : "del",
                                     "blackhole", Address(to) + "/32"});
    if (code != 0) return out;
  }
  return "";
}

bool Hosts::AnyLeft() const {
  auto [code, out] = RunCmd(dir_, {"ip", "netns", "list"});
  return out.find(prefix_) != std::string::npos;
}

void Hosts::RemoveStale() {
  auto [code, out] = RunCmd(dir_, {"ip", "netns", "list"});
  size_t at = 0;
  while ((at = out.find("lsh", at)) != std::string::npos) {
    size_t end = out.find_first_of(" \n", at);
    std::string name = out.substr(at, end - at);
    at = end;
    size_t dash = name.find('-');
    if (dash == std::string::npos) continue;
    pid_t pid = static_cast<pid_t>(std::atoll(name.substr(3, dash - 3).c_str()));
    if (pid > 0 && pid != ::getpid() && ::kill(pid, 0) != 0) {
      RunCmd(dir_, {"ip", "netns", "del", name});
    }
  }
}

EnterNetns::EnterNetns(const std::string& ns) {
  home_fd_ = ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (home_fd_ < 0) {
    error_ = std::string("cannot open this thread's network namespace: ") + std::strerror(errno);
    return;
  }
  const std::string path = "/var/run/netns/" + ns;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
    error_ = "cannot enter " + path + ": " + std::strerror(errno);
    if (fd >= 0) ::close(fd);
    ::close(home_fd_);
    home_fd_ = -1;
    return;
  }
  ::close(fd);
}

EnterNetns::~EnterNetns() {
  if (home_fd_ < 0) return;
  if (::setns(home_fd_, CLONE_NEWNET) != 0) std::abort();  // the test would run elsewhere
  ::close(home_fd_);
}

}  // namespace leash::testing

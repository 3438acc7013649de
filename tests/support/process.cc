// Child processes, ports and temp dirs for multi-process tests.
#include "process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>

namespace leash::testing {

Process::Process(std::vector<std::string> argv, std::string log_path)
    : log_path_(std::move(log_path)) {
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid_ == 0) {
    int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    // Die with the test runner even if it is killed before its destructors run.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execv(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
}

Process::~Process() { Kill(); }

bool Process::running() { return !Wait(std::chrono::milliseconds(0)).has_value(); }

void Process::Signal(int sig) {
  if (pid_ > 0 && !exit_code_) ::kill(pid_, sig);
}

std::optional<int> Process::Wait(std::chrono::milliseconds timeout) {
  if (exit_code_) return exit_code_;
  if (pid_ <= 0) return std::nullopt;
  auto end = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return exit_code_;
    }
    if (std::chrono::steady_clock::now() >= end) return std::nullopt;
    struct timespec ts {
      0, 10'000'000
    };
    nanosleep(&ts, nullptr);
  }
}

void Process::Kill() {
  if (pid_ <= 0 || exit_code_) return;
  ::kill(pid_, SIGKILL);
  Wait(std::chrono::seconds(10));
}

std::string Process::ReadLog() const {
  std::ifstream f(log_path_);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

namespace {

// True when 127.0.0.1:port can be bound right now.
bool CanBind(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

}  // namespace

// Ports come from [20000, 32000), below Linux's ephemeral range (32768-60999 by default):
// a port the kernel hands out for port 0 is also the source port of the next outgoing
// connection of any process, so between this check and the child's bind another test's
// connection could take it. Random ports in a range nobody is handed implicitly make that
// race (seen with several suites running at once) practically disappear.
std::pair<int, std::string> RunToCompletion(std::vector<std::string> argv,
                                            const std::string& log_dir,
                                            std::chrono::milliseconds timeout) {
  static std::atomic<int> runs{0};
  std::string name = std::filesystem::path(argv.at(0)).filename().string();
  Process p(std::move(argv), log_dir + "/" + name + "-" + std::to_string(runs++) + ".log");
  auto code = p.Wait(timeout);
  return {code.value_or(-1), p.ReadLog()};
}

// A port is handed out at most once per process (two shards of one test once drew the same
// port and one failed to bind), and reserved across processes while this one lives with an
// flock on $TMPDIR/leash-test-ports/PORT (ctest runs suites side by side; the lock goes with
// the process, however it ends).
int FreePort() {
  static std::mt19937 rng(
      static_cast<unsigned>(std::random_device{}() ^ static_cast<unsigned>(getpid())));
  static std::mutex mu;
  static std::set<int> given;
  std::lock_guard<std::mutex> lock(mu);
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/leash-test-ports";
  std::error_code ignored;
  std::filesystem::create_directories(dir, ignored);
  std::uniform_int_distribution<int> pick(20000, 31999);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = pick(rng);
    if (given.count(port) != 0) continue;
    const std::string lock_path = dir + "/" + std::to_string(port);
    const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0) {
      close(fd);  // another test process holds it
      continue;
    }
    if (!CanBind(port)) {
      if (fd >= 0) close(fd);
      continue;
    }
    given.insert(port);  // fd stays open (and locked) until the process exits
    return port;
  }
  throw std::runtime_error("no free loopback port in [20000, 32000) after 1000 tries");
}

std::string Endpoint(int port) { return "tcp://127.0.0.1:" + std::to_string(port); }

std::vector<TcpSocket> TcpSocketsOf(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator(proc + "/fd", ec)) {
    std::error_code gone;  // closed while listing
    const std::string target = std::filesystem::read_symlink(fd.path(), gone).string();
    if (!gone && target.rfind("socket:[", 0) == 0) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::vector<TcpSocket> out;
  auto port = [](const std::string& address) {
    return std::stoi(address.substr(address.rfind(':') + 1), nullptr, 16);
  };
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream f(proc + table);
    std::string line;
    std::getline(f, line);  // the header
    while (std::getline(f, line)) {
      // sl local rem st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ...
      std::istringstream fields(line);
      std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if (!inodes.count(inode)) continue;
      out.push_back({port(local), port(remote), state == "01", inode});  // 01: ESTABLISHED
    }
  }
  return out;
}

TempDir::TempDir() {
  std::string base = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
  std::string tmpl = base + "/leash-test-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace leash::testing

// A real etcd for tests (etcd_process.h): started by fork/exec through Process, ready when
// its /health answers (through libcurl), killed by PID.
#include "etcd_process.h"

#include <curl/curl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace leash::testing {
namespace {

size_t Append(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

// True when etcd at `endpoint` reports itself healthy (it has a leader).
bool Healthy(const std::string& endpoint) {
  CURL* c = curl_easy_init();
  if (c == nullptr) return false;
  std::string body;
  const std::string url = endpoint + "/health";
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 1000L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, Append);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
  CURLcode rc = curl_easy_perform(c);
  curl_easy_cleanup(c);
  return rc == CURLE_OK && body.find("\"health\":\"true\"") != std::string::npos;
}

}  // namespace

std::string EtcdProcess::Binary() {
  if (const char* env = std::getenv("LEASH_ETCD_BIN"); env != nullptr && *env != '\0') {
    return access(env, X_OK) == 0 ? std::string(env) : std::string();
  }
  std::string path = std::getenv("PATH") != nullptr ? std::getenv("PATH") : "";
  path += ":/usr/bin:/usr/local/bin";
  std::stringstream dirs(path);
  for (std::string d; std::getline(dirs, d, ':');) {
    if (d.empty()) continue;
    std::string candidate = d + "/etcd";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string EtcdProcess::SkipReason() {
  return Binary().empty() ? "etcd is not installed (bash scripts/install-deps.sh installs "
                            "etcd-server; LEASH_ETCD_BIN names another executable)"
                          : "";
}

EtcdProcess::EtcdProcess(const std::string& dir, const std::string& host)
    : dir_(dir), host_(host), log_path_(dir + "/etcd.log") {
  client_port_ = FreePort();
  do {
    peer_port_ = FreePort();
  } while (peer_port_ == client_port_);
  endpoint_ = "http://" + host_ + ":" + std::to_string(client_port_);
  Start();
}

EtcdProcess::~EtcdProcess() { Kill(); }

void EtcdProcess::Start() {
  const std::string binary = Binary();
  if (binary.empty()) throw std::runtime_error("no etcd executable found");
  const std::string peer = "http://" + host_ + ":" + std::to_string(peer_port_);
  process_ = std::make_unique<Process>(
      std::vector<std::string>{binary, "--name", "leash-test", "--data-dir", dir_ + "/etcd-data",
                               "--listen-client-urls", endpoint_, "--advertise-client-urls",
                               endpoint_, "--listen-peer-urls", peer,
                               "--initial-advertise-peer-urls", peer, "--initial-cluster",
                               "leash-test=" + peer, "--logger", "zap", "--log-outputs", "stderr"},
      log_path_);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    if (!process_->running()) break;
    if (Healthy(endpoint_)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string log = ReadLog();
  if (log.size() > 2000) log = log.substr(log.size() - 2000);
  process_->Kill();
  throw std::runtime_error("etcd at " + endpoint_ + " did not become healthy; its log ends:\n" +
                           log);
}

void EtcdProcess::Kill() {
  if (process_ != nullptr) process_->Kill();
}

void EtcdProcess::Pause() {
  if (process_ != nullptr) process_->Signal(SIGSTOP);
}

void EtcdProcess::Resume() {
  if (process_ != nullptr) process_->Signal(SIGCONT);
}

void EtcdProcess::Restart() {
  Kill();
  Start();
}

std::string EtcdProcess::ReadLog() const {
  std::ifstream f(log_path_);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace leash::testing

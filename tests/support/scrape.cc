// Plain-socket HTTP GET and a strict reader of the Prometheus text format, for tests.
#include "support/scrape.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <sstream>

namespace leash::testing {

Result<std::string> HttpGet(int port, const std::string& path, int timeout_ms) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Internal(std::string("socket: ") + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    return Unavailable("connect to 127.0.0.1:" + std::to_string(port) + ": " +
                       std::strerror(errno));
  }
  std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return Unavailable(std::string("send: ") + std::strerror(errno));
  }
  std::string response;
  char buf[65536];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return Unavailable(std::string("recv: ") + std::strerror(errno));
    }
    response.append(buf, static_cast<size_t>(n));
    if (std::chrono::steady_clock::now() > deadline)
      return DeadlineExceeded("HTTP answer took too long");
  }
  size_t head_end = response.find("\r\n\r\n");
  if (head_end == std::string::npos)
    return Internal("no HTTP header in the answer: " + response.substr(0, 200));
  std::string status_line = response.substr(0, response.find("\r\n"));
  if (status_line.find(" 200 ") == std::string::npos &&
      status_line.substr(status_line.size() - 4) != " 200") {
    return Internal("HTTP answer '" + status_line + "'");
  }
  return response.substr(head_end + 4);
}

namespace {

// A sample value as Prometheus reads it (Go's ParseFloat): a number, +Inf/-Inf/Inf or
// NaN in any case (prometheus-cpp writes "Nan" for an empty summary's quantiles).
bool ParseValue(const std::string& s, double* v) {
  std::string lower;
  for (char c : s) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "+inf" || lower == "inf") {
    *v = INFINITY;
    return true;
  }
  if (lower == "-inf") {
    *v = -INFINITY;
    return true;
  }
  if (lower == "nan") {
    *v = NAN;
    return true;
  }
  if (lower.find_first_not_of("0123456789+-.e") != std::string::npos) return false;
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return !s.empty() && *end == '\0';
}

}  // namespace

Result<Scrape> ParsePrometheusText(const std::string& text) {
  static const std::regex kHelp(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*)");
  static const std::regex kType(
      R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped))");
  static const std::regex kSample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*)\})? (\S+)( -?[0-9]+)?)");
  Scrape out;
  std::istringstream in(text);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    auto bad = [&](const std::string& why) {
      return InvalidArgument("line " + std::to_string(number) + " '" + line + "': " + why);
    };
    if (line.empty()) continue;
    std::smatch m;
    if (line.rfind("# HELP ", 0) == 0) {
      if (!std::regex_match(line, m, kHelp)) return bad("malformed HELP");
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      if (!std::regex_match(line, m, kType)) return bad("malformed TYPE");
      out.types[m[1]] = m[2];
      continue;
    }
    if (line[0] == '#') continue;  // a comment
    if (!std::regex_match(line, m, kSample)) return bad("not a sample");
    std::string name = m[1];
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      size_t n = std::strlen(suffix);
      std::string base = name.size() > n ? name.substr(0, name.size() - n) : "";
      if (name.size() > n && name.compare(name.size() - n, n, suffix) == 0 &&
          out.types.count(base) &&
          (out.types[base] == "histogram" || out.types[base] == "summary")) {
        family = base;
      }
    }
    if (!out.types.count(family))
      return bad("sample of '" + family + "' without a TYPE line before it");
    double v = 0;
    if (!ParseValue(m[4], &v)) return bad("value '" + std::string(m[4]) + "' is not a number");
    std::string labels = m[3];
    if (!labels.empty() && labels.back() == ',') labels.pop_back();
    out.samples[labels.empty() ? name : name + "{" + labels + "}"] = v;
  }
  return out;
}

std::optional<double> Scrape::Find(const std::string& name, const std::string& label,
                                   const std::string& value) const {
  for (auto it = samples.lower_bound(name); it != samples.end(); ++it) {
    const std::string& key = it->first;
    if (key.compare(0, name.size(), name) != 0) break;
    if (key.size() != name.size() && key[name.size()] != '{') continue;
    if (label.empty() || key.find(label + "=\"" + value + "\"") != std::string::npos)
      return it->second;
  }
  return std::nullopt;
}

}  // namespace leash::testing

// CURVE authentication for a shard; see zap_handler.h.
#include "zap_handler.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>

#include "zmq_util.h"

namespace leash {

ZapHandler::ZapHandler(zmq::context_t& ctx, const std::vector<AuthorizedKey>& authorized)
    : socket_(ctx, zmq::socket_type::rep) {
  for (const auto& k : authorized) {
    uint8_t raw[32];
    if (zmq_z85_decode(raw, k.public_z85.c_str()) != nullptr) {
      allowed_[std::string(reinterpret_cast<char*>(raw), 32)] = k.name;
    }
  }
  socket_.set(zmq::sockopt::linger, 0);
}

ZapHandler::~ZapHandler() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

Status ZapHandler::Start() {
  try {
    socket_.bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    return Internal(std::string("cannot start the CURVE authenticator (ZAP handler): ") + e.what() +
                    " (only one CURVE server per ZmqContext)");
  }
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void ZapHandler::Loop() {
  while (!stop_.load()) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> req;
      if (!zmq_util::RecvAll(socket_, &req).ok()) continue;
      Answer(req);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      if (e.num() != EINTR) spdlog::warn("CURVE authenticator: {}", e.what());
    }
  }
}

void ZapHandler::Answer(std::vector<zmq::message_t>& req) {
  std::string request_id = req.size() > 1 ? req[1].to_string() : "";
  std::string address = req.size() > 3 ? req[3].to_string() : "?";
  std::string mechanism = req.size() > 5 ? req[5].to_string() : "";
  std::string status = "400", text = "client key not authorized", user;
  if (req.size() < 7 || req[0].to_string() != "1.0") {
    text = "malformed ZAP request";
    spdlog::warn("CURVE authenticator: malformed ZAP request ({} frames)", req.size());
  } else if (mechanism != "CURVE" || req[6].size() != 32) {
    text = "CURVE required";
    ++refused_;
    spdlog::warn("refused a {} connection from {}: this shard accepts only CURVE clients",
                 mechanism, address);
  } else {
    std::string key = req[6].to_string();
    auto it = allowed_.find(key);
    if (it != allowed_.end()) {
      status = "200";
      text = "OK";
      user = it->second;
    } else {
      uint64_t n = ++refused_;
      // Once per key (a refused client keeps reconnecting), at most 1000 keys remembered.
      if (logged_.size() < 1000 && logged_.insert(key).second) {
        spdlog::warn(
            "refused CURVE client key {} from {}: not in the authorized keys (refusal #{}; further "
            "attempts with this key are counted, not logged)",
            zmq_util::Z85(key.data()), address, n);
      }
    }
  }
  std::vector<zmq::message_t> reply;
  reply.emplace_back(std::string("1.0"));
  reply.emplace_back(request_id);
  reply.emplace_back(status);
  reply.emplace_back(text);
  reply.emplace_back(user);
  reply.emplace_back();
  for (size_t i = 0; i < reply.size(); ++i) {
    socket_.send(std::move(reply[i]),
                 i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
}

}  // namespace leash

#include "other_replicas.h"

#include <string>
#include <utility>

namespace leash::server {

OtherReplicas::OtherReplicas(std::unique_ptr<ClientTransport> others, int self)
    : others_(std::move(others)), self_(self) {}

int OtherReplicas::ToOther(int replica) const {
  if (replica == self_) return -1;
  return replica < self_ ? replica : replica - 1;
}

Status OtherReplicas::Self(int replica) const {
  return FailedPrecondition("replica " + std::to_string(replica) +
                            " is this process: a replica has no connection to itself");
}

Status OtherReplicas::Send(int replica, Message message) {
  const int other = ToOther(replica);
  if (other < 0) return Self(replica);
  return others_->Send(other, std::move(message));
}

Result<std::optional<std::pair<int, Message>>> OtherReplicas::Receive(
    std::chrono::milliseconds timeout) {
  LEASH_ASSIGN_OR_RETURN(auto in, others_->Receive(timeout));
  if (in) in->first = FromOther(in->first);
  return in;
}

Status OtherReplicas::Reconnect(int replica) {
  const int other = ToOther(replica);
  if (other < 0) return Self(replica);
  return others_->Reconnect(other);
}

Status OtherReplicas::Retarget(int replica, const std::string& endpoint) {
  const int other = ToOther(replica);
  if (other < 0) return Self(replica);
  return others_->Retarget(other, endpoint);
}

std::optional<WritableFrame> OtherReplicas::ReservePayload(int replica, size_t bytes) {
  const int other = ToOther(replica);
  if (other < 0) return std::nullopt;
  return others_->shared_memory()->ReservePayload(other, bytes);
}

bool OtherReplicas::ActiveWith(int replica) const {
  const int other = ToOther(replica);
  return other >= 0 && others_->shared_memory()->ActiveWith(other);
}

size_t OtherReplicas::ring_bytes() const { return others_->shared_memory()->ring_bytes(); }

void OtherReplicas::RenewLink(int replica) {
  const int other = ToOther(replica);
  if (other >= 0) others_->shared_memory()->RenewLink(other);
}

Status OtherReplicas::ShardHealth(int replica) const {
  const int other = ToOther(replica);
  if (other < 0) return Status::Ok();
  return others_->health()->ShardHealth(other);
}

std::unique_ptr<ClientTransport> NoOtherReplicas() {
  class None final : public ClientTransport {
   public:
    int num_shards() const override { return 0; }
    Status Send(int replica, Message) override { return Refuse(replica); }
    Result<std::optional<std::pair<int, Message>>> Receive(std::chrono::milliseconds) override {
      return std::optional<std::pair<int, Message>>();
    }
    void Wake() override {}
    Status Reconnect(int replica) override { return Refuse(replica); }
    Status Retarget(int replica, const std::string&) override { return Refuse(replica); }

   private:
    static Status Refuse(int replica) {
      return FailedPrecondition("a group of one has no replica " + std::to_string(replica));
    }
  };
  return std::make_unique<None>();
}

}  // namespace leash::server

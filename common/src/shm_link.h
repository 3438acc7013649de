// The shared-memory side protocol of the ZeroMQ transport, on top of shm_segment.h: a
// client offers each shard a segment, the shard maps it and answers, and from then on
// large frames of a message travel in the segment while the message on the socket keeps
// an empty frame in their place and gains a trailer saying where they are. Nothing here
// touches a socket: the adapter passes frames' bytes in and sends what comes out, so the
// protocol is tested on its own (shm_link_test.cc).
//
// Messages of the protocol (never seen above the transport). A FlatBuffers envelope
// starts with its root offset, which is never 0xff..., so these cannot be taken for one:
//   offer    client -> shard, alone: magic, version u32, token u64, segment name
//   answer   shard -> client, alone: magic, accepted u32 (1/0), token u64, reason
//   trailer  the last frame of a message some of whose frames are in the segment:
//            magic, token u64, name length u16, count u16, reserved u32, name, then per
//            frame: index u32, generation u32, offset u64, size u64.
//
// Thread-safety: ClientLink is thread-safe; ServerLinks is used by one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "leash/common/message.h"
#include "leash/common/status.h"
#include "leash/common/transport.h"
#include "shm_segment.h"

namespace leash::shm {

bool IsOffer(const void* data, size_t size);
bool IsAnswer(const void* data, size_t size);

// Where the frames of one message lie in a segment.
struct Trailer {
  uint64_t token = 0;
  std::string name;
  std::vector<std::pair<uint32_t, Descriptor>> frames;  // message frame index, where it is
};
std::string EncodeTrailer(uint64_t token, const std::string& name,
                          const std::vector<std::pair<uint32_t, Descriptor>>& frames);
// A trailer whose sizes add up (its descriptors on `ring`), or nullopt: then the frame is
// an ordinary payload.
std::optional<Trailer> DecodeTrailer(const void* data, size_t size, uint32_t ring);

// Frames of a message that went into the segment: the sender leaves message[i] empty on
// the socket for every frames[k].first == i, and appends `trailer` as the last frame.
struct Placement {
  std::vector<std::pair<uint32_t, Descriptor>> frames;
  std::string trailer;
};

// A client's side of one connection: its segment, offered to the shard; ring 0 is
// written here, ring 1 read.
class ClientLink {
 public:
  enum State { kOff = 0, kOffered = 1, kOn = 2 };

  // Creates the segment (rings of at most `ring_bytes`, reserved in /dev/shm as frames
  // need them); if that fails the link stays off (and says so in the log). `who` names
  // the shard in logs.
  ClientLink(size_t ring_bytes, size_t min_frame_bytes, std::string who);
  // A link that is off for good (shared memory not wanted).
  ClientLink() = default;

  State state() const { return static_cast<State>(state_.load()); }
  bool on() const { return state() == kOn; }
  // The offer to send (again, after a reconnect) while the shard has not answered it.
  std::optional<std::string> Offer() const;
  // The shard's answer: accepted, the link is on; refused (or a shard that no longer reads
  // the segment), the link is off for good.
  void OnAnswer(const void* data, size_t size);
  // Room for `bytes` in ring 0, for a payload sent (and resent) on this link only.
  std::optional<WritableFrame> Reserve(size_t bytes);
  // Puts the large payload frames (index >= 1) of `message` into ring 0 (in place when
  // Reserve() made them), or nullopt if none went.
  std::optional<Placement> Place(const Message& message);
  // Fills the frames of a reply that `t` names (borrowed in place). Frames that cannot
  // be read stay empty, and the error says why.
  Status Fill(const Trailer& t, Message* message) const;
  // Bytes of ring 0 (client -> shard) reserved in /dev/shm so far.
  size_t reserved_bytes() const;

 private:
  // Frames still in flight keep the segment mapped; its name goes with the last one.
  void TurnOff();
  // Logs (at most once a minute) why ring 0 could not grow, if it just failed to. Under mu_.
  void NoteGrowthError();

  // Granules a shard has not given back after this long are taken back: it died (or
  // restarted) before reading the frame, or will find it gone and fail that request.
  static constexpr int64_t kReclaimMs = 60000;

  std::string who_;
  size_t min_frame_bytes_ = 0;
  std::atomic<int> state_{kOff};
  mutable std::mutex mu_;  // guards segment_ and writer_ (sends and reservations may race)
  std::shared_ptr<ShmSegment> segment_;
  std::unique_ptr<ShmWriter> writer_;
  int64_t last_warn_ms_ = -60000;  // under mu_
};

// A shard's side: the segments of its clients on this host, mapped on their offers (or
// their first trailer, after a restart); ring 1 of each carries the shard's large replies.
class ServerLinks {
 public:
  // `enabled` false: every offer is declined.
  ServerLinks(bool enabled, size_t min_frame_bytes);

  // The answer to `peer`'s offer (the offer's bytes).
  std::string AnswerOffer(const PeerId& peer, const void* data, size_t size);
  // Keeps `peer`'s segment alive and fills the frames `trailer` (if any) names, copied
  // out. Returns an answer to send `peer` when the trailer names a segment this shard
  // cannot read (the client then stops using it; this request fails its size checks).
  std::optional<std::string> OnMessage(const PeerId& peer, const Trailer* trailer,
                                       Message* message);
  // True while no client's segment is mapped.
  bool empty() const { return links_.empty(); }
  // Room for `bytes` in `peer`'s ring 1, for a payload sent to `peer` only.
  std::optional<WritableFrame> Reserve(const PeerId& peer, size_t bytes);
  // Puts the large payload frames of a reply to `peer` into its ring, or nullopt.
  std::optional<Placement> Place(const PeerId& peer, const Message& message);

  uint64_t frames_received() const { return frames_received_.load(); }
  uint64_t frames_sent() const { return frames_sent_.load(); }
  // Bytes of `peer`'s ring 1 (shard -> client) this shard reserved in /dev/shm so far.
  size_t reserved_bytes(const PeerId& peer);

 private:
  struct Link {
    std::shared_ptr<ShmSegment> segment;
    std::unique_ptr<ShmWriter> writer;
    int64_t last_used_ms = 0;
  };
  // Segments not used for this long are unmapped (their clients left or died; a live
  // client sends heartbeats far more often, and a client idle for longer has its
  // segment mapped again from its next trailer).
  static constexpr int64_t kIdleMs = 30000;

  // The segment `peer`'s replies go through, or nullptr.
  Link* LinkOf(const PeerId& peer);
  // Maps (or finds) the segment `name` holding `token`; nullptr and the reason if not.
  Link* Map(const std::string& name, uint64_t token, Status* why);
  // Warns if `link`'s ring 1 just failed to grow.
  void NoteGrowthError(Link& link);
  void Warn(const std::string& what);

  bool enabled_;
  size_t min_frame_bytes_;
  std::map<std::string, Link> links_;    // by segment name
  std::map<PeerId, std::string> peers_;  // peer -> the segment its replies use
  std::atomic<uint64_t> frames_received_{0};
  std::atomic<uint64_t> frames_sent_{0};
  int64_t last_sweep_ms_ = 0;
  int64_t last_warn_ms_ = -60000;
};

}  // namespace leash::shm

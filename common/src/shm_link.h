// The shared-memory side protocol of the ZeroMQ transport, on top of shm_segment.h: a
// client offers each shard a segment, the shard maps it and answers, and from then on
// large frames of a message travel in the segment while the message on the socket keeps
// an empty frame in their place and gains a trailer saying where they are; when both ends
// agree, whole messages travel in the segment's queues as well (below). Nothing here
// touches a socket: the adapter passes frames' bytes in and sends what comes out, so the
// protocol is tested on its own (shm_link_test.cc).
//
// Messages of the protocol (never seen above the transport). A FlatBuffers envelope
// starts with its root offset, which is never 0xff..., so these cannot be taken for one:
//   offer    client -> shard, alone: magic, version u32, token u64, flags u32 (bit 0: the
//            client would send whole messages through the segment; bit 1: the shard may
//            read the client's frames in place, the client never takes ring room back),
//            segment name
//   answer   shard -> client, alone: magic, accepted u32 (0 no, 1 frames, 2 frames and
//            messages), token u64, reason
//   notice   client -> shard, alone: magic, token u64, kind u32, segment name. A *resume*
//            notice (kind 0): every message after this one comes through the segment's
//            queue (the first switch, and the end of each detour, below). A *hello* (kind 1)
//            names the connection it comes on as this client's, and nothing else: sent
//            after each handshake (so that a restarted shard finds the queue) and before
//            each detoured message (so that the shard knows it, whatever connection it is on)
//   trailer  the last frame of a message some of whose frames are in the segment:
//            magic, token u64, name length u16, count u16, reserved u32, name, then per
//            frame: index u32, generation u32, offset u64, size u64.
//
// Thread-safety: ClientLink is thread-safe; ServerLinks is used by one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
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
bool IsNotice(const void* data, size_t size);

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

// Whole messages through the segment ("messages"): once both ends agreed (the offer's flag,
// the answer's 2) the client sends the notice on the socket, and from then on every message
// of the connection, both ways, is a record in the segment's queues (ShmSegment::Enqueue)
// and the reader is woken by its bell, without ZeroMQ's I/O threads. The socket still
// carries the handshake, the notice and the protocol's answers. A record holds the frames
// exactly as they would go on the socket (the large ones empty, the trailer last):
//   count u32, then per frame: size u32, bytes.
// A record of no frames is a pause. A client whose message finds no room in the ring takes
// a detour: it queues a pause, sends the message on the socket, then the notice. The shard
// reads its queue up to the pause, then what came on the socket up to the notice, then the
// queue again, so it still reads everything in the order sent. A shard's reply that finds
// no room goes on the socket (a client matches replies by their request, in any order).
std::string EncodeRecord(const Message& frames);
bool IsPause(const uint8_t* data, size_t size);
// The last record of a client that closes its link (count 0xffffffff): the shard lets the
// segment and its bells go at once instead of when it finds the client gone.
bool IsBye(const uint8_t* data, size_t size);
Result<Message> DecodeRecord(const uint8_t* data, size_t size);
// The frames of `message` as they go on the socket when `p` placed some in the ring.
Message OnTheWire(const Message& message, const std::optional<Placement>& p);

// A client's side of one connection: its segment, offered to the shard; ring 0 is
// written here, ring 1 read.
class ClientLink {
 public:
  enum State { kOff = 0, kOffered = 1, kOn = 2 };

  // Creates the segment (rings of at most `ring_bytes`, reserved in /dev/shm as frames
  // need them); if that fails the link stays off (and says so in the log). `who` names
  // the shard in logs.
  // `messages`: offer to send whole messages through the segment as well.
  // `lend`: offer the shard to read this client's frames in place (ShmSegment::Borrow), each
  // one's room given back when the shard lets the frame go, not when it copied it out. The
  // ring then never takes room back (a shard process that dies holding frames keeps their
  // room until Renew()): for a reader that lets every frame go at once, as a backup replica
  // does once it applied an entry.
  ClientLink(size_t ring_bytes, size_t min_frame_bytes, std::string who, bool messages = false,
             bool lend = false);
  // A link that is off for good (shared memory not wanted).
  ClientLink() = default;
  // Queues a bye when messages are on, so that the shard closes its end at once.
  ~ClientLink();
  ClientLink(const ClientLink&) = delete;
  ClientLink& operator=(const ClientLink&) = delete;

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
  // A new segment, to offer a new shard process (the client was retargeted): the old one
  // is left to the old process, which may still read its queue. Until the new offer is
  // answered everything goes through the socket.
  void Renew();

  // Messages through the segment. The caller orders these against its socket sends (one
  // lock): once TakeNotice() returned the notice, every later message goes through Post.
  // The notice to send when the shard agreed to messages and they are not on yet (they are
  // from now on), or nullopt.
  std::optional<std::string> TakeNotice();
  // Notice() or Hello().
  std::optional<std::string> MakeNotice(uint32_t kind) const;
  // While messages are on: the resume notice (ends a detour), and the hello (after a
  // handshake, and before a detoured message).
  std::optional<std::string> Notice() const;
  std::optional<std::string> Hello() const;
  bool messages() const { return messages_on_.load(); }
  // Sends `message` (its large frames placed by `p`) as a record of queue 0 and rings the
  // shard's bell if it dozes: true. False when the record found no room in the ring: a
  // pause was queued, and the caller sends Hello(), the message on the socket, then Notice().
  // Unavailable if the queue is full (the shard does not read it).
  Result<bool> Post(const Message& message, const std::optional<Placement>& p);
  // The receiving side of queue 1 (replies), for one thread: the bell to poll, Doze()
  // before polling it (false: a reply is there, do not wait), Wake() after.
  int bell_fd() const;
  bool Doze();
  void Wake();
  // The next reply in queue 1 (its frames filled from the ring), or nullopt.
  Result<std::optional<Message>> Take();

 private:
  // Frames still in flight keep the segment mapped; its name goes with the last one.
  void TurnOff();
  // Creates the segment (and its bells when messages are wanted). Under mu_.
  void Start();
  // Queues a record of no frames, a pause or a bye (shm_link.cc), and rings the shard's bell
  // if it dozes. False if the queue is full or there is none. Under mu_.
  bool QueueMark(uint32_t mark);
  // Logs (at most once a minute) why ring 0 could not grow, if it just failed to. Under mu_.
  void NoteGrowthError();

  // Granules a shard has not given back after this long are taken back: it died (or
  // restarted) before reading the frame, or will find it gone and fail that request.
  static constexpr int64_t kReclaimMs = 60000;

  std::string who_;
  size_t min_frame_bytes_ = 0;
  size_t ring_bytes_ = 0;  // 0: shared memory not wanted
  bool messages_wanted_ = false;
  bool lend_ = false;
  std::atomic<int> state_{kOff};
  mutable std::mutex mu_;  // guards segment_ and writer_ (sends and reservations may race)
  std::shared_ptr<ShmSegment> segment_;
  std::unique_ptr<ShmWriter> writer_;
  int64_t last_warn_ms_ = -60000;  // under mu_
  // Bells: 0 rings the shard, 1 wakes this client. Kept for the link's life (a receiving
  // thread may be polling one while the link turns off).
  std::unique_ptr<Bell> bells_[2];                    // under mu_
  std::vector<std::unique_ptr<Bell>> retired_bells_;  // of segments before Renew(), under mu_
  std::atomic<bool> messages_agreed_{false};          // the shard answered 2
  std::atomic<bool> messages_on_{false};              // the notice was taken
};

// A shard's side: the segments of its clients on this host, mapped on their offers (or
// their first trailer, after a restart); ring 1 of each carries the shard's large replies.
class ServerLinks {
 public:
  // `enabled` false: every offer is declined. `messages`: clients that offer may send
  // whole messages through their segments.
  ServerLinks(bool enabled, size_t min_frame_bytes, bool messages = false);

  // The answer to `peer`'s offer (the offer's bytes), from a client authenticated as `user`
  // (empty without CURVE).
  std::string AnswerOffer(const PeerId& peer, const void* data, size_t size,
                          const std::string& user = "");
  // Which clients that offer to lend their frames (ClientLink's `lend`) have them read in
  // place: those authenticated as `user`, any client ("*"), or none ("", the default: frames
  // are copied out, checked, and a client cannot change them afterwards). In place, the
  // lender could change a frame after the shard checked it: only peers trusted with the
  // shard's state may lend (a replicated shard's replicas).
  void set_lenders(std::string user) { lenders_ = std::move(user); }
  // True: the frames of clients that do not lend are read in place too, marked
  // Frame::unstable() (the client may still change them): the shard copies them once where
  // it needs them (a replicated primary straight into its backups' rings). False (the
  // default): they are copied out and checked on receipt.
  void set_borrow_all(bool on) { borrow_all_ = on; }
  // A client's notice (its bytes, from `peer` authenticated as `user`): from now on its
  // messages come from the segment's queue 0, as from ChannelPeer(token), and the replies
  // to that peer go to queue 1. An answer to send `peer` if this shard cannot read it.
  std::optional<std::string> OnNotice(const PeerId& peer, const std::string& user, const void* data,
                                      size_t size);
  // A message that came on the socket from the client of a queue being read: held (true)
  // until the queue's pause, so that it is taken in the order the client sent it.
  bool Hold(Inbound& in);
  // The peer a client's messages through the segment come from.
  static PeerId ChannelPeer(uint64_t token);
  // That peer for the client whose connection `socket_peer` is (a notice came on it), while
  // its queue is read; nullopt otherwise. A reply addressed to the connection (to a request
  // that came on the socket before the client switched, or to a connection noted then) goes
  // through the queue as well: the client reads both, and matches replies by request.
  std::optional<PeerId> QueuePeerOf(const PeerId& socket_peer) const;
  static bool IsChannelPeer(const PeerId& peer);
  // The bells of the queues read, to poll; Doze() before polling them (false: a message is
  // there, do not wait), Wake() after, with which of them rang (in AddBells' order): only
  // those are read, so a wake-up costs one read however many clients there are.
  void AddBells(std::vector<int>* fds) const;
  bool Doze();
  void Wake(const std::vector<bool>& rang);
  // The next message of a queue read (round-robin over clients), or nullopt. A queue found
  // corrupt is no longer read (and the error logged).
  std::optional<Inbound> Take();
  // A reply to a channel peer: `message` as a record of its queue 1 (nullopt). When the
  // queue or the ring has no room: the routing id and frames to send on the socket instead.
  // Unavailable if the client is gone.
  Result<std::optional<std::pair<PeerId, Message>>> Post(const PeerId& peer,
                                                         const Message& message);
  // Keeps `peer`'s segment alive and fills the frames `trailer` (if any) names, copied
  // out. Returns an answer to send `peer` when the trailer names a segment this shard
  // cannot read (the client then stops using it; this request fails its size checks).
  // Sets *stale when a frame was sent again since (this message is an older copy of one
  // that follows): the caller drops it.
  std::optional<std::string> OnMessage(const PeerId& peer, const Trailer* trailer, Message* message,
                                       bool* stale = nullptr);
  // Segments not used for this long are unmapped (their clients left or died; a live
  // client sends heartbeats far more often, and a client idle for longer has its
  // segment mapped again from its next trailer).
  static constexpr int64_t kIdleMs = 30000;
  static constexpr int64_t kSweepMs = 1000;

  // Lets go of the segments (and their bells) of clients that said bye or are gone: when one
  // said bye, otherwise at most every kSweepMs. The transport calls it on every turn.
  void Sweep(int64_t now_ms);
  // Messages dropped as older copies of ones sent again (their frames restamped).
  uint64_t stale_dropped() const { return stale_dropped_; }
  // True while no client's segment is mapped.
  bool empty() const { return links_.empty(); }
  // Room for `bytes` in `peer`'s ring 1, for a payload sent to `peer` only.
  std::optional<WritableFrame> Reserve(const PeerId& peer, size_t bytes);
  // Puts the large payload frames of a reply to `peer` into its ring, or nullopt.
  std::optional<Placement> Place(const PeerId& peer, const Message& message);

  uint64_t frames_received() const { return frames_received_.load(); }
  // Of those, frames read in place (the client lends them: Frame::lent).
  uint64_t frames_lent() const { return frames_lent_.load(); }
  uint64_t frames_sent() const { return frames_sent_.load(); }
  uint64_t messages_received() const { return messages_received_.load(); }
  uint64_t messages_sent() const { return messages_sent_.load(); }
  // Bytes of `peer`'s ring 1 (shard -> client) this shard reserved in /dev/shm so far.
  size_t reserved_bytes(const PeerId& peer);
  // How frames are copied out of the clients' rings (ServerTransport::SetFrameCopier); null:
  // Frame::CopyCheckingFinite.
  void set_copier(FrameCopier copier) { copier_ = std::move(copier); }

 private:
  struct Link {
    std::shared_ptr<ShmSegment> segment;
    std::unique_ptr<ShmWriter> writer;
    int64_t last_used_ms = 0;
    // Messages through the segment: bells (0 wakes this shard, 1 rings the client), and
    // once the notice came, its queue 0 is read, as `peer` authenticated as `user`.
    std::unique_ptr<Bell> bells[2];
    bool reading = false;
    PeerId peer;
    std::string user;
    PeerId socket_peer;                // the connection the last notice came on
    std::vector<PeerId> socket_peers;  // every connection a notice came on (in by_socket_)
    // After a pause: what came on the socket meanwhile, in order, up to the notice
    // (a Held without a message) that resumes the queue.
    bool paused = false;
    bool closed = false;  // its client said bye
    bool borrow = false;  // its client lends its frames: read in place, not copied out
    struct Held {
      std::optional<Inbound> in;  // none: the notice
    };
    std::deque<Held> held;
  };
  // The segment `peer`'s replies go through, or nullptr.
  Link* LinkOf(const PeerId& peer);
  // Maps (or finds) the segment `name` holding `token`; nullptr and the reason if not.
  Link* Map(const std::string& name, uint64_t token, Status* why);
  // Opens `link`'s bells if they are not open; false if it has none.
  bool OpenBells(Link& link);
  // The next message of `link`'s queue 0; nullopt if none; stops reading it if corrupt.
  std::optional<Inbound> TakeFrom(Link& link);
  // Warns if `link`'s ring 1 just failed to grow.
  void NoteGrowthError(Link& link);
  void Warn(const std::string& what);

  bool enabled_;
  bool messages_;
  size_t min_frame_bytes_;
  std::map<std::string, Link> links_;    // by segment name
  std::map<PeerId, std::string> peers_;  // peer -> the segment its replies use
  std::atomic<uint64_t> frames_received_{0};
  std::atomic<uint64_t> frames_lent_{0};
  std::atomic<uint64_t> frames_sent_{0};
  std::atomic<uint64_t> messages_received_{0};
  uint64_t stale_dropped_ = 0;
  FrameCopier copier_;
  std::string lenders_;  // set_lenders
  bool borrow_all_ = false;
  const FrameCopier* copier() const { return copier_ ? &copier_ : nullptr; }
  std::atomic<uint64_t> messages_sent_{0};
  int64_t last_sweep_ms_ = 0;
  bool sweep_due_ = false;
  int64_t last_warn_ms_ = -60000;
  std::vector<Link*> reading_;         // links whose queue 0 is read, in turn
  std::map<PeerId, Link*> by_socket_;  // socket_peer -> its link, for Hold
  size_t next_ = 0;                    // the next of reading_ to read first
};

}  // namespace leash::shm

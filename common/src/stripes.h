// Striping (ZmqOptions::stripes): a large message split over several connections of one
// client and shard, each served by its own ZeroMQ I/O thread, and put back together, in
// order, on the other side. Private to the ZeroMQ transport (common/src). The shard and the
// client above the transport see whole messages in the order they were sent, so
// exactly-once and the staleness bound do not know striping exists.
//
// The protocol. A client that stripes opens `count` DEALER sockets to a shard, each with the
// routing id StripeRoutingId(token, index, count); connection 0 is the main one and carries
// every message that is not striped. A striped message of total payload T bytes (all its
// frames end to end) becomes `count` parts, part k carrying the bytes from about T*k/count
// to about T*(k+1)/count, each boundary moved back to a 64-byte multiple within the frame
// it cuts (so that every slice of a frame starts on a whole float32), behind a header;
// part 0 travels on the main connection, in the message order, and the other parts on
// their own connections, sent before it. The receiver copies each part into one buffer
// for the message (its frames 64-byte aligned in it), a shard's learning in the same pass
// whether each frame is finite float32s (CopyAllFinite: it then does not read a pushed
// gradient again to check it), and delivers the message when every part is there; messages
// behind a part 0 on the main connection wait for it, so the order holds. A message whose
// parts do not all arrive within the timeout (a connection dropped under it) is dropped
// and counted, as a message on a dropped connection is: the client resends what was not
// answered, and the shard's exactly-once records make a resend safe. A shard answers a
// striped client's large replies the same way, over the routing ids the client's own id
// names. Thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "leash/common/message.h"
#include "leash/common/status.h"

namespace leash::stripes {

inline constexpr uint32_t kMaxStripes = 16;
// The most frames a striped message has (its parts' headers list their sizes); a message
// with more goes whole.
inline constexpr uint32_t kMaxFrames = 4096;

// A striping client's routing id for connection `index` of `count`: "LSTP", the token
// (little-endian), index, count. 14 bytes; never starts with the zero byte ZeroMQ reserves
// for the ids it makes up.
std::string RoutingId(uint64_t token, uint32_t index, uint32_t count);
struct Route {
  uint64_t token = 0;
  uint32_t index = 0;
  uint32_t count = 0;
};
// The route of a striping client's routing id; nullopt for any other id.
std::optional<Route> ParseRoutingId(std::string_view id);

// Whether `message` goes striped: at least `min_bytes` in all and at most kMaxFrames frames.
bool Worth(const Message& message, int64_t min_bytes);

// The parts of `message` striped `count` ways as message number `seq` of its stream: part k
// is a header frame and the slices of the message's frames that fall in its byte range,
// sharing their storage (no copy). count >= 2; message.size() <= kMaxFrames.
std::vector<Message> Split(const Message& message, uint64_t seq, uint32_t count);

// Whether `frame` (a message's first frame) is a part header.
bool IsPart(const Frame& frame);

// One ordered stream of messages (a client's messages to a shard, or a shard's replies to
// a client) with its striped messages put back together.
class Assembler {
 public:
  // `max_bytes`: the most bytes of incomplete messages held; a part that would pass it is
  // dropped (and counted). `timeout_ms`: how long an incomplete message is waited for.
  // `check_finite`: copy whole float32s with CopyAllFinite, so that a frame of finite ones
  // arrives finite_f32() (a shard's, for the pushes it would check again); else memcpy (a
  // client's: nothing reads the mark on a reply, and memcpy copies faster).
  Assembler(size_t max_bytes, int64_t timeout_ms, bool check_finite = false)
      : max_bytes_(max_bytes), timeout_ms_(timeout_ms), check_finite_(check_finite) {}

  // A message from the main connection: a whole message or a part 0. InvalidArgument for a
  // malformed part (the part is dropped; the stream goes on).
  Status OnMain(Message m, int64_t now_ms);
  // A part from connection `index` (>= 1) of the stream.
  Status OnPart(Message m, uint32_t index, int64_t now_ms);
  // The next message in order, when it is complete; drops a first message waited for past
  // the timeout, and parts whose part 0 never came.
  std::optional<Message> Pop(int64_t now_ms);

  bool idle() const { return order_.empty() && partial_.empty(); }
  // Messages dropped because a part did not come in time, or would have passed max_bytes.
  uint64_t dropped() const { return dropped_; }
  // Striped messages put back together and delivered.
  uint64_t assembled() const { return assembled_; }
  size_t held_bytes() const { return held_; }

 private:
  struct Partial {
    std::shared_ptr<uint8_t[]> buffer;
    std::vector<uint64_t> sizes;    // the frames' sizes
    std::vector<uint64_t> offsets;  // where each frame starts in buffer (64-byte aligned)
    uint64_t total = 0;             // the frames' bytes end to end
    uint64_t received = 0;
    // Bytes of each frame copied in with CopyAllFinite finding them finite float32s: all
    // of a frame's, and the delivered frame is finite_f32() (the shard skips its check).
    std::vector<uint64_t> finite_bytes;
    uint32_t count = 0;
    uint64_t seen = 0;  // bit k: part k arrived
    int64_t since_ms = 0;
    size_t held = 0;  // buffer bytes
  };
  struct Slot {
    std::optional<Message> whole;  // or the striped message `seq`
    uint64_t seq = 0;
  };
  Status Add(const Message& m, uint32_t index, int64_t now_ms, uint64_t* seq);
  void Forget(std::map<uint64_t, Partial>::iterator it);
  void ExpireOrphans(int64_t now_ms);

  size_t max_bytes_;
  int64_t timeout_ms_;
  bool check_finite_;
  std::deque<Slot> order_;
  std::map<uint64_t, Partial> partial_;
  size_t held_ = 0;
  uint64_t dropped_ = 0;
  uint64_t assembled_ = 0;
  int64_t swept_ms_ = 0;
};

}  // namespace leash::stripes

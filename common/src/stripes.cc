// Striping: routing ids, splitting, and putting messages back together. See stripes.h.
#include "stripes.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "le_bytes.h"
#include "leash/common/finite.h"

namespace leash::stripes {
namespace {

constexpr char kIdPrefix[4] = {'L', 'S', 'T', 'P'};
constexpr size_t kIdBytes = 14;
constexpr char kMagic[8] = {'L', 'S', 'T', 'R', 'I', 'P', 'E', '1'};
// magic, seq, index, count, offset, length, frame count, reserved; then the frame sizes.
constexpr size_t kHeadBytes = 48;
constexpr uint64_t kAlign = 64;

using le_bytes::Get;
using le_bytes::Put;

// Where part `index` of `count` begins, end to end over frames of `sizes` (`total` bytes
// in all): the count-th share, moved back to a 64-byte multiple within the frame it falls
// in, so that a frame's slices start on whole float32s and the receiver can check them as
// it copies. Never decreasing in `index`; 0 for index 0, total for index count.
uint64_t SliceBegin(const std::vector<uint64_t>& sizes, uint64_t total, uint32_t index,
                    uint32_t count) {
  const uint64_t share = total * index / count;
  uint64_t at = 0;  // where frame f starts, end to end
  for (uint64_t s : sizes) {
    if (share < at + s) return at + (share - at) / kAlign * kAlign;
    at += s;
  }
  return total;
}

struct Header {
  uint64_t seq = 0;
  uint32_t index = 0;
  uint32_t count = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
};

Result<Header> Parse(const Frame& f) {
  if (!IsPart(f)) return InvalidArgument("not a stripe header");
  const uint8_t* p = f.data();
  Header h;
  h.seq = Get<uint64_t>(p + 8);
  h.index = Get<uint32_t>(p + 16);
  h.count = Get<uint32_t>(p + 20);
  h.offset = Get<uint64_t>(p + 24);
  h.length = Get<uint64_t>(p + 32);
  const auto frames = Get<uint32_t>(p + 40);
  if (h.count < 2 || h.count > kMaxStripes || h.index >= h.count)
    return InvalidArgument("stripe header: part " + std::to_string(h.index) + " of " +
                           std::to_string(h.count) + " (2 to " + std::to_string(kMaxStripes) +
                           " parts)");
  if (frames == 0 || frames > kMaxFrames || f.size() != kHeadBytes + size_t{frames} * 8)
    return InvalidArgument("stripe header: " + std::to_string(frames) + " frames in " +
                           std::to_string(f.size()) + " bytes");
  for (uint32_t i = 0; i < frames; ++i) {
    uint64_t s = Get<uint64_t>(p + kHeadBytes + size_t{i} * 8);
    if (s > (uint64_t{1} << 40) || h.total + s < h.total)
      return InvalidArgument("stripe header: a frame of " + std::to_string(s) + " bytes");
    h.sizes.push_back(s);
    h.total += s;
  }
  const uint64_t begin = SliceBegin(h.sizes, h.total, h.index, h.count);
  const uint64_t end = SliceBegin(h.sizes, h.total, h.index + 1, h.count);
  if (h.offset != begin || h.length != end - begin)
    return InvalidArgument("stripe header: part " + std::to_string(h.index) + " holds bytes [" +
                           std::to_string(h.offset) + ", +" + std::to_string(h.length) + ") of " +
                           std::to_string(h.total) + ", not its share");
  return h;
}

}  // namespace

std::string RoutingId(uint64_t token, uint32_t index, uint32_t count) {
  std::string id(kIdPrefix, sizeof kIdPrefix);
  Put(&id, token);
  id.push_back(static_cast<char>(index));
  id.push_back(static_cast<char>(count));
  return id;
}

std::optional<Route> ParseRoutingId(std::string_view id) {
  if (id.size() != kIdBytes || std::memcmp(id.data(), kIdPrefix, sizeof kIdPrefix) != 0)
    return std::nullopt;
  Route r;
  r.token = Get<uint64_t>(reinterpret_cast<const uint8_t*>(id.data()) + 4);
  r.index = static_cast<uint8_t>(id[12]);
  r.count = static_cast<uint8_t>(id[13]);
  if (r.count < 2 || r.count > kMaxStripes || r.index >= r.count) return std::nullopt;
  return r;
}

bool Worth(const Message& message, int64_t min_bytes) {
  return message.size() <= kMaxFrames && static_cast<int64_t>(MessageBytes(message)) >= min_bytes;
}

bool IsPart(const Frame& f) {
  return f.size() >= kHeadBytes && std::memcmp(f.data(), kMagic, sizeof kMagic) == 0;
}

std::vector<Message> Split(const Message& message, uint64_t seq, uint32_t count) {
  uint64_t total = 0;
  std::vector<uint64_t> sizes;
  sizes.reserve(message.size());
  for (const Frame& f : message) {
    total += f.size();
    sizes.push_back(f.size());
  }
  std::vector<Message> parts;
  parts.reserve(count);
  for (uint32_t k = 0; k < count; ++k) {
    const uint64_t begin = SliceBegin(sizes, total, k, count);
    const uint64_t end = SliceBegin(sizes, total, k + 1, count);
    std::string head(kMagic, sizeof kMagic);
    Put(&head, seq);
    Put(&head, k);
    Put(&head, count);
    Put(&head, begin);
    Put(&head, end - begin);
    Put(&head, static_cast<uint32_t>(message.size()));
    Put(&head, uint32_t{0});
    for (const Frame& f : message) Put(&head, static_cast<uint64_t>(f.size()));
    Message part;
    part.push_back(Frame::Copy(head));
    uint64_t at = 0;  // where frame f starts, end to end
    for (const Frame& f : message) {
      const uint64_t lo = std::max(at, begin);
      const uint64_t hi = std::min(at + f.size(), end);
      if (lo < hi) part.push_back(Frame::Wrap(f.data() + (lo - at), hi - lo, f.owner()));
      at += f.size();
    }
    parts.push_back(std::move(part));
  }
  return parts;
}

Status Assembler::Add(const Message& m, uint32_t index, int64_t now_ms, uint64_t* seq) {
  if (m.empty()) return InvalidArgument("an empty stripe part");
  LEASH_ASSIGN_OR_RETURN(Header h, Parse(m[0]));
  if (h.index != index)
    return InvalidArgument("stripe part " + std::to_string(h.index) + " came on connection " +
                           std::to_string(index));
  uint64_t carried = 0;
  for (size_t i = 1; i < m.size(); ++i) carried += m[i].size();
  if (carried != h.length)
    return InvalidArgument("stripe part " + std::to_string(h.index) + " carries " +
                           std::to_string(carried) + " bytes, its header says " +
                           std::to_string(h.length));
  *seq = h.seq;
  auto it = partial_.find(h.seq);
  if (it == partial_.end()) {
    Partial p;
    p.sizes = h.sizes;
    p.total = h.total;
    p.count = h.count;
    p.since_ms = now_ms;
    uint64_t at = 0;
    for (uint64_t s : p.sizes) {
      p.offsets.push_back(at);
      at += (s + kAlign - 1) / kAlign * kAlign;
    }
    p.held = static_cast<size_t>(std::max<uint64_t>(at, 1));
    p.finite_bytes.assign(p.sizes.size(), 0);
    if (held_ + p.held > max_bytes_) {
      ++dropped_;
      return ResourceExhausted("a striped message of " + std::to_string(h.total) +
                               " bytes would pass the " + std::to_string(max_bytes_) +
                               " bytes held for incomplete ones; dropped");
    }
    p.buffer = std::shared_ptr<uint8_t[]>(new uint8_t[p.held]);
    held_ += p.held;
    it = partial_.emplace(h.seq, std::move(p)).first;
  }
  Partial& p = it->second;
  if (p.count != h.count || p.sizes != h.sizes)
    return InvalidArgument("stripe part " + std::to_string(h.index) + " of message " +
                           std::to_string(h.seq) + " does not match its other parts");
  if (p.seen & (uint64_t{1} << h.index))
    return InvalidArgument("stripe part " + std::to_string(h.index) + " of message " +
                           std::to_string(h.seq) + " came twice");
  p.seen |= uint64_t{1} << h.index;
  // Copy the slices to where their bytes belong in the message's frames.
  uint64_t pos = h.offset;
  size_t frame = 0;
  uint64_t frame_at = 0;  // where `frame` starts, end to end
  for (size_t i = 1; i < m.size(); ++i) {
    const uint8_t* src = m[i].data();
    uint64_t left = m[i].size();
    while (left > 0) {
      while (frame_at + p.sizes[frame] <= pos) frame_at += p.sizes[frame++];
      const uint64_t n = std::min(left, frame_at + p.sizes[frame] - pos);
      uint8_t* dst = p.buffer.get() + p.offsets[frame] + (pos - frame_at);
      // Whole float32s (slices start on them: SliceBegin): copied and checked in one pass.
      if (check_finite_ && (pos - frame_at) % sizeof(float) == 0 && n % sizeof(float) == 0) {
        if (CopyAllFinite(dst, src, n)) p.finite_bytes[frame] += n;
      } else {
        std::memcpy(dst, src, n);
      }
      src += n;
      left -= n;
      pos += n;
    }
  }
  p.received += h.length;
  return Status::Ok();
}

Status Assembler::OnMain(Message m, int64_t now_ms) {
  if (m.empty() || !IsPart(m[0])) {
    order_.push_back({std::move(m), 0});
    return Status::Ok();
  }
  uint64_t seq = 0;
  LEASH_RETURN_IF_ERROR(Add(m, 0, now_ms, &seq));
  order_.push_back({std::nullopt, seq});
  return Status::Ok();
}

Status Assembler::OnPart(Message m, uint32_t index, int64_t now_ms) {
  if (index == 0) return InvalidArgument("stripe part from connection 0 taken as a side part");
  uint64_t seq = 0;
  return Add(m, index, now_ms, &seq);
}

void Assembler::Forget(std::map<uint64_t, Partial>::iterator it) {
  held_ -= it->second.held;
  partial_.erase(it);
}

void Assembler::ExpireOrphans(int64_t now_ms) {
  for (auto it = partial_.begin(); it != partial_.end();) {
    const Partial& p = it->second;
    if (p.received < p.total || p.seen != (uint64_t{1} << p.count) - 1) {
      if (now_ms - p.since_ms >= timeout_ms_) {
        ++dropped_;
        auto next = std::next(it);
        Forget(it);
        it = next;
        continue;
      }
    }
    ++it;
  }
}

std::optional<Message> Assembler::Pop(int64_t now_ms) {
  if (!partial_.empty() && now_ms - swept_ms_ >= std::max<int64_t>(1, timeout_ms_ / 2)) {
    swept_ms_ = now_ms;
    ExpireOrphans(now_ms);
  }
  while (!order_.empty()) {
    Slot& s = order_.front();
    if (s.whole) {
      Message m = std::move(*s.whole);
      order_.pop_front();
      return m;
    }
    auto it = partial_.find(s.seq);
    if (it == partial_.end()) {  // dropped (counted then)
      order_.pop_front();
      continue;
    }
    Partial& p = it->second;
    if (p.seen == (uint64_t{1} << p.count) - 1) {
      Message m;
      m.reserve(p.sizes.size());
      std::shared_ptr<const void> owner(p.buffer, p.buffer.get());
      for (size_t i = 0; i < p.sizes.size(); ++i) {
        m.push_back(Frame::CopiedCheckingFinite(
            Frame::Wrap(p.buffer.get() + p.offsets[i], p.sizes[i], owner),
            p.finite_bytes[i] == p.sizes[i]));
      }
      Forget(it);
      order_.pop_front();
      ++assembled_;
      return m;
    }
    if (now_ms - p.since_ms < timeout_ms_) return std::nullopt;
    ++dropped_;
    Forget(it);
    order_.pop_front();
  }
  return std::nullopt;
}

}  // namespace leash::stripes

// The shared-memory side protocol of the ZeroMQ transport; see shm_link.h.
#include "shm_link.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <iterator>

#include "le_bytes.h"

namespace leash::shm {
namespace {

constexpr char kOfferMagic[8] = {'\xff', 'L', 'S', 'H', 'M', 'H', 'E', 'L'};
constexpr char kAnswerMagic[8] = {'\xff', 'L', 'S', 'H', 'M', 'A', 'N', 'S'};
constexpr char kTrailerMagic[8] = {'\xff', 'L', 'S', 'H', 'M', 'T', 'R', 'L'};
constexpr size_t kTrailerHead = 8 + 8 + 2 + 2 + 4;
constexpr size_t kTrailerEntry = 4 + 4 + 8 + 8;
constexpr size_t kOfferHead = 8 + 4 + 8;   // magic, version, token; then the name
constexpr size_t kAnswerHead = 8 + 4 + 8;  // magic, accepted, token; then the reason

bool HasMagic(const void* data, size_t size, const char (&magic)[8]) {
  return size >= 8 && std::memcmp(data, magic, 8) == 0;
}

using le_bytes::Get;
using le_bytes::Put;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string EncodeAnswer(bool accepted, uint64_t token, const std::string& reason) {
  std::string a(kAnswerMagic, 8);
  Put(&a, static_cast<uint32_t>(accepted ? 1 : 0));
  Put(&a, token);
  a += reason;
  return a;
}

// Puts the large payload frames of `message` into `writer`'s ring (in place when they
// were reserved there).
std::optional<Placement> PlaceFrames(const Message& message, size_t min_bytes, ShmWriter& writer,
                                     const ShmSegment& segment) {
  Placement p;
  for (size_t i = 1; i < message.size(); ++i) {
    const Frame& f = message[i];
    if (f.size() < min_bytes) continue;
    std::optional<Descriptor> d = writer.Stamp(f);
    if (!d) d = writer.Put(f);
    if (!d) continue;  // no room now: this frame goes through the socket
    p.frames.emplace_back(static_cast<uint32_t>(i), *d);
  }
  if (p.frames.empty()) return std::nullopt;
  p.trailer = EncodeTrailer(segment.token(), segment.name(), p.frames);
  return p;
}

// Fills the frames a trailer names from `segment` (copied out, or borrowed in place).
// Frames that cannot be read stay empty, so the message fails its size checks above
// with a clear error instead of being taken for something else.
Status FillFrames(const Trailer& t, const std::shared_ptr<ShmSegment>& segment, bool copy,
                  Message* message) {
  Status first;
  for (const auto& [index, d] : t.frames) {
    if (index == 0 || index >= message->size() || !(*message)[index].empty()) {
      if (first.ok()) {
        first = InvalidArgument("shared-memory trailer names frame " + std::to_string(index));
      }
      continue;
    }
    Result<Frame> f = copy ? segment->CopyOut(d) : segment->Borrow(segment, d);
    if (!f.ok()) {
      if (first.ok()) first = f.status();
      continue;
    }
    (*message)[index] = std::move(*f);
  }
  return first;
}

std::optional<WritableFrame> ToWritable(std::optional<Frame> f) {
  if (!f) return std::nullopt;
  return WritableFrame{const_cast<uint8_t*>(f->data()), std::move(*f)};
}

}  // namespace

bool IsOffer(const void* data, size_t size) { return HasMagic(data, size, kOfferMagic); }
bool IsAnswer(const void* data, size_t size) { return HasMagic(data, size, kAnswerMagic); }

std::string EncodeTrailer(uint64_t token, const std::string& name,
                          const std::vector<std::pair<uint32_t, Descriptor>>& frames) {
  std::string out(kTrailerMagic, 8);
  Put(&out, token);
  Put(&out, static_cast<uint16_t>(name.size()));
  Put(&out, static_cast<uint16_t>(frames.size()));
  Put(&out, uint32_t{0});
  out += name;
  for (const auto& [index, d] : frames) {
    Put(&out, index);
    Put(&out, d.generation);
    Put(&out, d.offset);
    Put(&out, d.size);
  }
  return out;
}

std::optional<Trailer> DecodeTrailer(const void* data, size_t size, uint32_t ring) {
  if (!HasMagic(data, size, kTrailerMagic) || size < kTrailerHead) return std::nullopt;
  const auto* p = static_cast<const uint8_t*>(data);
  Trailer t;
  t.token = Get<uint64_t>(p + 8);
  auto name_len = Get<uint16_t>(p + 16);
  auto count = Get<uint16_t>(p + 18);
  if (size != kTrailerHead + name_len + size_t{count} * kTrailerEntry) return std::nullopt;
  t.name.assign(reinterpret_cast<const char*>(p + kTrailerHead), name_len);
  const uint8_t* e = p + kTrailerHead + name_len;
  for (uint16_t i = 0; i < count; ++i, e += kTrailerEntry) {
    Descriptor d;
    d.ring = ring;
    d.generation = Get<uint32_t>(e + 4);
    d.offset = Get<uint64_t>(e + 8);
    d.size = Get<uint64_t>(e + 16);
    t.frames.emplace_back(Get<uint32_t>(e), d);
  }
  return t;
}

// ------------------------------------------------------------------------------ client side

ClientLink::ClientLink(size_t ring_bytes, size_t min_frame_bytes, std::string who)
    : who_(std::move(who)), min_frame_bytes_(min_frame_bytes) {
  auto seg = ShmSegment::Create(ring_bytes);
  if (!seg.ok()) {
    spdlog::warn("shared memory with {} is off: {}", who_, seg.status().ToString());
    return;
  }
  segment_ = *seg;
  writer_ = std::make_unique<ShmWriter>(segment_, 0, kReclaimMs);
  state_.store(kOffered);
}

std::optional<std::string> ClientLink::Offer() const {
  if (state() != kOffered) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  if (!segment_) return std::nullopt;
  std::string h(kOfferMagic, 8);
  Put(&h, kVersion);
  Put(&h, segment_->token());
  h += segment_->name();
  return h;
}

void ClientLink::OnAnswer(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (size < kAnswerHead || !segment_ || Get<uint64_t>(p + 12) != segment_->token()) return;
  }
  bool accepted = Get<uint32_t>(p + 8) == 1;
  std::string reason(reinterpret_cast<const char*>(p + kAnswerHead), size - kAnswerHead);
  if (accepted && state() == kOffered) {
    Status st;
    std::string name;
    {
      std::lock_guard<std::mutex> lock(mu_);
      st = segment_->Activate();
      name = segment_->name();
    }
    if (!st.ok()) {
      spdlog::warn("shared memory with {} is off: {}", who_, st.ToString());
      TurnOff();
      return;
    }
    state_.store(kOn);
    spdlog::info("{} is on this host: frames of {} KiB and more go through shared memory {}", who_,
                 min_frame_bytes_ >> 10, name);
  } else if (!accepted) {
    if (state() == kOn) {
      spdlog::warn(
          "{} no longer reads this client's shared memory ({}): sending everything through the "
          "socket",
          who_, reason);
    } else {
      spdlog::debug("{} declined shared memory ({}): sending everything through the socket", who_,
                    reason);
    }
    TurnOff();
  }
}

void ClientLink::TurnOff() {
  state_.store(kOff);
  std::lock_guard<std::mutex> lock(mu_);
  writer_.reset();
  segment_.reset();
}

std::optional<WritableFrame> ClientLink::Reserve(size_t bytes) {
  if (!on() || bytes < min_frame_bytes_) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  if (!writer_) return std::nullopt;
  std::optional<Frame> f = writer_->Reserve(bytes);
  if (!f) NoteGrowthError();
  return ToWritable(std::move(f));
}

std::optional<Placement> ClientLink::Place(const Message& message) {
  if (!on()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  if (!writer_) return std::nullopt;
  std::optional<Placement> p = PlaceFrames(message, min_frame_bytes_, *writer_, *segment_);
  NoteGrowthError();
  return p;
}

size_t ClientLink::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return writer_ ? writer_->reserved_bytes() : 0;
}

void ClientLink::NoteGrowthError() {
  std::optional<Status> e = writer_->TakeGrowthError();
  if (!e) return;
  int64_t now = NowMs();
  if (now - last_warn_ms_ < 60000) return;
  last_warn_ms_ = now;
  spdlog::warn(
      "shared memory with {}: {}; frames that do not fit in the {} MiB reserved go through the "
      "socket (logged at most once a minute)",
      who_, e->message(), writer_->reserved_bytes() >> 20);
}

Status ClientLink::Fill(const Trailer& t, Message* message) const {
  std::shared_ptr<ShmSegment> segment;
  {
    std::lock_guard<std::mutex> lock(mu_);
    segment = segment_;
  }
  if (!segment || segment->token() != t.token) {
    return InvalidArgument("the shard used shared memory this client did not offer");
  }
  return FillFrames(t, segment, /*copy=*/false, message);
}

// ------------------------------------------------------------------------------ server side

ServerLinks::ServerLinks(bool enabled, size_t min_frame_bytes)
    : enabled_(enabled), min_frame_bytes_(min_frame_bytes) {}

ServerLinks::Link* ServerLinks::LinkOf(const PeerId& peer) {
  if (peers_.empty()) return nullptr;
  auto p = peers_.find(peer);
  if (p == peers_.end()) return nullptr;
  auto l = links_.find(p->second);
  return l == links_.end() ? nullptr : &l->second;
}

ServerLinks::Link* ServerLinks::Map(const std::string& name, uint64_t token, Status* why) {
  auto it = links_.find(name);
  if (it != links_.end() && it->second.segment->token() == token) return &it->second;
  if (!enabled_) {
    *why = FailedPrecondition("shared memory is off on this shard (--no-shm)");
    return nullptr;
  }
  auto seg = ShmSegment::Open(name, token);
  if (!seg.ok()) {
    *why = seg.status();
    return nullptr;
  }
  Link link;
  link.segment = *seg;
  link.writer = std::make_unique<ShmWriter>(link.segment, 1, /*reclaim_ms=*/0);
  return &(links_[name] = std::move(link));
}

std::string ServerLinks::AnswerOffer(const PeerId& peer, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (size < kOfferHead || Get<uint32_t>(p + 8) != kVersion) {
    return EncodeAnswer(false, 0, "unsupported shared-memory offer");
  }
  uint64_t token = Get<uint64_t>(p + 12);
  std::string name(reinterpret_cast<const char*>(p + kOfferHead), size - kOfferHead);
  Status why;
  Link* link = Map(name, token, &why);
  if (link == nullptr) {
    spdlog::debug("a client's shared-memory offer ({}) refused: {}", name, why.ToString());
    return EncodeAnswer(false, token, why.message());
  }
  link->last_used_ms = NowMs();
  peers_[peer] = name;
  spdlog::info("a client on this host sends and receives large frames through shared memory {}",
               name);
  return EncodeAnswer(true, token, "");
}

std::optional<std::string> ServerLinks::OnMessage(const PeerId& peer, const Trailer* trailer,
                                                  Message* message) {
  std::optional<std::string> answer;
  int64_t now = NowMs();
  if (trailer != nullptr) {
    Status why;
    Link* link = Map(trailer->name, trailer->token, &why);
    if (link == nullptr) {
      Warn("a client sent frames through shared memory " + trailer->name +
           " that this shard cannot read (" + why.ToString() +
           "); told it to use the socket, its request fails");
      answer = EncodeAnswer(false, trailer->token, why.message());
    } else {
      peers_[peer] = trailer->name;
      Status st = FillFrames(*trailer, link->segment, /*copy=*/true, message);
      if (!st.ok()) {
        Warn("a shared-memory frame could not be read: " + st.ToString() + "; the request fails");
      }
      frames_received_ += trailer->frames.size();
    }
  }
  if (auto p = peers_.find(peer); p != peers_.end()) {
    if (auto l = links_.find(p->second); l != links_.end()) l->second.last_used_ms = now;
  }
  if (now - last_sweep_ms_ < 5000) return answer;
  last_sweep_ms_ = now;
  for (auto it = links_.begin(); it != links_.end();) {
    it = now - it->second.last_used_ms > kIdleMs ? links_.erase(it) : std::next(it);
  }
  for (auto it = peers_.begin(); it != peers_.end();) {
    it = links_.count(it->second) == 0 ? peers_.erase(it) : std::next(it);
  }
  return answer;
}

std::optional<WritableFrame> ServerLinks::Reserve(const PeerId& peer, size_t bytes) {
  if (bytes < min_frame_bytes_) return std::nullopt;
  Link* link = LinkOf(peer);
  if (link == nullptr) return std::nullopt;
  std::optional<Frame> f = link->writer->Reserve(bytes);
  if (!f) NoteGrowthError(*link);
  return ToWritable(std::move(f));
}

std::optional<Placement> ServerLinks::Place(const PeerId& peer, const Message& message) {
  Link* link = LinkOf(peer);
  if (link == nullptr || !link->segment->ready()) return std::nullopt;
  std::optional<Placement> p =
      PlaceFrames(message, min_frame_bytes_, *link->writer, *link->segment);
  if (p) frames_sent_ += p->frames.size();
  NoteGrowthError(*link);
  return p;
}

void ServerLinks::NoteGrowthError(Link& link) {
  if (std::optional<Status> e = link.writer->TakeGrowthError()) {
    Warn("replies to a client on this host: " + e->message() + "; those that do not fit in the " +
         std::to_string(link.writer->reserved_bytes() >> 20) +
         " MiB reserved go through the socket");
  }
}

size_t ServerLinks::reserved_bytes(const PeerId& peer) {
  Link* link = LinkOf(peer);
  return link == nullptr ? 0 : link->writer->reserved_bytes();
}

void ServerLinks::Warn(const std::string& what) {
  int64_t now = NowMs();
  if (now - last_warn_ms_ < 60000) return;
  last_warn_ms_ = now;
  spdlog::warn("{} (logged at most once a minute)", what);
}

}  // namespace leash::shm

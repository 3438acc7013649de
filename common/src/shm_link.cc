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
constexpr char kNoticeMagic[8] = {'\xff', 'L', 'S', 'H', 'M', 'N', 'T', 'C'};
constexpr char kChannelPrefix[5] = {'\xff', 'S', 'H', 'M', ':'};
constexpr uint32_t kOfferMessages = 1;  // offer flag: whole messages wanted
// Offer flag: the shard may read this client's frames in place (ShmSegment::Borrow) instead of
// copying them out; the client's ring never takes room back (ClientLink's `lend`).
constexpr uint32_t kOfferLend = 2;
constexpr uint32_t kAnswerFrames = 1, kAnswerMessages = 2;
constexpr size_t kTrailerHead = 8 + 8 + 2 + 2 + 4;
constexpr size_t kTrailerEntry = 4 + 4 + 8 + 8;
constexpr size_t kOfferHead = 8 + 4 + 8 + 4;  // magic, version, token, flags; then the name
constexpr size_t kNoticeHead = 8 + 8 + 4;     // magic, token, kind; then the name
constexpr uint32_t kResume = 0, kHello = 1;   // notice kinds
// Records of no frames that mark the queue (their count word alone).
constexpr uint32_t kPauseMark = 0, kByeMark = 0xffffffffu;
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

std::string EncodeAnswer(uint32_t accepted, uint64_t token, const std::string& reason) {
  std::string a(kAnswerMagic, 8);
  Put(&a, accepted);
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

enum class Take { kCopy, kBorrow, kBorrowUnstable };

// How a shard takes a client's frames: in place from a lender, in place as unstable from
// others when it borrows all (ServerLinks::set_borrow_all), else copied out.
Take TakeFor(bool lends, bool borrow_all) {
  return lends ? Take::kBorrow : borrow_all ? Take::kBorrowUnstable : Take::kCopy;
}

// Fills the frames a trailer names from `segment`: copied out, borrowed in place from a
// client that lends them, or borrowed as unstable (a client that does not: Frame::unstable).
// Frames that cannot be read stay empty, so the message fails its size checks above
// with a clear error instead of being taken for something else. NotFound or DataLoss:
// a frame the sender has sent again since (Stale).

Status FillFrames(const Trailer& t, const std::shared_ptr<ShmSegment>& segment, Take take,
                  Message* message, const FrameCopier* copier = nullptr) {
  Status first;
  for (const auto& [index, d] : t.frames) {
    if (index == 0 || index >= message->size() || !(*message)[index].empty()) {
      if (first.ok()) {
        first = InvalidArgument("shared-memory trailer names frame " + std::to_string(index));
      }
      continue;
    }
    Result<Frame> f =
        take == Take::kCopy ? segment->CopyOut(d, copier) : segment->Borrow(segment, d);
    if (!f.ok()) {
      if (first.ok()) first = f.status();
      continue;
    }
    (*message)[index] = take == Take::kBorrowUnstable ? f->Unstable() : std::move(*f);
  }
  return first;
}

// The record in `slot` of `ring`'s queue: its frames; none for a pause.
Result<Message> ReadRecord(ShmSegment& segment, uint32_t ring, const QueueSlot& slot) {
  if (slot.generation == 0) {
    if (slot.size > kSlotInline)
      return InvalidArgument("inline record of " + std::to_string(slot.size) + " bytes");
    if (IsPause(slot.bytes, slot.size)) return Message();
    return DecodeRecord(slot.bytes, slot.size);
  }
  LEASH_ASSIGN_OR_RETURN(Frame f, segment.CopyOut({ring, slot.generation, slot.offset, slot.size}));
  return DecodeRecord(f.data(), f.size());
}

// A record's frames as on the socket: the trailer (if last) taken off and its frames filled
// from `ring` (copied out, or borrowed in place). How many it named; why one failed.
size_t FillFromTrailer(const std::shared_ptr<ShmSegment>& segment, uint32_t ring, Take take,
                       Message* m, Status* why, const FrameCopier* copier = nullptr) {
  if (m->size() < 2) return 0;
  std::optional<Trailer> t = DecodeTrailer(m->back().data(), m->back().size(), ring);
  if (!t) return 0;
  m->pop_back();
  *why = FillFrames(*t, segment, take, m, copier);
  return t->frames.size();
}

enum class Queued { kQueued, kRing, kNoSlot, kNoRoom };  // kRing: ring the reader's bell

// Puts `record` in `ring`'s queue: inline when it fits a slot, else as a frame of the ring.
// kNoSlot: the queue is full; kNoRoom: the ring has no room for it.
Queued QueueRecord(ShmSegment& segment, ShmWriter& writer, uint32_t ring,
                   const std::string& record) {
  ShmSegment::Posted posted = ShmSegment::Posted::kFull;
  if (record.size() <= kSlotInline) {
    posted = segment.Enqueue(ring, reinterpret_cast<const uint8_t*>(record.data()), record.size());
  } else {
    std::optional<Descriptor> d = writer.Put(Frame::Wrap(record.data(), record.size(), nullptr));
    if (!d) return Queued::kNoRoom;
    posted = segment.Enqueue(ring, *d);
    if (posted == ShmSegment::Posted::kFull) segment.Release(*d);
  }
  switch (posted) {
    case ShmSegment::Posted::kFull:
      return Queued::kNoSlot;
    case ShmSegment::Posted::kRing:
      return Queued::kRing;
    case ShmSegment::Posted::kQueued:
      break;
  }
  return Queued::kQueued;
}

// A message whose frame its sender has sent again since (restamped on a resend) or taken
// back: an older copy of a request that a newer message carries. Dropped, not answered:
// an error reply would answer the newer one.
bool Stale(const Status& fill) {
  return fill.code() == StatusCode::kNotFound || fill.code() == StatusCode::kDataLoss;
}

std::optional<WritableFrame> ToWritable(std::optional<Frame> f) {
  if (!f) return std::nullopt;
  return WritableFrame{const_cast<uint8_t*>(f->data()), std::move(*f)};
}

}  // namespace

bool IsOffer(const void* data, size_t size) { return HasMagic(data, size, kOfferMagic); }
bool IsAnswer(const void* data, size_t size) { return HasMagic(data, size, kAnswerMagic); }
bool IsNotice(const void* data, size_t size) { return HasMagic(data, size, kNoticeMagic); }

std::string EncodeRecord(const Message& frames) {
  size_t n = 4;
  for (const Frame& f : frames) n += 4 + f.size();
  std::string r;
  r.reserve(n);
  Put(&r, static_cast<uint32_t>(frames.size()));
  for (const Frame& f : frames) {
    Put(&r, static_cast<uint32_t>(f.size()));
    r.append(reinterpret_cast<const char*>(f.data()), f.size());
  }
  return r;
}

bool IsPause(const uint8_t* data, size_t size) {
  return size == 4 && Get<uint32_t>(data) == kPauseMark;
}

bool IsBye(const uint8_t* data, size_t size) {
  return size == 4 && Get<uint32_t>(data) == kByeMark;
}

Result<Message> DecodeRecord(const uint8_t* data, size_t size) {
  if (size < 4)
    return InvalidArgument("shared-memory record of " + std::to_string(size) + " bytes");
  const uint32_t count = Get<uint32_t>(data);
  if (count == 0 || count > (size - 4) / 4)
    return InvalidArgument("shared-memory record says " + std::to_string(count) + " frames");
  Message m;
  m.reserve(count);
  size_t at = 4;
  for (uint32_t i = 0; i < count; ++i) {
    if (size - at < 4)
      return InvalidArgument("shared-memory record ends inside frame " + std::to_string(i));
    const uint32_t n = Get<uint32_t>(data + at);
    at += 4;
    if (n > size - at)
      return InvalidArgument("shared-memory record's frame " + std::to_string(i) + " overruns it");
    m.push_back(n == 0 ? Frame() : Frame::Copy(data + at, n));
    at += n;
  }
  if (at != size) return InvalidArgument("shared-memory record has bytes after its frames");
  return m;
}

Message OnTheWire(const Message& message, const std::optional<Placement>& p) {
  Message m = message;
  if (p) {
    for (const auto& moved : p->frames) m[moved.first] = Frame();
    m.push_back(Frame::Copy(p->trailer));
  }
  return m;
}

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

ClientLink::ClientLink(size_t ring_bytes, size_t min_frame_bytes, std::string who, bool messages,
                       bool lend)
    : who_(std::move(who)),
      min_frame_bytes_(min_frame_bytes),
      ring_bytes_(ring_bytes),
      messages_wanted_(messages),
      lend_(lend) {
  std::lock_guard<std::mutex> lock(mu_);
  Start();
}

ClientLink::~ClientLink() {
  std::lock_guard<std::mutex> lock(mu_);
  if (messages_on_.load()) QueueMark(kByeMark);
}

bool ClientLink::QueueMark(uint32_t mark) {
  if (!segment_ || !writer_) return false;
  std::string record;
  Put(&record, mark);
  const Queued q = QueueRecord(*segment_, *writer_, 0, record);
  if (q == Queued::kRing) bells_[0]->Ring();
  return q == Queued::kQueued || q == Queued::kRing;
}

void ClientLink::Renew() {
  if (ring_bytes_ == 0) return;  // shared memory is not wanted
  std::lock_guard<std::mutex> lock(mu_);
  state_.store(kOff);
  messages_agreed_.store(false);
  if (messages_on_.exchange(false)) QueueMark(kByeMark);  // the old process may close its end
  writer_.reset();
  segment_.reset();  // frames still in flight keep it mapped
  for (auto& b : bells_) {
    if (b) retired_bells_.push_back(std::move(b));
  }
  Start();
}

void ClientLink::Start() {
  auto seg = ShmSegment::Create(ring_bytes_);
  if (!seg.ok()) {
    spdlog::warn("shared memory with {} is off: {}", who_, seg.status().ToString());
    return;
  }
  segment_ = *seg;
  writer_ = std::make_unique<ShmWriter>(segment_, 0, kReclaimMs, /*lent=*/lend_);
  if (messages_wanted_) {
    Status st = segment_->MakeBells();
    for (uint32_t r = 0; r < 2 && st.ok(); ++r) {
      Result<int> fd = segment_->OpenBell(r);
      if (fd.ok()) {
        bells_[r] = std::make_unique<Bell>(*fd);
      } else {
        st = fd.status();
      }
    }
    if (!st.ok()) {
      spdlog::warn("messages through shared memory with {} are off (large frames still go): {}",
                   who_, st.ToString());
      bells_[0].reset();
      bells_[1].reset();
    }
  }
  state_.store(kOffered);
}

std::optional<std::string> ClientLink::Offer() const {
  if (state() != kOffered) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  if (!segment_) return std::nullopt;
  std::string h(kOfferMagic, 8);
  Put(&h, kVersion);
  Put(&h, segment_->token());
  Put(&h, (bells_[1] ? kOfferMessages : 0u) | (lend_ ? kOfferLend : 0u));
  h += segment_->name();
  return h;
}

std::optional<std::string> ClientLink::TakeNotice() {
  if (!messages_agreed_.load() || messages_on_.load() || !on()) return std::nullopt;
  messages_on_.store(true);
  return Notice();
}

std::optional<std::string> ClientLink::Notice() const { return MakeNotice(kResume); }
std::optional<std::string> ClientLink::Hello() const { return MakeNotice(kHello); }

std::optional<std::string> ClientLink::MakeNotice(uint32_t kind) const {
  if (!messages_on_.load()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  if (!segment_) return std::nullopt;
  std::string n(kNoticeMagic, 8);
  Put(&n, segment_->token());
  Put(&n, kind);
  n += segment_->name();
  return n;
}

Result<bool> ClientLink::Post(const Message& message, const std::optional<Placement>& p) {
  const std::string record = EncodeRecord(OnTheWire(message, p));
  std::lock_guard<std::mutex> lock(mu_);
  if (!segment_ || !messages_on_.load())
    return Unavailable("shared memory with " + who_ + " turned off; the message is resent");
  const Queued q = QueueRecord(*segment_, *writer_, 0, record);
  if (q == Queued::kRing) bells_[0]->Ring();
  const bool detour = q == Queued::kNoRoom;
  if (q == Queued::kNoSlot || (detour && !QueueMark(kPauseMark))) {
    return Unavailable(who_ + " does not read its shared-memory queue (" +
                       std::to_string(kQueueSlots) + " messages waiting)");
  }
  return !detour;
}

bool ClientLink::Doze() {
  std::lock_guard<std::mutex> lock(mu_);
  return !segment_ || !messages_on_.load() || segment_->Doze(1);
}

void ClientLink::Wake() {
  std::lock_guard<std::mutex> lock(mu_);
  if (segment_) segment_->Wake(1);
  if (bells_[1]) bells_[1]->Drain();
}

int ClientLink::bell_fd() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bells_[1] ? bells_[1]->fd() : -1;
}

Result<std::optional<Message>> ClientLink::Take() {
  std::shared_ptr<ShmSegment> segment;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!messages_on_.load()) return std::optional<Message>();
    segment = segment_;
  }
  if (!segment) return std::optional<Message>();
  Result<const QueueSlot*> slot = segment->Front(1);
  if (!slot.ok()) {
    TurnOff();  // a corrupt queue is read no more: everything goes through the socket
    return slot.status().WithContext("shared memory with " + who_ + " turned off");
  }
  if (*slot == nullptr) return std::optional<Message>();
  Result<Message> parts = ReadRecord(*segment, 1, **slot);
  segment->Pop(1);
  if (!parts.ok()) return parts.status().WithContext("a reply from " + who_);
  Message m = std::move(*parts);
  if (m.empty()) return std::optional<Message>();  // a shard sends no pauses: ignored
  Status st;
  FillFromTrailer(segment, 1, Take::kBorrow, &m, &st);
  if (!st.ok()) {
    spdlog::warn("{}: a reply's shared-memory frame could not be read: {}", who_, st.ToString());
  }
  return std::optional<Message>(std::move(m));
}

void ClientLink::OnAnswer(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (size < kAnswerHead || !segment_ || Get<uint64_t>(p + 12) != segment_->token()) return;
  }
  const uint32_t answer = Get<uint32_t>(p + 8);
  bool accepted = answer == kAnswerFrames || answer == kAnswerMessages;
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
    messages_agreed_.store(answer == kAnswerMessages && bells_[1] != nullptr);
    state_.store(kOn);
    spdlog::info("{} is on this host: {} go through shared memory {}", who_,
                 messages_agreed_.load()
                     ? std::string("all messages")
                     : "frames of " + std::to_string(min_frame_bytes_ >> 10) + " KiB and more",
                 name);
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
  // A shard that still reads the queue stops at a pause and takes the socket from then on.
  if (messages_on_.exchange(false)) QueueMark(kPauseMark);
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
  return FillFrames(t, segment, Take::kBorrow, message);
}

// ------------------------------------------------------------------------------ server side

ServerLinks::ServerLinks(bool enabled, size_t min_frame_bytes, bool messages)
    : enabled_(enabled), messages_(messages), min_frame_bytes_(min_frame_bytes) {}

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

std::string ServerLinks::AnswerOffer(const PeerId& peer, const void* data, size_t size,
                                     const std::string& user) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (size < kOfferHead || Get<uint32_t>(p + 8) != kVersion) {
    return EncodeAnswer(0, 0, "unsupported shared-memory offer");
  }
  uint64_t token = Get<uint64_t>(p + 12);
  const bool wants_messages = (Get<uint32_t>(p + 20) & kOfferMessages) != 0;
  const bool lends = (Get<uint32_t>(p + 20) & kOfferLend) != 0 &&
                     (lenders_ == "*" || (!lenders_.empty() && user == lenders_));
  std::string name(reinterpret_cast<const char*>(p + kOfferHead), size - kOfferHead);
  Status why;
  Link* link = Map(name, token, &why);
  if (link == nullptr) {
    spdlog::debug("a client's shared-memory offer ({}) refused: {}", name, why.ToString());
    return EncodeAnswer(0, token, why.message());
  }
  link->last_used_ms = NowMs();
  link->borrow = lends;
  peers_[peer] = name;
  const bool messages = wants_messages && messages_ && OpenBells(*link);
  spdlog::info("a client on this host sends and receives {} through shared memory {}{}",
               messages ? "all messages" : "large frames", name,
               lends ? " (its frames read in place)" : "");
  return EncodeAnswer(messages ? kAnswerMessages : kAnswerFrames, token, "");
}

bool ServerLinks::OpenBells(Link& link) {
  for (uint32_t r = 0; r < 2; ++r) {
    if (link.bells[r]) continue;
    Result<int> fd = link.segment->OpenBell(r);
    if (!fd.ok()) {
      spdlog::debug("no messages through shared memory {}: {}", link.segment->name(),
                    fd.status().ToString());
      link.bells[0].reset();
      return false;
    }
    link.bells[r] = std::make_unique<Bell>(*fd);
  }
  return true;
}

PeerId ServerLinks::ChannelPeer(uint64_t token) {
  PeerId id(kChannelPrefix, sizeof kChannelPrefix);
  Put(&id, token);
  return id;
}

bool ServerLinks::IsChannelPeer(const PeerId& peer) {
  return peer.size() == sizeof kChannelPrefix + 8 &&
         std::memcmp(peer.data(), kChannelPrefix, sizeof kChannelPrefix) == 0;
}

std::optional<std::string> ServerLinks::OnNotice(const PeerId& peer, const std::string& user,
                                                 const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (size < kNoticeHead) return std::nullopt;
  const uint64_t token = Get<uint64_t>(p + 8);
  const uint32_t kind = Get<uint32_t>(p + 16);
  const std::string name(reinterpret_cast<const char*>(p + kNoticeHead), size - kNoticeHead);
  Status why;
  Link* link = Map(name, token, &why);
  if (link != nullptr && !(messages_ && OpenBells(*link))) {
    why = FailedPrecondition("this shard does not take messages through shared memory");
    link = nullptr;
  }
  if (link == nullptr) {
    Warn("a client sends its messages through shared memory " + name +
         " that this shard cannot read (" + why.ToString() + "); told it to use the socket");
    return EncodeAnswer(0, token, why.message());
  }
  link->last_used_ms = NowMs();
  link->user = user;
  link->socket_peer = peer;
  // Every connection it came on stays this client's: a detoured message sent on the old
  // one may arrive after the new one's hello.
  if (by_socket_.emplace(peer, link).second) link->socket_peers.push_back(peer);
  if (!link->reading) {
    // A shard process that starts reading a queue (after a restart: the segment is mapped
    // again) reads what the last one left unread, as ZeroMQ delivers what a client queued
    // for a shard while it reconnected. Another process of the same shard is another
    // endpoint, and the client gives it a segment of its own (ClientLink::Renew), so a
    // queue has one reader at a time.
    link->reading = true;
    link->paused = false;
    link->peer = ChannelPeer(token);
    peers_[link->peer] = name;
    reading_.push_back(link);
    spdlog::debug("reading the message queue of shared memory {}", name);
  } else if (kind == kResume && (link->paused || !link->held.empty())) {
    link->held.push_back({std::nullopt});  // ends a detour, in its turn
  }
  // Otherwise the queue is read already: a hello, or a resume whose detour had nothing held.
  return std::nullopt;
}

std::optional<PeerId> ServerLinks::QueuePeerOf(const PeerId& socket_peer) const {
  if (by_socket_.empty()) return std::nullopt;
  auto it = by_socket_.find(socket_peer);
  if (it == by_socket_.end() || !it->second->reading || it->second->closed) return std::nullopt;
  return it->second->peer;
}

bool ServerLinks::Hold(Inbound& in) {
  if (by_socket_.empty()) return false;
  auto it = by_socket_.find(in.peer);
  if (it == by_socket_.end()) return false;
  Link& link = *it->second;
  if (!link.reading || (link.paused && link.held.empty())) return false;
  link.held.push_back({std::move(in)});
  return true;
}

void ServerLinks::AddBells(std::vector<int>* fds) const {
  for (const Link* l : reading_) fds->push_back(l->bells[0]->fd());
}

bool ServerLinks::Doze() {
  for (size_t i = 0; i < reading_.size(); ++i) {
    Link& l = *reading_[i];
    // A paused queue is not read until its notice: what is held decides.
    const bool ready = l.closed ? false : l.paused ? !l.held.empty() : !l.segment->Doze(0);
    if (ready) {
      for (size_t k = 0; k < i; ++k) reading_[k]->segment->Wake(0);
      return false;
    }
  }
  return true;
}

void ServerLinks::Wake(const std::vector<bool>& rang) {
  for (size_t i = 0; i < reading_.size(); ++i) {
    reading_[i]->segment->Wake(0);
    if (i < rang.size() && rang[i]) reading_[i]->bells[0]->Drain();
  }
}

std::optional<Inbound> ServerLinks::Take() {
  for (size_t k = 0; k < reading_.size(); ++k) {
    const size_t i = (next_ + k) % reading_.size();
    if (std::optional<Inbound> in = TakeFrom(*reading_[i])) {
      next_ = i + 1;
      return in;
    }
  }
  return std::nullopt;
}

std::optional<Inbound> ServerLinks::TakeFrom(Link& link) {
  if (link.closed) return std::nullopt;
  while (true) {
    if (link.paused) {
      if (link.held.empty()) return std::nullopt;
      Link::Held h = std::move(link.held.front());
      link.held.pop_front();
      if (h.in) return std::move(h.in);
      link.paused = false;  // the notice: the queue again, from where the pause left it
      continue;
    }
    Result<const QueueSlot*> slot = link.segment->Front(0);
    if (!slot.ok()) {
      Warn("stopped reading the message queue of shared memory " + link.segment->name() + ": " +
           slot.status().ToString());
      link.reading = false;
      std::erase(reading_, &link);
      return std::nullopt;
    }
    if (*slot == nullptr) return std::nullopt;
    if ((*slot)->generation == 0 && (*slot)->size <= kSlotInline &&
        IsBye((*slot)->bytes, (*slot)->size)) {
      link.segment->Pop(0);
      link.closed = true;  // let go at the next sweep, which is now
      sweep_due_ = true;
      return std::nullopt;
    }
    Result<Message> parts = ReadRecord(*link.segment, 0, **slot);
    link.segment->Pop(0);
    if (parts.ok() && parts->empty()) {
      link.paused = true;
      continue;
    }
    link.last_used_ms = NowMs();
    if (!parts.ok()) {
      Warn("a message in shared memory " + link.segment->name() +
           " could not be read: " + parts.status().ToString() + "; it is dropped");
      continue;
    }
    ++messages_received_;
    Inbound in{link.peer, std::move(*parts), link.user};
    Status st;
    const size_t filled = FillFromTrailer(link.segment, 0, TakeFor(link.borrow, borrow_all_),
                                          &in.message, &st, copier());
    frames_received_ += filled;
    if (link.borrow) frames_lent_ += filled;
    if (Stale(st)) {
      ++stale_dropped_;
      continue;
    }
    if (!st.ok()) {
      Warn("a shared-memory frame could not be read: " + st.ToString() + "; the request fails");
    }
    return in;
  }
}

Result<std::optional<std::pair<PeerId, Message>>> ServerLinks::Post(const PeerId& peer,
                                                                    const Message& message) {
  using Detour = std::optional<std::pair<PeerId, Message>>;
  Link* link = LinkOf(peer);
  if (link == nullptr || !link->reading)
    return Unavailable("no shared-memory queue for this peer (the client is gone)");
  std::optional<Placement> p = Place(peer, message);
  Message wire = OnTheWire(message, p);
  const Queued q = QueueRecord(*link->segment, *link->writer, 1, EncodeRecord(wire));
  if (q == Queued::kNoSlot || q == Queued::kNoRoom) {
    if (link->socket_peer.empty())
      return Unavailable("the client's shared-memory queue is full and no socket is known");
    return Detour(std::make_pair(link->socket_peer, std::move(wire)));
  }
  ++messages_sent_;
  if (q == Queued::kRing) link->bells[1]->Ring();
  return Detour();
}

std::optional<std::string> ServerLinks::OnMessage(const PeerId& peer, const Trailer* trailer,
                                                  Message* message, bool* stale) {
  std::optional<std::string> answer;
  int64_t now = NowMs();
  if (trailer != nullptr) {
    Status why;
    Link* link = Map(trailer->name, trailer->token, &why);
    if (link == nullptr) {
      Warn("a client sent frames through shared memory " + trailer->name +
           " that this shard cannot read (" + why.ToString() +
           "); told it to use the socket, its request fails");
      answer = EncodeAnswer(0, trailer->token, why.message());
    } else {
      peers_[peer] = trailer->name;
      Status st = FillFrames(*trailer, link->segment, TakeFor(link->borrow, borrow_all_), message,
                             copier());
      if (link->borrow) frames_lent_ += trailer->frames.size();
      if (Stale(st) && stale != nullptr) {
        *stale = true;
        ++stale_dropped_;
      } else if (!st.ok()) {
        Warn("a shared-memory frame could not be read: " + st.ToString() + "; the request fails");
      }
      frames_received_ += trailer->frames.size();
    }
  }
  if (auto p = peers_.find(peer); p != peers_.end()) {
    if (auto l = links_.find(p->second); l != links_.end()) l->second.last_used_ms = now;
  }
  Sweep(now);
  return answer;
}

void ServerLinks::Sweep(int64_t now) {
  if (!sweep_due_ && now - last_sweep_ms_ < kSweepMs) return;
  sweep_due_ = false;
  last_sweep_ms_ = now;
  bool erased = false;
  for (auto it = links_.begin(); it != links_.end();) {
    Link& l = it->second;
    // A link whose queue is read stays while its client keeps the segment: it may be idle
    // for long, and its next message would otherwise go unread. It goes at once when the
    // client said bye or let the segment's name go (and nothing is left to read). A client
    // that died (its name removed by the host's next client, ShmSegment::RemoveStale) sends
    // nothing more: its link goes at once whether or not its queue was read yet (it died
    // between its offer and its notice, or its queue turned out corrupt), and what it sent
    // on the socket while its queue was read, held for a pause it never queued, is taken
    // now, after everything its queue held.
    bool gone = l.closed;
    if (!gone && l.segment->NameGone()) {
      if (!l.reading) {
        gone = l.segment->CreatorDead();
      } else if (auto front = l.segment->Front(0); front.ok() && *front == nullptr) {
        if (l.held.empty()) {
          gone = true;
        } else if (!l.paused && l.segment->CreatorDead()) {
          l.paused = true;
        }
      }
    }
    if (!gone && now - l.last_used_ms > kIdleMs)
      gone = !l.reading || l.segment->NameGone() || l.segment->CreatorDead();
    erased |= gone;
    it = gone ? links_.erase(it) : std::next(it);
  }
  if (erased) {
    reading_.clear();
    by_socket_.clear();
    for (auto& [name, link] : links_) {
      if (link.reading) reading_.push_back(&link);
      for (const PeerId& p : link.socket_peers) by_socket_[p] = &link;
    }
    next_ = 0;
  }
  for (auto it = peers_.begin(); it != peers_.end();) {
    it = links_.count(it->second) == 0 ? peers_.erase(it) : std::next(it);
  }
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

// POSIX shared-memory segments and rings for same-host frames (see shm_segment.h). The
// one place where shm_open/mmap/posix_fallocate errors become Status.
#include "shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <string_view>

namespace leash::shm {
namespace {

constexpr char kMagic[8] = {'L', 'E', 'A', 'S', 'H', 'S', 'H', 'M'};
constexpr char kPrefix[] = "/leash-shm-";
constexpr size_t kPage = 4096;
constexpr uint32_t kMaxGranules = 1u << 20;  // 16 GiB a ring: a bound for a peer's header

static_assert(std::atomic<uint32_t>::is_always_lock_free,
              "state words must be lock-free to be shared");

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t granule_bytes;
  uint64_t token;
  uint32_t granules;
  std::atomic<uint32_t> ready;        // 1 once the creator activated it (the shard accepted)
  std::atomic<uint32_t> reserved[2];  // granules of each ring reserved by its writer
};
static_assert(sizeof(Header) <= kPage);

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t StatesBytes(uint32_t granules) {
  return RoundUp(2 * static_cast<size_t>(granules) * sizeof(uint32_t), kPage);
}

// One direction's message queue (ShmSegment::Enqueue): the writer's and the reader's
// indices on lines of their own, then the slots.
struct Queue {
  alignas(64) std::atomic<uint64_t> head;    // slots written: only the writer stores it
  alignas(64) std::atomic<uint64_t> tail;    // slots read: only the reader stores it
  alignas(64) std::atomic<uint32_t> dozing;  // 1: the reader is about to wait on its bell
  alignas(64) QueueSlot slots[kQueueSlots];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

size_t QueueBytes() { return RoundUp(sizeof(Queue), kPage); }

size_t SegmentBytes(uint32_t granules) {
  return ControlBytes(granules) + 2 * static_cast<size_t>(granules) * kGranuleBytes;
}

std::string TooSmall(size_t bytes, const std::string& name, int err) {
  return "cannot reserve " + std::to_string((bytes + (1 << 20) - 1) >> 20) +
         " MiB of shared memory for " + name + ": " + std::strerror(err) +
         " (is /dev/shm too small? leash-worker --no-shm, or shared_memory=False in Python, "
         "sends everything through the socket)";
}

Status Errno(const std::string& what) { return IOError(what + ": " + std::strerror(errno)); }

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint32_t GranulesFor(uint64_t size) {
  return static_cast<uint32_t>((size + kGranuleBytes - 1) / kGranuleBytes);
}

// "/leash-shm-<pid>-<16 hex digits>", and the pid in it.
bool ParseName(const std::string& name, long* pid) {
  const size_t n = sizeof kPrefix - 1;
  if (name.size() > 64 || name.compare(0, n, kPrefix) != 0) return false;
  size_t dash = name.find('-', n);
  if (dash == std::string::npos || dash == n || dash - n > 10 || name.size() != dash + 1 + 16)
    return false;
  for (size_t i = n; i < dash; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  for (size_t i = dash + 1; i < name.size(); ++i) {
    char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  *pid = std::stol(name.substr(n, dash - n));
  return true;
}

constexpr std::string_view kBellSuffix = ".bell";

// The FIFO that wakes the reader of `ring`'s queue of the segment `name`.
std::string BellPath(const std::string& name, uint32_t ring) {
  return "/dev/shm" + name + std::string(kBellSuffix) + std::to_string(ring);
}

}  // namespace

size_t ControlBytes(uint32_t granules) { return kPage + 2 * QueueBytes() + StatesBytes(granules); }

Status ShmSegment::Map(int fd, size_t size, bool create) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Errno("mmap of shared-memory segment " + name_);
  base_ = static_cast<uint8_t*>(p);
  size_ = size;
  auto* h = reinterpret_cast<Header*>(base_);
  if (create) {
    std::memcpy(h->magic, kMagic, sizeof kMagic);
    h->version = kVersion;
    h->granule_bytes = static_cast<uint32_t>(kGranuleBytes);
    h->token = token_;
    h->granules = granules_;
    new (&h->ready) std::atomic<uint32_t>(0);
    for (auto& r : h->reserved) new (&r) std::atomic<uint32_t>(0);
    for (uint32_t r = 0; r < 2; ++r) {
      auto* q = new (base_ + kPage + r * QueueBytes()) Queue;
      q->head.store(0);
      q->tail.store(0);
      q->dozing.store(0);
    }
  }
  for (uint32_t r = 0; r < 2; ++r) {
    queues_[r] = base_ + kPage + r * QueueBytes();
    states_[r] = reinterpret_cast<std::atomic<uint32_t>*>(base_ + kPage + 2 * QueueBytes()) +
                 static_cast<size_t>(r) * granules_;
    rings_[r] = base_ + RingOffset(r);
  }
  return Status::Ok();
}

size_t ShmSegment::RingOffset(uint32_t ring) const {
  return ControlBytes(granules_) + static_cast<size_t>(ring) * granules_ * kGranuleBytes;
}

Result<std::shared_ptr<ShmSegment>> ShmSegment::Create(size_t ring_bytes) {
  std::shared_ptr<ShmSegment> s(new ShmSegment());
  uint64_t granules = std::max<uint64_t>(4, (ring_bytes + kGranuleBytes - 1) / kGranuleBytes);
  if (granules > kMaxGranules) {
    return InvalidArgument("shared-memory ring of " + std::to_string(ring_bytes) +
                           " bytes is too large (at most " +
                           std::to_string(uint64_t{kMaxGranules} * kGranuleBytes) + ")");
  }
  s->granules_ = static_cast<uint32_t>(granules);
  std::random_device rd;
  s->token_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(NowMs());
  if (s->token_ == 0) s->token_ = 1;
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%016llx",
                static_cast<unsigned long long>((uint64_t{rd()} << 32) | rd()));
  s->name_ = std::string(kPrefix) + std::to_string(::getpid()) + "-" + suffix;
  int fd = ::shm_open(s->name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("shm_open(" + s->name_ + ")");
  s->creator_ = true;  // from here on the destructor unlinks the name
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const size_t size = SegmentBytes(s->granules_);
  // The rings stay holes until their writers reserve them; the header and state words are
  // reserved now, so that writing them can never fault for lack of space.
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) return Errno("ftruncate of " + s->name_);
  const size_t control = ControlBytes(s->granules_);
  if (int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(control)); rc != 0)
    return IOError(TooSmall(control, s->name_, rc));
  LEASH_RETURN_IF_ERROR(s->Map(fd, size, /*create=*/true));
  return s;
}

Result<std::shared_ptr<ShmSegment>> ShmSegment::Open(const std::string& name, uint64_t token) {
  long pid = 0;
  if (!ParseName(name, &pid))
    return InvalidArgument("'" + name + "' is not a Leash shared-memory segment name");
  std::shared_ptr<ShmSegment> s(new ShmSegment());
  s->name_ = name;
  s->token_ = token;
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound("no shared-memory segment " + name + " on this host");
    return Errno("shm_open(" + name + ")");
  }
  // The mapping stays valid without it; a shard mapping many workers keeps no descriptor.
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Errno("fstat of " + name);
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
    return InvalidArgument("shared-memory segment " + name + " is not a file of this user");
  }
  if (static_cast<size_t>(st.st_size) < kPage)
    return InvalidArgument("shared-memory segment " + name + " is too small");
  Header h;
  if (::pread(fd, &h, offsetof(Header, ready), 0) !=
      static_cast<ssize_t>(offsetof(Header, ready))) {
    return Errno("reading the header of " + name);
  }
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.version != kVersion ||
      h.granule_bytes != kGranuleBytes || h.granules < 1 || h.granules > kMaxGranules) {
    return InvalidArgument("shared-memory segment " + name +
                           " has no valid Leash header (version " + std::to_string(h.version) +
                           ")");
  }
  if (h.token != token)
    return InvalidArgument("shared-memory segment " + name + " holds another token");
  if (static_cast<size_t>(st.st_size) != SegmentBytes(h.granules)) {
    return InvalidArgument("shared-memory segment " + name + " has " + std::to_string(st.st_size) +
                           " bytes, its header says " + std::to_string(SegmentBytes(h.granules)));
  }
  s->granules_ = h.granules;
  LEASH_RETURN_IF_ERROR(s->Map(fd, SegmentBytes(h.granules), /*create=*/false));
  return s;
}

ShmSegment::~ShmSegment() {
  if (base_ != nullptr) ::munmap(base_, size_);
  if (creator_) Unlink();
}

Status ShmSegment::Activate() {
  if (!creator_ || activated_)
    return FailedPrecondition("shared-memory segment " + name_ +
                              " was activated already, or not created here");
  activated_ = true;
  reinterpret_cast<Header*>(base_)->ready.store(1, std::memory_order_release);
  return Status::Ok();
}

bool ShmSegment::ready() const {
  return reinterpret_cast<const Header*>(base_)->ready.load(std::memory_order_acquire) == 1;
}

uint32_t ShmSegment::reserved(uint32_t ring) const {
  return reinterpret_cast<const Header*>(base_)->reserved[ring].load(std::memory_order_acquire);
}

Status ShmSegment::Grow(uint32_t ring, uint32_t granules) {
  LEASH_CHECK(ring <= 1 && granules <= granules_);
  const int fd = ::shm_open(name_.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return Errno("shm_open(" + name_ + ") to grow a ring");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Errno("fstat of " + name_);
  if (st.st_uid != ::geteuid() || static_cast<size_t>(st.st_size) != size_) {
    return FailedPrecondition("shared-memory segment " + name_ + " was replaced");
  }
  const size_t bytes = static_cast<size_t>(granules) * kGranuleBytes;
  if (int rc =
          ::posix_fallocate(fd, static_cast<off_t>(RingOffset(ring)), static_cast<off_t>(bytes));
      rc != 0) {
    return IOError(TooSmall(bytes, name_, rc));
  }
  reinterpret_cast<Header*>(base_)->reserved[ring].store(granules, std::memory_order_release);
  return Status::Ok();
}

void ShmSegment::Unlink() {
  if (unlinked_) return;
  unlinked_ = true;
  ::shm_unlink(name_.c_str());
  for (uint32_t r = 0; r < 2; ++r) ::unlink(BellPath(name_, r).c_str());
}

ShmSegment::Posted ShmSegment::Enqueue(uint32_t ring, const uint8_t* record, size_t size) {
  LEASH_CHECK(ring <= 1 && size <= kSlotInline);
  auto* q = reinterpret_cast<Queue*>(queues_[ring]);
  const uint64_t head = q->head.load(std::memory_order_relaxed);
  if (head - q->tail.load(std::memory_order_acquire) >= kQueueSlots) return Posted::kFull;
  QueueSlot& s = q->slots[head % kQueueSlots];
  s.size = static_cast<uint32_t>(size);
  s.generation = 0;
  s.offset = 0;
  std::memcpy(s.bytes, record, size);
  return Publish(ring, head + 1);
}

ShmSegment::Posted ShmSegment::Enqueue(uint32_t ring, const Descriptor& frame) {
  LEASH_CHECK(ring <= 1 && frame.ring == ring && frame.generation != 0);
  auto* q = reinterpret_cast<Queue*>(queues_[ring]);
  const uint64_t head = q->head.load(std::memory_order_relaxed);
  if (head - q->tail.load(std::memory_order_acquire) >= kQueueSlots) return Posted::kFull;
  QueueSlot& s = q->slots[head % kQueueSlots];
  s.size = static_cast<uint32_t>(frame.size);
  s.generation = frame.generation;
  s.offset = frame.offset;
  return Publish(ring, head + 1);
}

ShmSegment::Posted ShmSegment::Publish(uint32_t ring, uint64_t head) {
  auto* q = reinterpret_cast<Queue*>(queues_[ring]);
  q->head.store(head, std::memory_order_release);
  // Against the reader's Doze: either it sees the new head, or this sees it dozing (both
  // sides store, then load, with full fences between).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (q->dozing.load(std::memory_order_relaxed) == 0) return Posted::kQueued;
  return q->dozing.exchange(0) == 1 ? Posted::kRing : Posted::kQueued;
}

Result<const QueueSlot*> ShmSegment::Front(uint32_t ring) {
  auto* q = reinterpret_cast<Queue*>(queues_[ring]);
  const uint64_t tail = q->tail.load(std::memory_order_relaxed);
  const uint64_t head = q->head.load(std::memory_order_acquire);
  if (head == tail) return static_cast<const QueueSlot*>(nullptr);
  if (head - tail > kQueueSlots) {
    return InvalidArgument("the message queue of shared-memory segment " + name_ +
                           " is corrupt (writer at " + std::to_string(head) + ", reader at " +
                           std::to_string(tail) + ")");
  }
  return static_cast<const QueueSlot*>(&q->slots[tail % kQueueSlots]);
}

void ShmSegment::Pop(uint32_t ring) {
  auto* q = reinterpret_cast<Queue*>(queues_[ring]);
  q->tail.store(q->tail.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

bool ShmSegment::Doze(uint32_t ring) {
  auto* q = reinterpret_cast<Queue*>(queues_[ring]);
  q->dozing.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (q->head.load(std::memory_order_relaxed) != q->tail.load(std::memory_order_relaxed)) {
    q->dozing.store(0, std::memory_order_relaxed);
    return false;
  }
  return true;
}

void ShmSegment::Wake(uint32_t ring) {
  reinterpret_cast<Queue*>(queues_[ring])->dozing.store(0, std::memory_order_relaxed);
}

bool ShmSegment::NameGone() const {
  struct stat st {};
  return ::stat(("/dev/shm" + name_).c_str(), &st) != 0 && errno == ENOENT;
}

bool ShmSegment::CreatorDead() const {
  long pid = 0;
  return ParseName(name_, &pid) && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

Status ShmSegment::MakeBells() {
  if (!creator_) return FailedPrecondition("only the creator of " + name_ + " makes its bells");
  for (uint32_t r = 0; r < 2; ++r) {
    const std::string path = BellPath(name_, r);
    if (::mkfifo(path.c_str(), 0600) != 0 && errno != EEXIST) return Errno("mkfifo " + path);
  }
  return Status::Ok();
}

Result<int> ShmSegment::OpenBell(uint32_t ring) const {
  const std::string path = BellPath(name_, ring);
  // O_RDWR: a FIFO opened so never blocks and never reads end-of-file (Linux).
  int fd = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound("no bell " + path);
    return Errno("open " + path);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode) || st.st_uid != ::geteuid()) {
    ::close(fd);
    return InvalidArgument(path + " is not a FIFO of this user");
  }
  return fd;
}

Bell::~Bell() {
  if (fd_ >= 0) ::close(fd_);
}

void Bell::Ring() {
  const char b = 1;
  // EAGAIN: the FIFO is full of rings not yet read, so the reader wakes anyway.
  (void)!::write(fd_, &b, 1);
}

void Bell::Drain() {
  char buf[64];
  while (::read(fd_, buf, sizeof buf) == static_cast<ssize_t>(sizeof buf)) {
  }
}

void ShmSegment::RemoveStale() {
  DIR* d = ::opendir("/dev/shm");
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    std::string name = std::string("/") + e->d_name;
    const bool bell =
        name.size() > kBellSuffix.size() + 1 &&
        name.compare(name.size() - kBellSuffix.size() - 1, kBellSuffix.size(), kBellSuffix) == 0;
    long pid = 0;
    if (!ParseName(bell ? name.substr(0, name.size() - kBellSuffix.size() - 1) : name, &pid))
      continue;
    struct stat st {};
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != ::geteuid())
      continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      if (bell) {
        ::unlinkat(::dirfd(d), e->d_name, 0);
      } else {
        ::shm_unlink(name.c_str());
      }
    }
  }
  ::closedir(d);
}

Result<const uint8_t*> ShmSegment::Check(const Descriptor& d) {
  if (d.ring > 1 || d.generation == 0 || d.size == 0 || d.offset % kGranuleBytes != 0 ||
      d.size > ring_bytes() ||
      d.offset / kGranuleBytes + GranulesFor(d.size) > std::min(granules_, reserved(d.ring))) {
    return InvalidArgument("shared-memory descriptor out of bounds (ring " +
                           std::to_string(d.ring) + ", offset " + std::to_string(d.offset) + ", " +
                           std::to_string(d.size) + " bytes)");
  }
  const auto first = static_cast<uint32_t>(d.offset / kGranuleBytes);
  std::atomic<uint32_t>* st = states(d.ring);
  for (uint32_t g = first; g < first + GranulesFor(d.size); ++g) {
    if (st[g].load(std::memory_order_acquire) != d.generation) {
      return NotFound("shared-memory frame at offset " + std::to_string(d.offset) +
                      " is no longer there (generation changed: sent again, or taken back)");
    }
  }
  return static_cast<const uint8_t*>(data(d.ring) + d.offset);
}

void ShmSegment::Release(const Descriptor& d) {
  const auto first = static_cast<uint32_t>(d.offset / kGranuleBytes);
  std::atomic<uint32_t>* st = states(d.ring);
  for (uint32_t g = first; g < first + GranulesFor(d.size); ++g) {
    uint32_t expected = d.generation;  // a writer that stamped it again keeps it
    st[g].compare_exchange_strong(expected, 0, std::memory_order_release,
                                  std::memory_order_relaxed);
  }
}

Result<Frame> ShmSegment::CopyOut(const Descriptor& d, const FrameCopier* copier) {
  LEASH_ASSIGN_OR_RETURN(const uint8_t* p, Check(d));
  // Checked for NaN and Inf as it is copied: a shard then need not read a pushed gradient
  // again before applying it (Frame::finite_f32).
  Frame f = copier != nullptr ? (*copier)(p, d.size) : Frame::CopyCheckingFinite(p, d.size);
  std::atomic_thread_fence(std::memory_order_acquire);
  const auto first = static_cast<uint32_t>(d.offset / kGranuleBytes);
  for (uint32_t g = first; g < first + GranulesFor(d.size); ++g) {
    if (states(d.ring)[g].load(std::memory_order_relaxed) != d.generation) {
      return DataLoss("shared-memory frame at offset " + std::to_string(d.offset) +
                      " was overwritten while it was read (the sender took it back)");
    }
  }
  Release(d);
  return f;
}

Result<Frame> ShmSegment::Borrow(std::shared_ptr<ShmSegment> self, const Descriptor& d) {
  LEASH_ASSIGN_OR_RETURN(const uint8_t* p, Check(d));
  struct Loan {
    Loan(std::shared_ptr<ShmSegment> s, const Descriptor& desc) : segment(std::move(s)), d(desc) {}
    Loan(const Loan&) = delete;
    Loan& operator=(const Loan&) = delete;
    ~Loan() { segment->Release(d); }
    std::shared_ptr<ShmSegment> segment;
    Descriptor d;
  };
  auto loan = std::make_shared<Loan>(std::move(self), d);
  return Frame::Wrap(p, d.size, std::shared_ptr<const void>(loan, loan.get())).Lent();
}

// ---------------------------------------------------------------- ShmWriter

struct ShmWriter::Reservation {
  Reservation() = default;
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  std::shared_ptr<ShmSegment> segment;
  std::shared_ptr<std::vector<std::atomic<uint8_t>>> held;
  uint32_t first = 0;
  uint32_t count = 0;
  ~Reservation() {
    for (uint32_t g = first; g < first + count; ++g) (*held)[g].store(0, std::memory_order_release);
  }
};

ShmWriter::ShmWriter(std::shared_ptr<ShmSegment> segment, uint32_t ring, int64_t reclaim_ms,
                     bool lent)
    : segment_(std::move(segment)),
      ring_(ring),
      reclaim_ms_(lent ? 0 : reclaim_ms),
      lent_(lent),
      claimed_ms_(segment_->granules(), 0),
      held_(std::make_shared<std::vector<std::atomic<uint8_t>>>(segment_->granules())) {}

uint32_t ShmWriter::NextGeneration() {
  if (++generation_ == 0) ++generation_;
  return generation_;
}

std::optional<Status> ShmWriter::TakeGrowthError() {
  std::optional<Status> e = std::move(growth_error_);
  growth_error_.reset();
  return e;
}

std::optional<uint32_t> ShmWriter::Claim(uint32_t k, int64_t now_ms) {
  if (k == 0 || k > segment_->granules()) return std::nullopt;
  if (auto first = FirstFit(k, now_ms)) return first;
  if (!Grow(k, now_ms)) return std::nullopt;
  return FirstFit(k, now_ms);
}

// Reserves more of the ring for a frame of `k` granules that found no room: half as much
// again as is reserved, in whole MiB, at least the frame; or, when /dev/shm cannot hold
// that, just the frame. Nothing for 5 s after /dev/shm refused.
bool ShmWriter::Grow(uint32_t k, int64_t now_ms) {
  const uint32_t n = segment_->granules();
  if (reserved_ >= n || now_ms < grow_again_ms_) return false;
  const uint32_t least = std::min(n, reserved_ + k);
  uint32_t want = reserved_ + std::max(k, reserved_ / 2);
  want = std::min(n, (want + kGrowthGranules - 1) / kGrowthGranules * kGrowthGranules);
  Status st = segment_->Grow(ring_, want);
  if (!st.ok() && least < want) {
    want = least;
    st = segment_->Grow(ring_, want);
  }
  if (!st.ok()) {
    growth_error_ = st;
    grow_again_ms_ = now_ms + kGrowthRetryMs;
    return false;
  }
  reserved_ = want;
  return true;
}

std::optional<uint32_t> ShmWriter::FirstFit(uint32_t k, int64_t now_ms) {
  const uint32_t n = reserved_;
  if (k > n) return std::nullopt;
  std::atomic<uint32_t>* st = segment_->states(ring_);
  auto is_free = [&](uint32_t g) {
    if ((*held_)[g].load(std::memory_order_acquire) != 0) return false;
    if (st[g].load(std::memory_order_acquire) == 0) return true;
    return reclaim_ms_ > 0 && now_ms - claimed_ms_[g] > reclaim_ms_;  // the reader died with it
  };
  // First fit from the ring's start: the granules given back soonest are used again, so
  // the bytes written are still in the caches of both processes' cores (a cursor that
  // went round the whole ring wrote to memory no cache held, and was slower).
  uint32_t start = 0;
  while (start + k <= n) {
    uint32_t g = start;
    while (g < start + k && is_free(g)) ++g;
    if (g == start + k) {
      const uint32_t gen = NextGeneration();
      for (uint32_t i = start; i < start + k; ++i) {
        claimed_ms_[i] = now_ms;
        st[i].store(gen, std::memory_order_release);
      }
      return start;
    }
    start = g + 1;
  }
  return std::nullopt;
}

std::optional<Descriptor> ShmWriter::Put(const Frame& frame) {
  if (frame.empty() || !segment_->ready()) return std::nullopt;
  const uint32_t k = GranulesFor(frame.size());
  auto first = Claim(k, NowMs());
  if (!first) return std::nullopt;
  std::memcpy(segment_->data(ring_) + static_cast<size_t>(*first) * kGranuleBytes, frame.data(),
              frame.size());
  std::atomic_thread_fence(std::memory_order_release);
  return Descriptor{ring_, generation_, static_cast<uint64_t>(*first) * kGranuleBytes,
                    frame.size()};
}

std::optional<Frame> ShmWriter::Reserve(size_t size) {
  if (size == 0 || !segment_->ready()) return std::nullopt;
  const uint32_t k = GranulesFor(size);
  auto first = Claim(k, NowMs());
  if (!first) return std::nullopt;
  for (uint32_t g = *first; g < *first + k; ++g) (*held_)[g].store(1, std::memory_order_relaxed);
  // Not sent yet: the reader has nothing to give back.
  std::atomic<uint32_t>* st = segment_->states(ring_);
  for (uint32_t g = *first; g < *first + k; ++g) st[g].store(0, std::memory_order_relaxed);
  auto r = std::make_shared<Reservation>();
  r->segment = segment_;
  r->held = held_;
  r->first = *first;
  r->count = k;
  uint8_t* p = segment_->data(ring_) + static_cast<size_t>(*first) * kGranuleBytes;
  return Frame::Wrap(p, size, std::shared_ptr<const void>(r, p));
}

std::optional<Descriptor> ShmWriter::Stamp(const Frame& frame) {
  const uint8_t* base = segment_->data(ring_);
  if (frame.empty() || frame.data() < base || frame.data() >= base + segment_->ring_bytes())
    return std::nullopt;
  const auto offset = static_cast<uint64_t>(frame.data() - base);
  if (offset % kGranuleBytes != 0) return std::nullopt;
  const auto first = static_cast<uint32_t>(offset / kGranuleBytes);
  const uint32_t k = GranulesFor(frame.size());
  if (first + k > segment_->granules()) return std::nullopt;
  std::atomic<uint32_t>* st = segment_->states(ring_);
  if (lent_) {
    // An earlier send the reader has not given back may be read in place right now.
    for (uint32_t g = first; g < first + k; ++g) {
      if (st[g].load(std::memory_order_acquire) != 0) return std::nullopt;
    }
  }
  const uint32_t gen = NextGeneration();
  const int64_t now = NowMs();
  for (uint32_t g = first; g < first + k; ++g) {
    claimed_ms_[g] = now;
    st[g].store(gen, std::memory_order_release);
  }
  return Descriptor{ring_, gen, offset, frame.size()};
}

}  // namespace leash::shm

// Same-host shared memory for the ZeroMQ transport: a client and a shard on one machine
// pass large frames through a POSIX shared-memory segment instead of through the kernel's
// TCP (or Unix socket) buffers; the ZeroMQ message then carries only a descriptor.
//
// One segment per (client, shard) connection, created by the client and mapped by the
// shard, holding two rings of fixed-size granules: ring 0 carries client -> shard frames
// (the client writes, the shard reads), ring 1 shard -> client frames. Each ring has one
// writer process and one reader process. A granule's state word is 0 when free and the
// writer's generation number while a frame occupies it: the writer claims free granules,
// copies the frame in and sends {offset, size, generation}; the reader checks that every
// granule still holds that generation, reads, and stores 0 to give them back.
//
// A ring is sized by what goes through it, not up front: the segment spans the rings'
// largest size but holds memory only for its header and state words; a writer that finds
// no room reserves more of its ring's start in /dev/shm (posix_fallocate, so touching it
// can never fault for lack of space) and declares it in the header, up to the largest
// size. A ring thus holds the most its frames in flight at once ever needed (at most 1.5x
// that, in steps of 1 MiB), and a worker with several shards fits a container's 64 MB.
//
// Thread-safety: ShmSegment is immutable after creation; its state words are atomics.
// ShmWriter is used by one thread at a time, except that frames it allocated may be
// released (destroyed) on any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "leash/common/message.h"
#include "leash/common/status.h"

namespace leash::shm {

inline constexpr uint32_t kVersion = 3;
inline constexpr size_t kGranuleBytes = 16 * 1024;
// Each direction's message queue (Enqueue): slots, and the bytes a record may hold inline.
inline constexpr uint64_t kQueueSlots = 256;
inline constexpr size_t kSlotInline = 480;

// One slot of a message queue: a record inline, or (generation != 0) a frame of the ring.
struct QueueSlot {
  uint32_t size;        // bytes of the record
  uint32_t generation;  // 0: the record is in `bytes`; else it is the ring's frame at `offset`
  uint64_t offset;
  uint8_t bytes[kSlotInline];
};

// Where a frame lies in a ring, as sent beside the ZeroMQ message.
struct Descriptor {
  uint32_t ring = 0;        // 0: client -> shard, 1: shard -> client
  uint32_t generation = 0;  // the writer's stamp on the granules; never 0
  uint64_t offset = 0;      // from the start of the ring's data, a multiple of the granule
  uint64_t size = 0;        // bytes
};

// Bytes of a segment reserved from its creation on: a page of header, the message queues
// and a state word per granule of each ring (shm_segment_test.cc checks what /dev/shm holds).
size_t ControlBytes(uint32_t granules);

class ShmSegment {
 public:
  // Creates a segment named /leash-shm-<pid>-<random> with two rings of at most
  // `ring_bytes` (rounded up to whole granules) each. Only its header and state words are
  // reserved now (a page and 8 bytes a granule); the rings' memory is reserved by their
  // writers as frames need it (Grow). IOError naming the call on failure.
  static Result<std::shared_ptr<ShmSegment>> Create(size_t ring_bytes);
  // Maps the segment `name` a peer created, after checking that the name has the form
  // Create() gives, the object belongs to this user, its header is intact and holds
  // `token`. NotFound if no such segment exists here (the peer is on another host, or
  // in another container); InvalidArgument for a bad name, token or header.
  static Result<std::shared_ptr<ShmSegment>> Open(const std::string& name, uint64_t token);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Creator only, once: marks the segment ready (the shard accepted it). FailedPrecondition
  // if called again or on a segment that was opened. Neither end keeps a file descriptor
  // open (a shard opening many workers' segments holds only the mappings).
  Status Activate();
  // True once the creator's Activate() succeeded: only then may a writer use the rings.
  bool ready() const;
  // The writer of `ring` only: reserves the first `granules` granules of the ring in
  // /dev/shm (posix_fallocate on the segment opened again by name; what is reserved
  // already costs nothing again) and declares them to the reader. IOError saying that
  // /dev/shm is too small when it cannot; the ring is then as it was.
  Status Grow(uint32_t ring, uint32_t granules);
  // Granules of `ring` its writer declared reserved: the reader reads no frame beyond.
  uint32_t reserved(uint32_t ring) const;

  const std::string& name() const { return name_; }
  uint64_t token() const { return token_; }
  // The most granules (bytes) a ring may grow to.
  uint32_t granules() const { return granules_; }
  size_t ring_bytes() const { return static_cast<size_t>(granules_) * kGranuleBytes; }

  uint8_t* data(uint32_t ring) { return rings_[ring]; }
  std::atomic<uint32_t>* states(uint32_t ring) { return states_[ring]; }

  // Reader side. Checks `d` (ring, bounds within the reserved part of the ring, and that
  // its granules hold its generation) and returns the frame's bytes, InvalidArgument saying
  // what is wrong with it, or NotFound when its granules hold another generation (the
  // writer sent the frame again, or took it back).
  Result<const uint8_t*> Check(const Descriptor& d);
  // Reader side: gives the granules of `d` back to the writer.
  void Release(const Descriptor& d);
  // Reader side: copies the frame `d` out and gives its granules back. DataLoss if the
  // writer reused them while they were read (it reclaims granules unreleased for long).
  // `copier` (optional) makes the copy instead of Frame::CopyCheckingFinite.
  Result<Frame> CopyOut(const Descriptor& d, const FrameCopier* copier = nullptr);
  // Reader side: the frame `d` in place, without copying; its granules go back to the
  // writer when the last copy of the Frame is destroyed. The writer must never reclaim
  // granules of this ring.
  Result<Frame> Borrow(std::shared_ptr<ShmSegment> self, const Descriptor& d);

  // The message queue of `ring` (same direction as the ring), for whole messages when
  // both ends send them through the segment (shm_link.h): records in order, each inline
  // in its slot or a frame of the ring (`frame`, from the ring's writer). One writer (the
  // ring's), one reader. A reader about to wait says so (Doze); a writer that finds it
  // dozing rings its bell (MakeBells), once.
  enum class Posted { kFull, kQueued, kRing };  // kRing: the reader dozes, ring its bell
  Posted Enqueue(uint32_t ring, const uint8_t* record, size_t size);
  Posted Enqueue(uint32_t ring, const Descriptor& frame);
  // Reader: the oldest record's slot, or nullptr if none. InvalidArgument if the writer's
  // index is impossible (a corrupt or hostile segment).
  Result<const QueueSlot*> Front(uint32_t ring);
  // Reader: done with the slot Front() gave.
  void Pop(uint32_t ring);
  // Reader: about to wait on the bell. False (and not dozing) if a record is there.
  bool Doze(uint32_t ring);
  // Reader: awake again (after its wait, or when it decided not to wait).
  void Wake(uint32_t ring);

  // Creator: makes the FIFOs that wake each queue's reader, /dev/shm/<name>.bell<ring>.
  Status MakeBells();
  // Opens `ring`'s bell (non-blocking, both ends may use it) after checking that it is a
  // FIFO of this user; the caller owns the descriptor. NotFound if there is none.
  Result<int> OpenBell(uint32_t ring) const;

  // The creator let the segment go: its name is gone (unlinked at exit, or as a dead
  // process's).
  bool NameGone() const;
  // The process of the pid in the segment's name no longer exists.
  bool CreatorDead() const;
  // Removes the segment's name and its bells (creator, at exit); mappings stay valid.
  void Unlink();
  // Unlinks segments of processes that no longer exist (left by crashed clients).
  static void RemoveStale();

 private:
  ShmSegment() = default;
  Status Map(int fd, size_t size, bool create);
  Posted Publish(uint32_t ring, uint64_t head);
  size_t RingOffset(uint32_t ring) const;

  std::string name_;
  uint64_t token_ = 0;
  uint32_t granules_ = 0;
  bool creator_ = false;
  bool activated_ = false;
  bool unlinked_ = false;
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
  std::atomic<uint32_t>* states_[2] = {nullptr, nullptr};
  uint8_t* queues_[2] = {nullptr, nullptr};
  uint8_t* rings_[2] = {nullptr, nullptr};
};

// A bell: the descriptor of a FIFO a queue's writer rings to wake its reader, which polls it.
class Bell {
 public:
  explicit Bell(int fd) : fd_(fd) {}
  ~Bell();
  Bell(const Bell&) = delete;
  Bell& operator=(const Bell&) = delete;
  int fd() const { return fd_; }
  void Ring();
  // Reads whatever rang, so that the descriptor polls quiet again.
  void Drain();

 private:
  int fd_;
};

// The writing end of one ring. Frames are placed in the first free granules from the
// ring's start; when none are free the ring grows (ShmSegment::Grow) up to its largest
// size, and a ring that can neither hold nor grow says so: the caller sends the frame
// inline. After /dev/shm refused to grow it the ring stays as it is for 5 s.
class ShmWriter {
 public:
  // `reclaim_ms` > 0: granules a reader has not given back after that long are taken
  // back (the reader died with them); readers of such a ring must CopyOut. 0: never.
  // `lent`: the reader may read frames in place (Borrow) and hold them: a frame whose
  // granules the reader has not given back is never stamped again (Stamp says nullopt, and
  // a resend goes into other granules), so bytes a reader still reads never change under
  // it. Needs reclaim_ms 0.
  ShmWriter(std::shared_ptr<ShmSegment> segment, uint32_t ring, int64_t reclaim_ms,
            bool lent = false);

  // Copies `frame` into the ring. nullopt if the ring has no room for it.
  std::optional<Descriptor> Put(const Frame& frame);
  // Reserves room for `size` bytes that the caller fills through the returned frame's
  // data() before sending it; the granules stay with the writer until that frame (and
  // every copy of it) is destroyed and the reader has given them back. nullopt if the
  // ring has no room.
  std::optional<Frame> Reserve(size_t size);
  // If `frame` was made by Reserve() of this writer: stamps its granules with a new
  // generation (a resend of the same frame is read again) and returns its descriptor.
  // A lent writer's frame whose granules the reader still holds: nullopt.
  std::optional<Descriptor> Stamp(const Frame& frame);

  // Bytes of the ring reserved in /dev/shm so far.
  size_t reserved_bytes() const { return static_cast<size_t>(reserved_) * kGranuleBytes; }
  // Why the ring last failed to grow, once (then nullopt until it fails again).
  std::optional<Status> TakeGrowthError();

 private:
  struct Reservation;
  std::optional<uint32_t> Claim(uint32_t k, int64_t now_ms);
  std::optional<uint32_t> FirstFit(uint32_t k, int64_t now_ms);
  bool Grow(uint32_t k, int64_t now_ms);
  uint32_t NextGeneration();

  static constexpr uint32_t kGrowthGranules = (1u << 20) / kGranuleBytes;  // 1 MiB steps
  static constexpr int64_t kGrowthRetryMs = 5000;

  std::shared_ptr<ShmSegment> segment_;
  uint32_t ring_;
  int64_t reclaim_ms_;
  bool lent_ = false;
  uint32_t generation_ = 0;
  uint32_t reserved_ = 0;  // this writer's own count: it never trusts the peer's header
  int64_t grow_again_ms_ = 0;
  std::optional<Status> growth_error_;
  std::vector<int64_t> claimed_ms_;  // when each granule was last stamped
  // Granules held by frames from Reserve() that are still alive (released on any thread).
  std::shared_ptr<std::vector<std::atomic<uint8_t>>> held_;
};

}  // namespace leash::shm

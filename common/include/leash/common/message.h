// Frames and multipart messages as the transport moves them, without ZeroMQ types,
// so library code and tests need no socket. A Frame is an immutable byte range whose
// storage is shared (zero-copy from and to the transport). Thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace leash {

class Frame {
 public:
  Frame() = default;

  // Copies `size` bytes.
  static Frame Copy(const void* data, size_t size);
  static Frame Copy(std::string_view s) { return Copy(s.data(), s.size()); }
  // Copies `size` bytes and, in the same pass, learns whether they are float32 values none
  // of which is NaN or Inf (finite_f32()).
  static Frame CopyCheckingFinite(const void* data, size_t size);
  // Copies the bytes of `src` to `dst` (src.size() bytes, not overlapping them) and, in the
  // same pass, learns whether they are float32 values none of which is NaN or Inf: returns
  // `src` itself (the same storage) knowing that fact, as CopyCheckingFinite's copy would.
  static Frame CopyToCheckingFinite(const Frame& src, void* dst);
  // `src`, knowing what a CopyToCheckingFinite made in parts found: `finite` when every part's
  // CopyAllFinite said true (ps::CopyAllFiniteShared), or the destination of such a
  // copy (the same bytes: a primary's copy of an entry into its backup's ring); for nothing
  // else.
  static Frame CopiedCheckingFinite(const Frame& src, bool finite) {
    Frame f = src;
    f.finite_f32_ = finite && src.size() > 0 && !src.unstable_;  // its sender may change it
    return f;
  }
  // `src`, a frame read in place where a checking copy wrote it (lent()), knowing what that
  // copy found: a backup replica's log entry whose primary copied it into the backup's ring
  // with CopyToCheckingFinite and says it found it finite (ReplEntry.finite_frames). A frame
  // that is not lent gains nothing (its bytes came some other way).
  static Frame LentFinite(const Frame& src) {
    Frame f = src;
    f.finite_f32_ = src.lent() && src.size() > 0 && !src.unstable_;
    return f;
  }
  // Takes the bytes of `bytes` without copying.
  static Frame Own(std::vector<uint8_t> bytes);
  // Refers to `data` without copying; `owner` keeps it alive.
  static Frame Wrap(const void* data, size_t size, std::shared_ptr<const void> owner) {
    Frame f;
    f.data_ = static_cast<const uint8_t*>(data);
    f.size_ = size;
    f.owner_ = std::move(owner);
    return f;
  }

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  std::string_view view() const { return {reinterpret_cast<const char*>(data_), size_}; }
  const std::shared_ptr<const void>& owner() const { return owner_; }
  // True: the bytes lie in place in a shared-memory ring whose writer gets the room back only
  // when the frame is released (ShmSegment::Borrow): read them and let go; copy them to keep
  // them for long. Every copy of the frame keeps the mark.
  bool lent() const { return lent_; }
  // This frame marked as lent().
  Frame Lent() const {
    Frame f = *this;
    f.lent_ = true;
    return f;
  }
  // True: the bytes lie in place in the ring of a sender that may still change them (a
  // worker's push on this host, borrowed by a replicated primary's transport:
  // ZmqOptions::shm_borrow_all). Never read them where the value matters twice: copy them
  // once, checking as the copy goes (a primary copies them straight into its backups'
  // rings, or out), and use the copy. Every copy of the frame keeps the mark; lent() too.
  bool unstable() const { return unstable_; }
  // This frame marked as lent() and unstable().
  Frame Unstable() const {
    Frame f = Lent();
    f.unstable_ = true;
    return f;
  }
  // True: the bytes are whole float32 values, every one finite, as found by the copy that
  // made this frame (CopyCheckingFinite) or copied it (CopyToCheckingFinite, or its parts:
  // CopiedCheckingFinite), or by the copy that wrote a lent frame (LentFinite). False: not
  // known. A fact about immutable bytes, so every copy of the frame keeps it; nothing else
  // can set it.
  bool finite_f32() const { return finite_f32_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<const void> owner_;
  bool finite_f32_ = false;
  bool lent_ = false;
  bool unstable_ = false;
};

// A multipart message: frame 0 is the header, the rest are payloads.
using Message = std::vector<Frame>;

// Makes a frame of a copy of `bytes` bytes at `data`, as Frame::CopyCheckingFinite does
// (the same bytes, the same finite_f32()), perhaps sharing the pass among threads: how a
// server's transport copies frames out of shared memory when its server gives it one
// (ServerTransport::SetFrameCopier).
using FrameCopier = std::function<Frame(const void* data, size_t bytes)>;

// The bytes of all of a message's frames.
inline size_t MessageBytes(const Message& m) {
  size_t n = 0;
  for (const Frame& f : m) n += f.size();
  return n;
}

}  // namespace leash

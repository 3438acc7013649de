// Frame constructors. Thread-safe (no shared state).
#include "leash/common/message.h"

#include "leash/common/finite.h"

namespace leash {

Frame Frame::Copy(const void* data, size_t size) {
  // Uninitialized storage: zeroing bytes about to be overwritten was a pass of its own.
  std::shared_ptr<uint8_t[]> buf(new uint8_t[size]);
  uint8_t* p = buf.get();
  if (size > 0) std::memcpy(p, data, size);
  return Wrap(p, size, std::move(buf));
}

Frame Frame::CopyCheckingFinite(const void* data, size_t size) {
  std::shared_ptr<uint8_t[]> buf(new uint8_t[size]);
  uint8_t* p = buf.get();
  const bool finite = size > 0 && CopyAllFinite(p, data, size);
  Frame f = Wrap(p, size, std::move(buf));
  f.finite_f32_ = finite;
  return f;
}

Frame Frame::CopyToCheckingFinite(const Frame& src, void* dst) {
  Frame f = src;
  // What was checked is the copy at `dst`, not an unstable source its sender may change.
  if (src.size() > 0 && CopyAllFinite(dst, src.data(), src.size()) && !src.unstable_)
    f.finite_f32_ = true;
  return f;
}

Frame Frame::Own(std::vector<uint8_t> bytes) {
  auto holder = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  const uint8_t* p = holder->data();
  size_t n = holder->size();
  return Wrap(p, n, std::shared_ptr<const void>(holder, holder.get()));
}

}  // namespace leash

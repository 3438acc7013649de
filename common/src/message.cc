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

Frame Frame::Kept() const {
  if (!lent_) return *this;
  if (size_ % sizeof(float) != 0) return Copy(data_, size_);
  std::shared_ptr<float[]> buf(new float[size_ / sizeof(float)]);
  float* p = buf.get();
  // CopyAllFinite reads its source by unaligned loads or memcpy: any alignment will do.
  const bool finite =
      CopyAllFinite(p, reinterpret_cast<const float*>(data_), size_ / sizeof(float));
  Frame f = Wrap(p, size_, std::move(buf));
  f.finite_floats_ = finite;
  return f;
}

Frame Frame::Own(std::vector<uint8_t> bytes) {
  auto holder = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  const uint8_t* p = holder->data();
  size_t n = holder->size();
  return Wrap(p, n, std::shared_ptr<const void>(holder, holder.get()));
}

}  // namespace leash

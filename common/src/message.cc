// Frame constructors. Thread-safe (no shared state).
#include "leash/common/message.h"

namespace leash {

Frame Frame::Copy(const void* data, size_t size) {
  std::vector<uint8_t> v(size);
  if (size > 0) std::memcpy(v.data(), data, size);
  return Own(std::move(v));
}

Frame Frame::Own(std::vector<uint8_t> bytes) {
  auto holder = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  const uint8_t* p = holder->data();
  size_t n = holder->size();
  return Wrap(p, n, std::shared_ptr<const void>(holder, holder.get()));
}

}  // namespace leash

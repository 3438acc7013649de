#include "gradient_pool.h"

#include <algorithm>
#include <cstdlib>
#include <new>

namespace leash::worker {

void GradientPool::Free::operator()(float* p) const { std::free(p); }

GradientPool::GradientPool(const std::vector<size_t>& sizes) : state_(std::make_shared<State>()) {
  state_->sizes = sizes;
  state_->all.resize(sizes.size());
  state_->free.resize(sizes.size());
}

float* GradientPool::Take(size_t i) {
  std::lock_guard<std::mutex> lock(state_->mu);
  std::vector<float*>& free = state_->free.at(i);
  if (!free.empty()) {
    float* buf = free.back();
    free.pop_back();
    return buf;
  }
  // Rounded up to the alignment, as aligned_alloc requires; at least one float.
  size_t bytes = (std::max<size_t>(state_->sizes[i], 1) * sizeof(float) + 63) / 64 * 64;
  auto* buf = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (buf == nullptr) throw std::bad_alloc();
  state_->all[i].emplace_back(buf);
  return buf;
}

std::shared_ptr<const float> GradientPool::HandOver(size_t i, float* buf) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    ++state_->handed_over;
  }
  // The deleter keeps the state alive, so a buffer released after the pool still has a
  // list to go back to (and is freed with the state).
  std::shared_ptr<State> state = state_;
  return std::shared_ptr<const float>(buf, [state, i](const float* p) {
    std::lock_guard<std::mutex> lock(state->mu);
    state->free[i].push_back(const_cast<float*>(p));
  });
}

void GradientPool::Return(size_t i, float* buf) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->free.at(i).push_back(buf);
}

size_t GradientPool::allocated(size_t i) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->all.at(i).size();
}

int64_t GradientPool::handed_over() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->handed_over;
}

}  // namespace leash::worker

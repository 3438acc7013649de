// Buffers the training loop computes gradients into and hands to the client
// (Client::Push of a shared_ptr): a buffer handed over comes back to the pool only when
// the last reference to it is dropped (the client's, once no message or resend can still
// read it, possibly on ZeroMQ's I/O thread), so a push is sent from the floats backward
// wrote and none is overwritten while in flight. Private to worker/src.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace leash::worker {

class GradientPool {
 public:
  // One pool per parameter: parameter i's buffers hold sizes[i] floats.
  explicit GradientPool(const std::vector<size_t>& sizes);

  // A buffer of parameter i that nobody reads: a returned one, else a new one (64-byte
  // aligned). The caller gives it back with HandOver or Return.
  float* Take(size_t i);
  // Hands `buf` (from Take(i)) to whoever holds the result; it comes back to the pool
  // when the last copy of the result is destroyed, from any thread, even after the pool.
  std::shared_ptr<const float> HandOver(size_t i, float* buf);
  // Gives back a buffer taken but not handed over.
  void Return(size_t i, float* buf);

  // Buffers allocated for parameter i so far (taken, handed over or free).
  size_t allocated(size_t i) const;
  // Buffers handed over so far, all parameters together.
  int64_t handed_over() const;

 private:
  struct Free {
    void operator()(float* p) const;
  };
  struct State {
    mutable std::mutex mu;
    std::vector<size_t> sizes;
    std::vector<std::vector<std::unique_ptr<float, Free>>> all;  // every buffer, by parameter
    std::vector<std::vector<float*>> free;                       // those nobody reads
    int64_t handed_over = 0;
  };
  std::shared_ptr<State> state_;
};

}  // namespace leash::worker

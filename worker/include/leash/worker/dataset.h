// Datasets in IDX format (MNIST, Fashion-MNIST), plain or gzip-compressed, and a
// prefetching batch loader. Dataset is immutable after loading (thread-safe to read);
// BatchLoader is used by one consumer thread and runs one producer thread of its own.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "leash/common/status.h"

namespace leash::worker {

struct Dataset {
  int64_t count = 0;
  int64_t rows = 0;  // image height
  int64_t cols = 0;  // image width
  int64_t features() const { return rows * cols; }
  std::vector<float> images;    // count x features, scaled to [0, 1] then standardized
  std::vector<int32_t> labels;  // count, in [0, num_classes)
  int32_t num_classes = 10;
  // Categorical inputs (models with embeddings, e.g. the click-through model): count x
  // key_slots 64-bit feature keys, 0 for an empty slot. Empty (key_slots 0) for images.
  int64_t key_slots = 0;
  std::vector<uint64_t> keys;

  // Keeps only the first `n` samples (no-op for n == 0 or n >= count).
  void Truncate(int64_t n) {
    if (n <= 0 || n >= count) return;
    count = n;
    images.resize(static_cast<size_t>(n * features()));
    labels.resize(static_cast<size_t>(n));
    keys.resize(static_cast<size_t>(n * key_slots));
  }
};

// Reads an IDX image file and label file (".gz" handled transparently). Pixels are
// scaled to [0,1] and standardized with `mean` and `stddev`. InvalidArgument naming the
// file for bad magic numbers, zero sizes, mismatched counts, truncated or corrupt files,
// data beyond what the header describes, or labels >= 10; InvalidArgument also for a
// `stddev` that is not positive and finite; NotFound naming the path (and the Debian
// package) for missing files; IOError when an existing file cannot be read.
Result<Dataset> LoadIdx(const std::string& images_path, const std::string& labels_path,
                        float mean = 0.2860f, float stddev = 0.3530f);

// Loads `train` or `test` ("t10k") of Fashion-MNIST/MNIST from `dir`
// (default /usr/share/datasets/fashion-mnist, Debian package dataset-fashion-mnist).
// An empty `dir` means the default. Uses "<name>.gz" when present, else "<name>".
// NotFound naming both candidates and the package when neither exists; otherwise as LoadIdx.
Result<Dataset> LoadFashionMnist(const std::string& dir, bool train);

struct Batch {
  std::vector<float> images;    // size x features
  std::vector<int32_t> labels;  // size
  std::vector<uint64_t> keys;   // size x key_slots (Dataset::keys), empty for images
  int64_t size = 0;
  int64_t epoch = 0;
  int64_t index = 0;  // batch number within the epoch
};

struct LoaderOptions {
  int64_t batch_size = 64;
  int64_t prefetch = 4;  // batches prepared ahead
  uint64_t seed = 1;     // shuffle seed; each epoch reshuffles deterministically
  bool shuffle = true;
  bool drop_last = false;
};

// Produces shuffled batches of `indices` (sample numbers into `data`) on a background
// thread, `prefetch` batches ahead. Next() returns nullopt at the end of the epoch.
// The order depends only on (seed, epoch) and is the same on every platform; with
// shuffle=false it is `indices` as given. `data` must outlive the loader. Requires
// batch_size >= 1 and every index in [0, data.count) (aborts otherwise: caller bug);
// prefetch < 1 is treated as 1. Destroying the loader mid-epoch stops the producer
// after at most the batch it is copying.
class BatchLoader {
 public:
  BatchLoader(const Dataset& data, std::vector<int64_t> indices, const LoaderOptions& options,
              int64_t epoch);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Blocks until the next batch is ready. nullopt once the epoch is exhausted.
  std::optional<Batch> Next();
  int64_t num_batches() const { return num_batches_; }

 private:
  void Produce();

  const Dataset& data_;
  std::vector<int64_t> order_;
  LoaderOptions options_;
  int64_t epoch_;
  int64_t num_batches_ = 0;
  std::mutex mu_;
  std::condition_variable batch_ready_;  // producer -> consumer: ready_ grew or done_
  std::condition_variable space_free_;   // consumer -> producer: ready_ shrank or stop_
  std::deque<Batch> ready_;              // guarded by mu_
  bool done_ = false;                    // guarded by mu_; producer has pushed every batch
  bool stop_ = false;                    // guarded by mu_; destructor asks the producer to quit
  std::thread producer_;
};

}  // namespace leash::worker

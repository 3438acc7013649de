// Datasets in IDX format (MNIST, Fashion-MNIST), plain or gzip-compressed, and a
// prefetching batch loader. Dataset is immutable after loading (thread-safe to read);
// BatchLoader is used by one consumer thread and runs one producer thread of its own.
#pragma once

#include <atomic>
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
  int64_t rows = 0;              // image height
  int64_t cols = 0;              // image width
  int64_t features() const { return rows * cols; }
  std::vector<float> images;     // count x features, scaled to [0, 1] then standardized
  std::vector<int32_t> labels;   // count, in [0, num_classes)
  int32_t num_classes = 10;
};

// Reads an IDX image file and label file (".gz" handled transparently). Pixels are
// scaled to [0,1] and standardized with `mean` and `stddev`. InvalidArgument naming the
// file for bad magic numbers, mismatched counts, truncated files or labels >= 10;
// NotFound naming the path (and the Debian package) for missing files.
Result<Dataset> LoadIdx(const std::string& images_path, const std::string& labels_path, float mean = 0.2860f,
                        float stddev = 0.3530f);

// Loads `train` or `test` ("t10k") of Fashion-MNIST/MNIST from `dir`
// (default /usr/share/datasets/fashion-mnist, Debian package dataset-fashion-mnist).
Result<Dataset> LoadFashionMnist(const std::string& dir, bool train);

struct Batch {
  std::vector<float> images;     // size x features
  std::vector<int32_t> labels;   // size
  int64_t size = 0;
  int64_t epoch = 0;
  int64_t index = 0;             // batch number within the epoch
};

struct LoaderOptions {
  int64_t batch_size = 64;
  int64_t prefetch = 4;          // batches prepared ahead
  uint64_t seed = 1;             // shuffle seed; each epoch reshuffles deterministically
  bool shuffle = true;
  bool drop_last = false;
};

// Produces shuffled batches of `indices` (sample numbers into `data`) on a background
// thread, `prefetch` batches ahead. Next() returns nullopt at the end of the epoch.
class BatchLoader {
 public:
  BatchLoader(const Dataset& data, std::vector<int64_t> indices, const LoaderOptions& options, int64_t epoch);
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
  std::condition_variable cv_;
  std::deque<Batch> ready_;
  bool done_ = false;
  std::atomic<bool> stop_{false};
  std::thread producer_;
};

}  // namespace leash::worker

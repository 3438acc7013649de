// IDX dataset loading (plain or gzip through zlib) and the prefetching BatchLoader.
// LoadIdx/LoadFashionMnist are thread-safe (no shared state); a BatchLoader is driven by
// one consumer thread and owns one producer thread, synchronized on its mutex.
#include "leash/worker/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <system_error>
#include <utility>

namespace leash::worker {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kImageMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kLabelMagic = 0x00000801;  // unsigned byte, 1 dimension
constexpr int32_t kNumClasses = 10;
constexpr const char* kDefaultDir = "/usr/share/datasets/fashion-mnist";
constexpr const char* kPackageHint =
    "install Fashion-MNIST with `apt-get install dataset-fashion-mnist` "
    "(it puts the files in /usr/share/datasets/fashion-mnist)";

// A header claiming more elements than this is corrupt, not a dataset we could hold.
constexpr uint64_t kMaxElements = uint64_t{1} << 40;
// Deflate cannot expand input by more than about 1032:1, so the compressed size bounds
// what a file can really hold; the first allocation never trusts the header beyond it.
constexpr uint64_t kMaxDeflateRatio = 1032;
// Without a size on disk (not a regular file) the buffer starts here and doubles.
constexpr uint64_t kUnknownSizeFirstRead = uint64_t{64} << 20;
constexpr unsigned kGzBufferBytes = 256 * 1024;
constexpr unsigned kMaxReadChunk = 1u << 30;  // gzread takes an unsigned, returns an int

struct GzClose {
  void operator()(gzFile_s* file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<gzFile_s, GzClose>;

struct IdxFile {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;  // product(dims) bytes
};

std::string Hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// The single place zlib's error channel becomes a Status: corrupt compressed data is the
// file's fault (InvalidArgument), an OS read error is IOError.
Status GzReadError(gzFile file, const std::string& path) {
  int code = Z_OK;
  const char* message = gzerror(file, &code);
  if (code == Z_ERRNO) return IOError(path + ": read failed: " + std::strerror(errno));
  return InvalidArgument(path +
                         ": corrupt gzip data: " + (message ? message : "unknown zlib error"));
}

// Reads up to `n` bytes into `dst`; returns how many were read (fewer only at end of file).
Result<uint64_t> ReadUpTo(gzFile file, const std::string& path, uint8_t* dst, uint64_t n) {
  uint64_t got = 0;
  while (got < n) {
    const unsigned want = static_cast<unsigned>(std::min<uint64_t>(n - got, kMaxReadChunk));
    const int r = gzread(file, dst + got, want);
    if (r < 0) return GzReadError(file, path);
    if (r == 0) {
      // zlib reports a gzip stream cut short (even one missing only its CRC trailer) as a
      // plain end of file with Z_BUF_ERROR recorded; without this check it would pass.
      int code = Z_OK;
      gzerror(file, &code);
      if (code == Z_BUF_ERROR)
        return InvalidArgument(path + ": truncated: the gzip stream ends early");
      break;
    }
    got += static_cast<uint64_t>(r);
  }
  return got;
}

Result<GzFile> Open(const std::string& path, uint64_t* file_size) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return NotFound(path + ": no such file; " + kPackageHint);
  if (fs::is_directory(st)) return InvalidArgument(path + ": is a directory, expected an IDX file");
  const uintmax_t size = fs::file_size(path, ec);
  *file_size = ec ? 0 : static_cast<uint64_t>(size);
  errno = 0;
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    if (errno == ENOENT) return NotFound(path + ": no such file; " + kPackageHint);
    return IOError(path + ": cannot open: " + (errno ? std::strerror(errno) : "out of memory"));
  }
  gzbuffer(file, kGzBufferBytes);
  return GzFile(file);
}

// Reads an unsigned-byte IDX file with `ndims` dimensions, checking the header against
// the data that is really there.
Result<IdxFile> ReadIdx(const std::string& path, uint32_t magic, int ndims) {
  uint64_t file_size = 0;
  LEASH_ASSIGN_OR_RETURN(GzFile file, Open(path, &file_size));

  std::array<uint8_t, 4 + 4 * 3> header{};
  const uint64_t header_bytes = 4 + 4 * static_cast<uint64_t>(ndims);
  LEASH_ASSIGN_OR_RETURN(uint64_t got, ReadUpTo(file.get(), path, header.data(), header_bytes));
  if (got < 4) {
    return InvalidArgument(path + ": truncated IDX header (" + std::to_string(got) + " bytes)");
  }
  const uint32_t found_magic = BigEndian32(header.data());
  if (found_magic != magic) {
    return InvalidArgument(path + ": bad magic number " + Hex32(found_magic) + ", expected " +
                           Hex32(magic) +
                           (magic == kImageMagic ? " (IDX3 images)" : " (IDX1 labels)"));
  }
  if (got < header_bytes) {
    return InvalidArgument(path + ": truncated IDX header (" + std::to_string(got) + " of " +
                           std::to_string(header_bytes) + " bytes)");
  }

  IdxFile idx;
  uint64_t total = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint32_t dim = BigEndian32(header.data() + 4 + 4 * d);
    if (dim == 0) return InvalidArgument(path + ": dimension " + std::to_string(d) + " is zero");
    if (total > kMaxElements / dim) {
      return InvalidArgument(path + ": header sizes describe more than " +
                             std::to_string(kMaxElements) + " elements; the header is corrupt");
    }
    total *= dim;
    idx.dims.push_back(dim);
  }

  // One big read into a byte buffer. The first allocation is bounded by what the file can
  // hold, so a lying header cannot make us allocate more than the content justifies.
  uint64_t plausible = kUnknownSizeFirstRead;
  if (file_size != 0) {
    plausible = file_size >= total / kMaxDeflateRatio
                    ? total
                    : file_size * kMaxDeflateRatio + kGzBufferBytes;
  }
  idx.data.resize(static_cast<size_t>(std::min(total, plausible)));
  uint64_t have = 0;
  for (;;) {
    LEASH_ASSIGN_OR_RETURN(
        uint64_t n, ReadUpTo(file.get(), path, idx.data.data() + have, idx.data.size() - have));
    have += n;
    if (have < idx.data.size() || have == total) break;  // end of file, or all there
    idx.data.resize(static_cast<size_t>(std::min(total, have * 2)));
  }
  if (have < total) {
    return InvalidArgument(path + ": truncated: the header describes " + std::to_string(total) +
                           " bytes of data but the file holds " + std::to_string(have));
  }
  uint8_t extra = 0;
  LEASH_ASSIGN_OR_RETURN(uint64_t trailing, ReadUpTo(file.get(), path, &extra, 1));
  if (trailing != 0) {
    return InvalidArgument(path + ": unexpected data after the " + std::to_string(total) +
                           " bytes the header describes");
  }
  return idx;
}

std::string ResolveName(const fs::path& dir, const std::string& name, Status* missing) {
  std::error_code ec;
  const fs::path gz = dir / (name + ".gz");
  if (fs::exists(gz, ec)) return gz.string();
  const fs::path plain = dir / name;
  if (fs::exists(plain, ec)) return plain.string();
  *missing =
      NotFound("neither " + gz.string() + " nor " + plain.string() + " exists; " + kPackageHint);
  return {};
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, bound) by rejection. std::uniform_int_distribution and std::shuffle are
// implementation-defined, so they would give different orders on different libraries.
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  for (;;) {
    const uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

void DeterministicShuffle(std::vector<int64_t>& v, uint64_t seed, int64_t epoch) {
  std::mt19937_64 rng(SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(epoch))));
  for (size_t i = v.size(); i > 1; --i) {
    std::swap(v[i - 1], v[static_cast<size_t>(UniformBelow(rng, i))]);
  }
}

}  // namespace

Result<Dataset> LoadIdx(const std::string& images_path, const std::string& labels_path, float mean,
                        float stddev) {
  if (!std::isfinite(mean) || !std::isfinite(stddev) || !(stddev > 0.0f)) {
    return InvalidArgument(
        "LoadIdx: normalization needs a finite mean and a positive finite stddev, got mean " +
        std::to_string(mean) + ", stddev " + std::to_string(stddev));
  }
  LEASH_ASSIGN_OR_RETURN(IdxFile images, ReadIdx(images_path, kImageMagic, 3));
  LEASH_ASSIGN_OR_RETURN(IdxFile labels, ReadIdx(labels_path, kLabelMagic, 1));
  if (images.dims[0] != labels.dims[0]) {
    return InvalidArgument(images_path + " holds " + std::to_string(images.dims[0]) +
                           " images but " + labels_path + " holds " +
                           std::to_string(labels.dims[0]) + " labels");
  }

  Dataset ds;
  ds.count = images.dims[0];
  ds.rows = images.dims[1];
  ds.cols = images.dims[2];
  ds.num_classes = kNumClasses;

  ds.labels.resize(labels.data.size());
  for (size_t i = 0; i < labels.data.size(); ++i) {
    const int32_t label = labels.data[i];
    if (label >= kNumClasses) {
      return InvalidArgument(labels_path + ": label " + std::to_string(label) + " of sample " +
                             std::to_string(i) + " is not below the " +
                             std::to_string(kNumClasses) + " classes");
    }
    ds.labels[i] = label;
  }

  // A byte has 256 values, so a lookup table does the scaling and standardization exactly
  // once per value; the loop over 47M pixels is then a plain gather.
  std::array<float, 256> table{};
  for (int v = 0; v < 256; ++v) table[v] = (static_cast<float>(v) / 255.0f - mean) / stddev;
  ds.images.resize(images.data.size());
  const uint8_t* src = images.data.data();
  float* dst = ds.images.data();
  for (size_t i = 0, n = images.data.size(); i < n; ++i) dst[i] = table[src[i]];
  return ds;
}

Result<Dataset> LoadFashionMnist(const std::string& dir, bool train) {
  const fs::path root = dir.empty() ? fs::path(kDefaultDir) : fs::path(dir);
  const std::string prefix = train ? "train" : "t10k";
  Status missing;
  const std::string images = ResolveName(root, prefix + "-images-idx3-ubyte", &missing);
  if (!missing.ok()) return missing;
  const std::string labels = ResolveName(root, prefix + "-labels-idx1-ubyte", &missing);
  if (!missing.ok()) return missing;
  return LoadIdx(images, labels);
}

BatchLoader::BatchLoader(const Dataset& data, std::vector<int64_t> indices,
                         const LoaderOptions& options, int64_t epoch)
    : data_(data), order_(std::move(indices)), options_(options), epoch_(epoch) {
  LEASH_CHECK(options_.batch_size >= 1);
  options_.prefetch = std::max<int64_t>(options_.prefetch, 1);
  for (int64_t index : order_) LEASH_CHECK(index >= 0 && index < data_.count);
  if (options_.shuffle) DeterministicShuffle(order_, options_.seed, epoch_);

  const auto n = static_cast<int64_t>(order_.size());
  num_batches_ = options_.drop_last ? n / options_.batch_size
                                    : (n + options_.batch_size - 1) / options_.batch_size;
  if (num_batches_ == 0) {
    done_ = true;
    return;
  }
  producer_ = std::thread([this] { Produce(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  space_free_.notify_all();
  if (producer_.joinable()) producer_.join();
}

std::optional<Batch> BatchLoader::Next() {
  std::unique_lock<std::mutex> lock(mu_);
  batch_ready_.wait(lock, [this] { return !ready_.empty() || done_; });
  if (ready_.empty()) return std::nullopt;
  Batch batch = std::move(ready_.front());
  ready_.pop_front();
  lock.unlock();
  space_free_.notify_one();
  return batch;
}

void BatchLoader::Produce() {
  const int64_t features = data_.features();
  const auto n = static_cast<int64_t>(order_.size());
  for (int64_t b = 0; b < num_batches_; ++b) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      space_free_.wait(lock, [this] {
        return stop_ || static_cast<int64_t>(ready_.size()) < options_.prefetch;
      });
      if (stop_) return;
    }
    // Copy outside the lock so the consumer can take earlier batches meanwhile.
    const int64_t begin = b * options_.batch_size;
    const int64_t size = std::min(options_.batch_size, n - begin);
    Batch batch;
    batch.size = size;
    batch.epoch = epoch_;
    batch.index = b;
    batch.images.resize(static_cast<size_t>(size * features));
    batch.labels.resize(static_cast<size_t>(size));
    const int64_t slots = data_.key_slots;
    batch.keys.resize(static_cast<size_t>(size * slots));
    for (int64_t r = 0; r < size; ++r) {
      const int64_t sample = order_[static_cast<size_t>(begin + r)];
      std::copy_n(data_.images.begin() + sample * features, features,
                  batch.images.begin() + r * features);
      batch.labels[static_cast<size_t>(r)] = data_.labels[static_cast<size_t>(sample)];
      if (slots > 0)
        std::copy_n(data_.keys.begin() + sample * slots, slots, batch.keys.begin() + r * slots);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(std::move(batch));
    }
    batch_ready_.notify_one();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  batch_ready_.notify_one();
}

}  // namespace leash::worker

// Tests for LoadIdx / LoadFashionMnist (synthetic IDX files, plain and gzip, in a temp dir;
// the real Fashion-MNIST when installed) and for BatchLoader. Single-threaded tests apart
// from the loader's own producer thread.
#include "leash/worker/dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace leash::worker {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

constexpr uint32_t kImageMagic = 0x00000803;
constexpr uint32_t kLabelMagic = 0x00000801;
constexpr const char* kFashionDir = "/usr/share/datasets/fashion-mnist";

void PutBigEndian32(Bytes& out, uint32_t v) {
  out.push_back(static_cast<uint8_t>(v >> 24));
  out.push_back(static_cast<uint8_t>(v >> 16));
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

Bytes Idx(uint32_t magic, const std::vector<uint32_t>& dims, const Bytes& data) {
  Bytes out;
  PutBigEndian32(out, magic);
  for (uint32_t d : dims) PutBigEndian32(out, d);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

Bytes Images(uint32_t count, uint32_t rows, uint32_t cols, const Bytes& pixels) {
  return Idx(kImageMagic, {count, rows, cols}, pixels);
}

Bytes Labels(const Bytes& labels) {
  return Idx(kLabelMagic, {static_cast<uint32_t>(labels.size())}, labels);
}

void WritePlain(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void WriteGzip(const fs::path& path, const Bytes& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(file), Z_OK);
}

Bytes ReadRaw(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The small valid pair most tests start from: 3 images of 2x3 and their labels.
const Bytes kPixels = {0, 255, 51, 102, 153, 204, 1, 2, 3, 4, 5, 6, 250, 251, 252, 253, 254, 255};
const Bytes kLabels = {0, 9, 4};

class DatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("leash_dataset_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Writes images and labels (gzip or plain) and returns their paths.
  std::pair<std::string, std::string> WritePair(const Bytes& images, const Bytes& labels,
                                                bool gzip) {
    const fs::path ip = dir_ / (gzip ? "images.gz" : "images");
    const fs::path lp = dir_ / (gzip ? "labels.gz" : "labels");
    if (gzip) {
      WriteGzip(ip, images);
      WriteGzip(lp, labels);
    } else {
      WritePlain(ip, images);
      WritePlain(lp, labels);
    }
    return {ip.string(), lp.string()};
  }

  fs::path dir_;
};

void ExpectError(const Result<Dataset>& r, StatusCode code, const std::string& names) {
  ASSERT_FALSE(r.ok()) << "expected an error naming " << names;
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_NE(r.status().message().find(names), std::string::npos)
      << "message does not name " << names << ": " << r.status();
}

TEST_F(DatasetTest, LoadIdxParsesAndNormalizesPlainAndGzip) {
  for (bool gzip : {false, true}) {
    SCOPED_TRACE(gzip ? "gzip" : "plain");
    auto [ip, lp] = WritePair(Images(3, 2, 3, kPixels), Labels(kLabels), gzip);
    const float mean = 0.5f;
    const float stddev = 0.25f;
    Result<Dataset> r = LoadIdx(ip, lp, mean, stddev);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->count, 3);
    EXPECT_EQ(r->rows, 2);
    EXPECT_EQ(r->cols, 3);
    EXPECT_EQ(r->features(), 6);
    EXPECT_EQ(r->num_classes, 10);
    EXPECT_EQ(r->labels, (std::vector<int32_t>{0, 9, 4}));
    ASSERT_EQ(r->images.size(), kPixels.size());
    for (size_t i = 0; i < kPixels.size(); ++i) {
      EXPECT_FLOAT_EQ(r->images[i], (static_cast<float>(kPixels[i]) / 255.0f - mean) / stddev)
          << "pixel " << i;
    }
    EXPECT_FLOAT_EQ(r->images[0], -2.0f);  // 0 -> (0 - 0.5) / 0.25
    EXPECT_FLOAT_EQ(r->images[1], 2.0f);   // 255 -> (1 - 0.5) / 0.25
  }
}

TEST_F(DatasetTest, LoadIdxWithUnitNormalizationScalesToUnitInterval) {
  auto [ip, lp] = WritePair(Images(3, 2, 3, kPixels), Labels(kLabels), false);
  Result<Dataset> r = LoadIdx(ip, lp, 0.0f, 1.0f);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FLOAT_EQ(*std::min_element(r->images.begin(), r->images.end()), 0.0f);
  EXPECT_FLOAT_EQ(*std::max_element(r->images.begin(), r->images.end()), 1.0f);
  EXPECT_FLOAT_EQ(r->images[2], 0.2f);  // 51 / 255
}

TEST_F(DatasetTest, LoadIdxMissingFileIsNotFoundWithPackageHint) {
  auto [ip, lp] = WritePair(Images(3, 2, 3, kPixels), Labels(kLabels), false);
  const std::string missing = (dir_ / "nope-idx3-ubyte.gz").string();
  for (const auto& r : {LoadIdx(missing, lp), LoadIdx(ip, missing)}) {
    ExpectError(r, StatusCode::kNotFound, missing);
    EXPECT_NE(r.status().message().find("apt-get install dataset-fashion-mnist"), std::string::npos)
        << r.status();
  }
}

TEST_F(DatasetTest, LoadIdxDirectoryIsInvalidArgument) {
  auto [ip, lp] = WritePair(Images(3, 2, 3, kPixels), Labels(kLabels), false);
  ExpectError(LoadIdx(dir_.string(), lp), StatusCode::kInvalidArgument, dir_.string());
}

TEST_F(DatasetTest, LoadIdxBadMagicIsInvalidArgumentNamingTheFile) {
  for (bool gzip : {false, true}) {
    SCOPED_TRACE(gzip ? "gzip" : "plain");
    {
      auto [ip, lp] = WritePair(Idx(0x00000802, {3, 2, 3}, kPixels), Labels(kLabels), gzip);
      ExpectError(LoadIdx(ip, lp), StatusCode::kInvalidArgument, ip);
    }
    {
      auto [ip, lp] = WritePair(Images(3, 2, 3, kPixels), Idx(0x08010000, {3}, kLabels), gzip);
      ExpectError(LoadIdx(ip, lp), StatusCode::kInvalidArgument, lp);
    }
    {
      // Images and labels swapped: the images path now holds a label file.
      auto [ip, lp] = WritePair(Images(3, 2, 3, kPixels), Labels(kLabels), gzip);
      ExpectError(LoadIdx(lp, ip), StatusCode::kInvalidArgument, lp);
    }
  }
}

TEST_F(DatasetTest, LoadIdxCountMismatchIsInvalidArgumentNamingBothFiles) {
  auto [ip, lp] = WritePair(Images(3, 2, 3, kPixels), Labels({1, 2, 3, 4}), false);
  Result<Dataset> r = LoadIdx(ip, lp);
  ExpectError(r, StatusCode::kInvalidArgument, ip);
  EXPECT_NE(r.status().message().find(lp), std::string::npos) << r.status();
}

TEST_F(DatasetTest, LoadIdxZeroSizesAreInvalidArgument) {
  struct Case {
    Bytes images, labels;
    bool images_at_fault;
  };
  const std::vector<Case> cases = {
      {Images(0, 2, 3, {}), Labels({}), true},
      {Images(3, 0, 3, {}), Labels(kLabels), true},
      {Images(3, 2, 0, {}), Labels(kLabels), true},
      {Images(3, 2, 3, kPixels), Idx(kLabelMagic, {0}, {}), false},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    auto [ip, lp] = WritePair(cases[i].images, cases[i].labels, false);
    ExpectError(LoadIdx(ip, lp), StatusCode::kInvalidArgument, cases[i].images_at_fault ? ip : lp);
  }
}

TEST_F(DatasetTest, LoadIdxLabelOutOfRangeIsInvalidArgument) {
  for (uint8_t bad : {uint8_t{10}, uint8_t{255}}) {
    auto [ip, lp] = WritePair(Images(3, 2, 3, kPixels), Labels({0, bad, 1}), true);
    Result<Dataset> r = LoadIdx(ip, lp);
    ExpectError(r, StatusCode::kInvalidArgument, lp);
    EXPECT_NE(r.status().message().find("sample 1"), std::string::npos) << r.status();
  }
}

TEST_F(DatasetTest, LoadIdxTrailingDataIsInvalidArgument) {
  Bytes images = Images(3, 2, 3, kPixels);
  images.push_back(7);
  auto [ip, lp] = WritePair(images, Labels(kLabels), true);
  ExpectError(LoadIdx(ip, lp), StatusCode::kInvalidArgument, ip);
}

TEST_F(DatasetTest, LoadIdxTruncatedPlainFileAtAnyOffsetIsInvalidArgument) {
  const Bytes images = Images(3, 2, 3, kPixels);
  const Bytes labels = Labels(kLabels);
  for (size_t cut = 0; cut < images.size(); ++cut) {
    SCOPED_TRACE("images cut at " + std::to_string(cut));
    auto [ip, lp] =
        WritePair(Bytes(images.begin(), images.begin() + static_cast<long>(cut)), labels, false);
    ExpectError(LoadIdx(ip, lp), StatusCode::kInvalidArgument, ip);
  }
  for (size_t cut = 0; cut < labels.size(); ++cut) {
    SCOPED_TRACE("labels cut at " + std::to_string(cut));
    auto [ip, lp] =
        WritePair(images, Bytes(labels.begin(), labels.begin() + static_cast<long>(cut)), false);
    ExpectError(LoadIdx(ip, lp), StatusCode::kInvalidArgument, lp);
  }
}

TEST_F(DatasetTest, LoadIdxTruncatedGzipAtAnyOffsetIsInvalidArgument) {
  // Cuts both the uncompressed content (a valid gzip of too few bytes) and the compressed
  // stream itself, including inside the gzip header and the CRC trailer.
  const Bytes images = Images(3, 2, 3, kPixels);
  const Bytes labels = Labels(kLabels);
  for (size_t cut = 0; cut < images.size(); ++cut) {
    SCOPED_TRACE("content cut at " + std::to_string(cut));
    auto [ip, lp] =
        WritePair(Bytes(images.begin(), images.begin() + static_cast<long>(cut)), labels, true);
    ExpectError(LoadIdx(ip, lp), StatusCode::kInvalidArgument, ip);
  }
  auto [ip, lp] = WritePair(images, labels, true);
  const Bytes compressed = ReadRaw(ip);
  ASSERT_GT(compressed.size(), 18u);
  for (size_t cut = 0; cut < compressed.size(); ++cut) {
    SCOPED_TRACE("compressed stream cut at " + std::to_string(cut) + " of " +
                 std::to_string(compressed.size()));
    WritePlain(ip, Bytes(compressed.begin(), compressed.begin() + static_cast<long>(cut)));
    ExpectError(LoadIdx(ip, lp), StatusCode::kInvalidArgument, ip);
  }
}

TEST_F(DatasetTest, LoadIdxCorruptGzipIsInvalidArgument) {
  auto [ip, lp] = WritePair(Images(3, 2, 3, kPixels), Labels(kLabels), true);
  Bytes compressed = ReadRaw(ip);
  // 0xff starts a deflate block of the reserved type 3; the trailer's CRC is also wrong.
  std::fill(compressed.begin() + 10, compressed.end(), uint8_t{0xff});
  WritePlain(ip, compressed);
  ExpectError(LoadIdx(ip, lp), StatusCode::kInvalidArgument, ip);
}

TEST_F(DatasetTest, LoadIdxHeaderClaimingHugeSizesFailsWithoutAllocatingIt) {
  for (bool gzip : {false, true}) {
    SCOPED_TRACE(gzip ? "gzip" : "plain");
    // Overflows any sane element count.
    auto [ip, lp] =
        WritePair(Images(0xffffffffu, 0xffffffffu, 0xffffffffu, kPixels), Labels(kLabels), gzip);
    ExpectError(LoadIdx(ip, lp), StatusCode::kInvalidArgument, ip);
    // About 10^12 bytes: plausible to the overflow check, but the file holds 18.
    auto [ip2, lp2] = WritePair(Images(1u << 20, 1000, 1000, kPixels), Labels(kLabels), gzip);
    ExpectError(LoadIdx(ip2, lp2), StatusCode::kInvalidArgument, ip2);
  }
}

TEST_F(DatasetTest, LoadIdxNeverCrashesOnMutatedFiles) {
  // Byte flips and cuts of valid files, plain and gzip: each load either succeeds or
  // fails with InvalidArgument, and never crashes or aborts.
  std::mt19937_64 rng(42);
  const Bytes images = Images(3, 2, 3, kPixels);
  const Bytes labels = Labels(kLabels);
  for (bool gzip : {false, true}) {
    auto [ip, lp] = WritePair(images, labels, gzip);
    const Bytes original = ReadRaw(ip);
    for (int trial = 0; trial < 500; ++trial) {
      Bytes mutated = original;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f)
        mutated[rng() % mutated.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
      if (rng() % 4 == 0) mutated.resize(rng() % mutated.size());
      WritePlain(ip, mutated);
      Result<Dataset> r = LoadIdx(ip, lp);
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
      } else {
        EXPECT_EQ(r->images.size(), static_cast<size_t>(r->count * r->features()));
      }
    }
  }
}

TEST_F(DatasetTest, LoadIdxRejectsNonPositiveStddev) {
  auto [ip, lp] = WritePair(Images(3, 2, 3, kPixels), Labels(kLabels), false);
  for (float stddev : {0.0f, -1.0f, std::nanf("")}) {
    Result<Dataset> r = LoadIdx(ip, lp, 0.5f, stddev);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  }
}

TEST_F(DatasetTest, LoadFashionMnistPrefersGzipThenPlainFile) {
  const Bytes one_pixel = {128};
  WriteGzip(dir_ / "train-images-idx3-ubyte.gz", Images(1, 1, 1, one_pixel));
  WriteGzip(dir_ / "train-labels-idx1-ubyte.gz", Labels({3}));
  WritePlain(dir_ / "train-images-idx3-ubyte", Images(2, 1, 1, {1, 2}));
  WritePlain(dir_ / "train-labels-idx1-ubyte", Labels({5, 6}));
  WritePlain(dir_ / "t10k-images-idx3-ubyte", Images(3, 2, 3, kPixels));
  WriteGzip(dir_ / "t10k-labels-idx1-ubyte.gz", Labels(kLabels));

  Result<Dataset> gz = LoadFashionMnist(dir_.string(), /*train=*/true);
  ASSERT_TRUE(gz.ok()) << gz.status();
  EXPECT_EQ(gz->count, 1);
  EXPECT_EQ(gz->labels, std::vector<int32_t>{3});

  fs::remove(dir_ / "train-images-idx3-ubyte.gz");
  fs::remove(dir_ / "train-labels-idx1-ubyte.gz");
  Result<Dataset> plain = LoadFashionMnist(dir_.string(), /*train=*/true);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->count, 2);
  EXPECT_EQ(plain->labels, (std::vector<int32_t>{5, 6}));

  Result<Dataset> test = LoadFashionMnist(dir_.string(), /*train=*/false);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->count, 3);
}

TEST_F(DatasetTest, LoadFashionMnistMissingFilesAreNotFoundWithPackageHint) {
  Result<Dataset> r = LoadFashionMnist((dir_ / "absent").string(), /*train=*/false);
  ExpectError(r, StatusCode::kNotFound, (dir_ / "absent" / "t10k-images-idx3-ubyte.gz").string());
  EXPECT_NE(r.status().message().find("apt-get install dataset-fashion-mnist"), std::string::npos)
      << r.status();

  WriteGzip(dir_ / "t10k-images-idx3-ubyte.gz", Images(3, 2, 3, kPixels));
  ExpectError(LoadFashionMnist(dir_.string(), false), StatusCode::kNotFound,
              (dir_ / "t10k-labels-idx1-ubyte").string());
}

void ExpectRealFashionMnist(const Dataset& ds, int64_t count) {
  EXPECT_EQ(ds.count, count);
  EXPECT_EQ(ds.rows, 28);
  EXPECT_EQ(ds.cols, 28);
  ASSERT_EQ(ds.images.size(), static_cast<size_t>(count * 28 * 28));
  ASSERT_EQ(ds.labels.size(), static_cast<size_t>(count));
  std::array<int64_t, 10> per_class{};
  for (int32_t label : ds.labels) {
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 10);
    ++per_class[static_cast<size_t>(label)];
  }
  for (int c = 0; c < 10; ++c) {
    // Fashion-MNIST is balanced (6000 / 1000 per class); allow MNIST-like imbalance.
    EXPECT_GT(per_class[c], count / 10 * 8 / 10) << "class " << c;
    EXPECT_LT(per_class[c], count / 10 * 12 / 10) << "class " << c;
  }
}

TEST(DatasetRealTest, FashionMnistTrainAndTestLoadWithExpectedShapes) {
  if (!fs::exists(kFashionDir)) {
    GTEST_SKIP() << kFashionDir
                 << " is absent; install it with `apt-get install dataset-fashion-mnist`";
  }
  const auto start = std::chrono::steady_clock::now();
  Result<Dataset> train = LoadFashionMnist(kFashionDir, /*train=*/true);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(train.ok()) << train.status();
  std::cout << "[ info     ] loaded 60000 Fashion-MNIST training images in " << seconds << " s\n";
  ExpectRealFashionMnist(*train, 60000);

  // The default mean and stddev are the training set's, so it comes out standardized.
  double sum = 0.0;
  double sum_sq = 0.0;
  for (float x : train->images) {
    sum += x;
    sum_sq += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(train->images.size());
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sum_sq / n - (sum / n) * (sum / n)), 1.0, 0.01);

  Result<Dataset> test = LoadFashionMnist("", /*train=*/false);  // "" is the default dir
  ASSERT_TRUE(test.ok()) << test.status();
  ExpectRealFashionMnist(*test, 10000);
}

// ---------------------------------------------------------------------------------------
// BatchLoader

// count samples of 3 features; row i is {i, i + 0.5, -i} and its label is i % 10, so any
// row of a batch tells which sample it came from.
Dataset Synthetic(int64_t count, int64_t features = 3) {
  Dataset ds;
  ds.count = count;
  ds.rows = 1;
  ds.cols = features;
  ds.images.resize(static_cast<size_t>(count * features));
  ds.labels.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    float* row = ds.images.data() + i * features;
    for (int64_t f = 0; f < features; ++f) row[f] = static_cast<float>(i);
    if (features >= 3) {
      row[1] = static_cast<float>(i) + 0.5f;
      row[2] = -static_cast<float>(i);
    }
    ds.labels[static_cast<size_t>(i)] = static_cast<int32_t>(i % 10);
  }
  return ds;
}

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

struct Epoch {
  std::vector<int64_t> order;  // sample numbers in the order served
  std::vector<int64_t> sizes;  // batch sizes
};

// Drains a loader, checking each batch is internally consistent with `data`.
Epoch Drain(BatchLoader& loader, const Dataset& data, int64_t epoch) {
  Epoch out;
  int64_t expected_index = 0;
  while (std::optional<Batch> b = loader.Next()) {
    EXPECT_EQ(b->epoch, epoch);
    EXPECT_EQ(b->index, expected_index++);
    EXPECT_EQ(b->images.size(), static_cast<size_t>(b->size * data.features()));
    EXPECT_EQ(b->labels.size(), static_cast<size_t>(b->size));
    for (int64_t r = 0; r < b->size; ++r) {
      const float* row = b->images.data() + r * data.features();
      const auto sample = static_cast<int64_t>(row[0]);
      EXPECT_EQ(row[1], static_cast<float>(sample) + 0.5f);
      EXPECT_EQ(row[2], -static_cast<float>(sample));
      EXPECT_EQ(b->labels[static_cast<size_t>(r)], sample % 10);
      out.order.push_back(sample);
    }
    out.sizes.push_back(b->size);
  }
  EXPECT_EQ(static_cast<int64_t>(out.sizes.size()), loader.num_batches());
  return out;
}

Epoch RunEpoch(const Dataset& data, std::vector<int64_t> indices, const LoaderOptions& options,
               int64_t epoch) {
  BatchLoader loader(data, std::move(indices), options, epoch);
  return Drain(loader, data, epoch);
}

TEST(DatasetBatchLoaderTest, EveryIndexAppearsExactlyOncePerEpoch) {
  const Dataset data = Synthetic(103);
  LoaderOptions options;
  options.batch_size = 10;
  options.prefetch = 2;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    Epoch e = RunEpoch(data, Iota(103), options, epoch);
    std::sort(e.order.begin(), e.order.end());
    EXPECT_EQ(e.order, Iota(103)) << "epoch " << epoch;
  }
}

TEST(DatasetBatchLoaderTest, LastBatchIsPartialUnlessDropLast) {
  const Dataset data = Synthetic(103);
  LoaderOptions options;
  options.batch_size = 10;
  Epoch keep = RunEpoch(data, Iota(103), options, 0);
  std::vector<int64_t> expected(10, 10);
  expected.push_back(3);
  EXPECT_EQ(keep.sizes, expected);

  options.drop_last = true;
  BatchLoader loader(data, Iota(103), options, 0);
  EXPECT_EQ(loader.num_batches(), 10);
  Epoch drop = Drain(loader, data, 0);
  EXPECT_EQ(drop.sizes, std::vector<int64_t>(10, 10));
  EXPECT_EQ(std::set<int64_t>(drop.order.begin(), drop.order.end()).size(), 100u);

  options.drop_last = false;
  EXPECT_EQ(RunEpoch(data, Iota(100), options, 0).sizes, std::vector<int64_t>(10, 10));
}

TEST(DatasetBatchLoaderTest, EmptyIndicesGiveZeroBatches) {
  const Dataset data = Synthetic(5);
  LoaderOptions options;
  BatchLoader empty(data, {}, options, 0);
  EXPECT_EQ(empty.num_batches(), 0);
  EXPECT_FALSE(empty.Next().has_value());

  options.batch_size = 10;
  options.drop_last = true;
  BatchLoader too_few(data, Iota(5), options, 0);
  EXPECT_EQ(too_few.num_batches(), 0);
  EXPECT_FALSE(too_few.Next().has_value());
}

TEST(DatasetBatchLoaderTest, NextKeepsReturningNulloptAfterTheEpoch) {
  const Dataset data = Synthetic(7);
  LoaderOptions options;
  options.batch_size = 3;
  BatchLoader loader(data, Iota(7), options, 0);
  Drain(loader, data, 0);
  EXPECT_FALSE(loader.Next().has_value());
  EXPECT_FALSE(loader.Next().has_value());
}

TEST(DatasetBatchLoaderTest, SameSeedAndEpochGiveSameOrder) {
  const Dataset data = Synthetic(500);
  LoaderOptions options;
  options.batch_size = 32;
  options.seed = 1234;
  const std::vector<int64_t> first = RunEpoch(data, Iota(500), options, 7).order;
  EXPECT_EQ(RunEpoch(data, Iota(500), options, 7).order, first);
  // Neither the prefetch depth nor the batch size changes the sample order.
  options.prefetch = 1;
  options.batch_size = 7;
  EXPECT_EQ(RunEpoch(data, Iota(500), options, 7).order, first);
}

TEST(DatasetBatchLoaderTest, DifferentEpochsOrSeedsGiveDifferentOrders) {
  const Dataset data = Synthetic(500);
  LoaderOptions options;
  options.batch_size = 32;
  const std::vector<int64_t> e0 = RunEpoch(data, Iota(500), options, 0).order;
  const std::vector<int64_t> e1 = RunEpoch(data, Iota(500), options, 1).order;
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, Iota(500));  // actually shuffled
  options.seed = 2;
  EXPECT_NE(RunEpoch(data, Iota(500), options, 0).order, e0);
}

TEST(DatasetBatchLoaderTest, ShuffleOrderIsPinnedAcrossPlatforms) {
  // The order is computed with mt19937_64 and our own Fisher-Yates, both fully specified,
  // so it must never change: checkpoints and multi-worker runs rely on it.
  const Dataset data = Synthetic(10);
  LoaderOptions options;
  options.batch_size = 4;
  options.seed = 1;
  EXPECT_EQ(RunEpoch(data, Iota(10), options, 0).order,
            (std::vector<int64_t>{4, 6, 8, 9, 3, 5, 7, 2, 0, 1}));
}

TEST(DatasetBatchLoaderTest, NoShuffleServesIndicesAsGiven) {
  const Dataset data = Synthetic(50);
  LoaderOptions options;
  options.batch_size = 4;
  options.shuffle = false;
  const std::vector<int64_t> subset = {49, 3, 3, 17, 0, 22, 8};  // any order, repeats allowed
  Epoch e = RunEpoch(data, subset, options, 5);
  EXPECT_EQ(e.order, subset);
  EXPECT_EQ(e.sizes, (std::vector<int64_t>{4, 3}));
}

TEST(DatasetBatchLoaderTest, ShufflesOnlyTheGivenSubset) {
  const Dataset data = Synthetic(100);
  std::vector<int64_t> evens;
  for (int64_t i = 0; i < 100; i += 2) evens.push_back(i);
  LoaderOptions options;
  options.batch_size = 8;
  Epoch e = RunEpoch(data, evens, options, 3);
  std::sort(e.order.begin(), e.order.end());
  EXPECT_EQ(e.order, evens);
}

TEST(DatasetBatchLoaderTest, NonPositivePrefetchStillServesEveryBatch) {
  const Dataset data = Synthetic(20);
  LoaderOptions options;
  options.batch_size = 3;
  options.prefetch = 0;
  Epoch e = RunEpoch(data, Iota(20), options, 0);
  EXPECT_EQ(e.order.size(), 20u);
}

TEST(DatasetBatchLoaderTest, DestroyingMidEpochReturnsPromptly) {
  const Dataset data = Synthetic(8192, 784);
  LoaderOptions options;
  options.batch_size = 16;
  options.prefetch = 2;
  for (int taken : {0, 1, 5}) {
    const auto start = std::chrono::steady_clock::now();
    {
      BatchLoader loader(data, Iota(8192), options, 0);
      for (int i = 0; i < taken; ++i) ASSERT_TRUE(loader.Next().has_value());
    }
    const auto elapsed = std::chrono::steady_clock::now() - start;
    // A producer that ignored the stop request would block forever on the full queue;
    // the bound is loose because this machine may be busy.
    EXPECT_LT(elapsed, std::chrono::seconds(1)) << "after taking " << taken << " batches";
  }
}

TEST(DatasetBatchLoaderTest, CallerBugsAbortWithFileAndLine) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Dataset data = Synthetic(10);
  LoaderOptions options;
  EXPECT_DEATH(BatchLoader(data, {0, 10}, options, 0), "invariant violated");
  EXPECT_DEATH(BatchLoader(data, {-1}, options, 0), "invariant violated");
  options.batch_size = 0;
  EXPECT_DEATH(BatchLoader(data, {0}, options, 0), "invariant violated");
}

}  // namespace
}  // namespace leash::worker

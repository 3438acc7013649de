// Tests of the MovieLens-100k loader on a small fixture (worker/testdata/ml-tiny) and on
// broken copies of it written to a temporary directory.
#include "movielens.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace leash::worker {
namespace {

namespace fs = std::filesystem;

const std::string kTiny = LEASH_ML_TINY;

// A copy of the fixture in a fresh directory, `file` replaced by `text` when given.
std::string BrokenCopy(const std::string& name, const std::string& file = "",
                       const std::string& text = "") {
  fs::path dir = fs::path(testing::TempDir()) / ("ml-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"ml-100k.inter", "ml-100k.user", "ml-100k.item"})
    fs::copy_file(fs::path(kTiny) / f, dir / f);
  if (!file.empty()) {
    std::ofstream out(dir / file, std::ios::trunc);
    out << text;
  }
  return dir.string();
}

TEST(MovieLensTest, SplitsEachUsersLatestFifthIntoTheTestSetAndLabelsRatingsOfFourAndUp) {
  auto data = LoadMovieLens(kTiny);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ(data->users, 2);
  EXPECT_EQ(data->items, 2);
  // User 1 rated 5 times (timestamps 99 down to 95): its latest (rating 1 at 99) is the
  // test example; user 2 rated twice, fewer than 5: none in the test set.
  ASSERT_EQ(data->train.count, 6);
  ASSERT_EQ(data->test.count, 1);
  EXPECT_EQ(data->train.labels, (std::vector<int32_t>{0, 0, 1, 1, 1, 0}));
  EXPECT_EQ(data->test.labels, (std::vector<int32_t>{0}));
  EXPECT_EQ(data->train.key_slots, kMovieLensKeySlots);
  EXPECT_EQ(data->train.keys.size(), 6u * kMovieLensKeySlots);
  EXPECT_EQ(data->train.features(), 0);
}

TEST(MovieLensTest, KeysHashEveryFieldValueWithItsFieldAndBagTheGenres) {
  auto data = LoadMovieLens(kTiny);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  const uint64_t* first = data->train.keys.data();  // user 1, item 10
  std::vector<uint64_t> want = {FeatureKey(kUserField, "1"),
                                FeatureKey(kItemField, "10"),
                                FeatureKey(kAgeField, "18-24"),
                                FeatureKey(kGenderField, "M"),
                                FeatureKey(kOccupationField, "technician"),
                                FeatureKey(kZipField, "85"),
                                FeatureKey(kYearField, "1990s"),
                                FeatureKey(kGenreField, "Animation"),
                                FeatureKey(kGenreField, "Children's"),
                                FeatureKey(kGenreField, "Comedy"),
                                0,
                                0,
                                0};
  EXPECT_EQ(std::vector<uint64_t>(first, first + kMovieLensKeySlots), want);
  const uint64_t* fifth = first + 4 * kMovieLensKeySlots;  // user 2, item 20 ("unkonwn" year)
  EXPECT_EQ(fifth[kAgeField], FeatureKey(kAgeField, "50-55"));
  EXPECT_EQ(fifth[kYearField], FeatureKey(kYearField, "unknown"));
  EXPECT_EQ(fifth[kGenreField], FeatureKey(kGenreField, "Action"));
  EXPECT_EQ(fifth[kGenreField + 1], 0u);
  // The same token in another field is another key.
  EXPECT_NE(FeatureKey(kUserField, "10"), FeatureKey(kItemField, "10"));
  EXPECT_EQ(MovieLensSlotFields().size(), static_cast<size_t>(kMovieLensKeySlots));
}

TEST(MovieLensTest, MissingFileIsNotFoundNamingThePathAndTheInstallScript) {
  std::string dir = BrokenCopy("missing");
  fs::remove(fs::path(dir) / "ml-100k.item");
  auto data = LoadMovieLens(dir);
  ASSERT_EQ(data.status().code(), StatusCode::kNotFound);
  EXPECT_NE(data.status().message().find("ml-100k.item"), std::string::npos);
  EXPECT_NE(data.status().message().find("fetch-movielens.sh"), std::string::npos);
}

TEST(MovieLensTest, MalformedLinesAreRejectedWithFileAndLineNumber) {
  const std::string header = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n";
  struct Case {
    std::string name, text, want;
  };
  std::vector<Case> cases = {
      {"short", header + "1\t10\t4\t5\n1\t10\n", "ml-100k.inter:3: expected at least"},
      {"rating", header + "1\t10\tfour\t5\n", "ml-100k.inter:2: rating 'four' is not a number"},
      {"user", header + "1\t10\t4\t5\n7\t10\t4\t5\n",
       "ml-100k.inter:3: rating of unknown user '7'"},
      {"header", "user_id:token\titem_id:token\trating:float\n1\t10\t4\n",
       "ml-100k.inter:1: the header has no column 'timestamp:float'"},
  };
  for (const Case& c : cases) {
    auto data = LoadMovieLens(BrokenCopy(c.name, "ml-100k.inter", c.text));
    ASSERT_EQ(data.status().code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(data.status().message().find(c.want), std::string::npos)
        << c.name << ": " << data.status().message();
  }
}

TEST(MovieLensTest, InstalledDatasetHasTheDocumentedSplit) {
  auto data = LoadMovieLens("");
  if (data.status().code() == StatusCode::kNotFound)
    GTEST_SKIP() << "MovieLens-100k is not installed: " << data.status().message();
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ(data->users, 943);
  EXPECT_EQ(data->items, 1682);
  EXPECT_EQ(data->train.count + data->test.count, 100000);
  EXPECT_GT(data->test.count, 19000);
  EXPECT_LT(data->test.count, 20000);
  int64_t positives = 0;
  for (int32_t l : data->train.labels) positives += l;
  for (int32_t l : data->test.labels) positives += l;
  EXPECT_EQ(positives, 34174 + 21201);  // ratings 4 and 5
}

}  // namespace
}  // namespace leash::worker

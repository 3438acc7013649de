// MovieLens-100k as click-through data: the RecBole TSV files (ml-100k.inter, .user, .item,
// installed by scripts/fetch-movielens.sh) read into train and test Datasets of 64-bit
// feature keys (Dataset::keys) with label 1 for a rating >= 4. The split and the fields
// are documented in docs/models.md. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "leash/common/status.h"
#include "leash/worker/dataset.h"

namespace leash::worker {

// Where scripts/fetch-movielens.sh installs the files.
inline constexpr const char* kMovieLensDefaultDir = "/usr/local/share/leash/datasets/ml-100k";

// The categorical fields, in key-slot order: one slot each for user, item, age bucket,
// gender, occupation, zip prefix and release decade, then kMovieLensGenreSlots slots of
// the genre field (a bag: a movie has 1 to 6 genres; unused slots are 0).
enum MovieLensField : int {
  kUserField = 0,
  kItemField,
  kAgeField,
  kGenderField,
  kOccupationField,
  kZipField,
  kYearField,
  kGenreField,
  kMovieLensFields
};
inline constexpr int kMovieLensGenreSlots = 6;
inline constexpr int kMovieLensKeySlots = kGenreField + kMovieLensGenreSlots;

// The field of each key slot (what a model averages into one embedding per field).
std::vector<int> MovieLensSlotFields();

// The key of categorical value `token` of field `field`: a 64-bit hash of both, never 0.
uint64_t FeatureKey(int field, std::string_view token);

struct MovieLensData {
  Dataset train;  // per user, the earlier 80% of the ratings (by timestamp)
  Dataset test;   // per user, the latest 20% (count / 5, rounded down)
  int64_t users = 0;
  int64_t items = 0;
};

// Reads ml-100k.{inter,user,item} from `dir` (empty: kMovieLensDefaultDir). NotFound naming
// the missing file and the install script; InvalidArgument naming file and line for a
// missing header column, a line with too few columns, a rating or timestamp that is not a
// number, or a rating of an unknown user or item; IOError when a file cannot be read.
Result<MovieLensData> LoadMovieLens(const std::string& dir);

}  // namespace leash::worker

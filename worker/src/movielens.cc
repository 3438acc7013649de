// MovieLens-100k loader: RecBole's typed TSV files into click-through Datasets of feature
// keys. Pure functions; thread-safe.
#include "movielens.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <unordered_map>

namespace leash::worker {
namespace {

namespace fs = std::filesystem;

constexpr const char* kInstallHint =
    "install MovieLens-100k with scripts/fetch-movielens.sh (scripts/install-deps.sh runs it) "
    "or point leash-worker's --data at the directory";

std::vector<std::string_view> SplitTabs(std::string_view line) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t tab = line.find('\t', start);
    out.push_back(line.substr(start, tab == std::string_view::npos ? tab : tab - start));
    if (tab == std::string_view::npos) break;
    start = tab + 1;
  }
  return out;
}

// One TSV file: its rows as fields, the header's columns located by name.
struct Table {
  std::string path;
  std::vector<std::string> lines;  // without the header
  std::vector<int> columns;        // index of each wanted column in a row
};

Result<Table> ReadTable(const fs::path& path, const std::vector<std::string>& wanted) {
  Table t;
  t.path = path.string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return NotFound(t.path + ": no such file; " + kInstallHint);
  std::ifstream in(path);
  if (!in) return IOError("cannot open " + t.path);
  std::string header;
  if (!std::getline(in, header)) return InvalidArgument(t.path + ": empty file, expected a header");
  if (!header.empty() && header.back() == '\r') header.pop_back();
  std::vector<std::string_view> names = SplitTabs(header);
  for (const std::string& w : wanted) {
    auto it = std::find(names.begin(), names.end(), w);
    if (it == names.end()) {
      return InvalidArgument(t.path + ":1: the header has no column '" + w + "' (a RecBole " +
                             "typed header such as 'user_id:token' is expected)");
    }
    t.columns.push_back(static_cast<int>(it - names.begin()));
  }
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    t.lines.push_back(std::move(line));
  }
  if (in.bad()) return IOError("error reading " + t.path);
  return t;
}

// The wanted columns of row `i` (0-based after the header; file line i + 2).
Status Columns(const Table& t, size_t i, std::vector<std::string_view>* out) {
  std::vector<std::string_view> all = SplitTabs(t.lines[i]);
  out->clear();
  for (int c : t.columns) {
    if (static_cast<size_t>(c) >= all.size()) {
      return InvalidArgument(t.path + ":" + std::to_string(i + 2) + ": expected at least " +
                             std::to_string(c + 1) + " tab-separated columns, got " +
                             std::to_string(all.size()));
    }
    out->push_back(all[static_cast<size_t>(c)]);
  }
  return Status::Ok();
}

template <typename T>
Result<T> Number(const Table& t, size_t i, std::string_view what, std::string_view s) {
  T v{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) {
    return InvalidArgument(t.path + ":" + std::to_string(i + 2) + ": " + std::string(what) + " '" +
                           std::string(s) + "' is not a number");
  }
  return v;
}

// ML-1M's age groups.
std::string AgeBucket(int age) {
  if (age < 18) return "<18";
  if (age < 25) return "18-24";
  if (age < 35) return "25-34";
  if (age < 45) return "35-44";
  if (age < 50) return "45-49";
  if (age < 56) return "50-55";
  return "56+";
}

std::string Decade(std::string_view year) {
  int y = 0;
  auto [end, ec] = std::from_chars(year.data(), year.data() + year.size(), y);
  if (ec != std::errc() || end != year.data() + year.size() || y < 1000) return "unknown";
  return std::to_string(y / 10 * 10) + "s";
}

}  // namespace

std::vector<int> MovieLensSlotFields() {
  std::vector<int> f;
  for (int i = 0; i < kGenreField; ++i) f.push_back(i);
  for (int i = 0; i < kMovieLensGenreSlots; ++i) f.push_back(kGenreField);
  return f;
}

uint64_t FeatureKey(int field, std::string_view token) {
  // FNV-1a over the field and the token, then SplitMix64's finalizer to spread the bits.
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](uint8_t b) { h = (h ^ b) * 1099511628211ULL; };
  for (int s = 0; s < 32; s += 8) mix(static_cast<uint8_t>(static_cast<uint32_t>(field) >> s));
  for (char c : token) mix(static_cast<uint8_t>(c));
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return h == 0 ? 1 : h;
}

Result<MovieLensData> LoadMovieLens(const std::string& dir_in) {
  const fs::path dir = dir_in.empty() ? fs::path(kMovieLensDefaultDir) : fs::path(dir_in);
  LEASH_ASSIGN_OR_RETURN(
      Table users, ReadTable(dir / "ml-100k.user", {"user_id:token", "age:token", "gender:token",
                                                    "occupation:token", "zip_code:token"}));
  LEASH_ASSIGN_OR_RETURN(
      Table items,
      ReadTable(dir / "ml-100k.item", {"item_id:token", "release_year:token", "class:token_seq"}));
  LEASH_ASSIGN_OR_RETURN(Table inter,
                         ReadTable(dir / "ml-100k.inter", {"user_id:token", "item_id:token",
                                                           "rating:float", "timestamp:float"}));
  MovieLensData out;
  std::vector<std::string_view> c;
  // The user's and the item's keys, by token.
  std::unordered_map<std::string, std::vector<uint64_t>> user_keys, item_keys;
  for (size_t i = 0; i < users.lines.size(); ++i) {
    if (users.lines[i].empty()) continue;
    LEASH_RETURN_IF_ERROR(Columns(users, i, &c));
    LEASH_ASSIGN_OR_RETURN(int age, Number<int>(users, i, "age", c[1]));
    std::string zip(c[4].substr(0, 2));
    user_keys[std::string(c[0])] = {FeatureKey(kUserField, c[0]),
                                    FeatureKey(kAgeField, AgeBucket(age)),
                                    FeatureKey(kGenderField, c[2]),
                                    FeatureKey(kOccupationField, c[3]), FeatureKey(kZipField, zip)};
  }
  for (size_t i = 0; i < items.lines.size(); ++i) {
    if (items.lines[i].empty()) continue;
    LEASH_RETURN_IF_ERROR(Columns(items, i, &c));
    std::vector<uint64_t> k = {FeatureKey(kItemField, c[0]), FeatureKey(kYearField, Decade(c[1]))};
    std::string_view genres = c[2];
    int n = 0;
    size_t start = 0;
    while (start <= genres.size()) {
      size_t sp = genres.find(' ', start);
      std::string_view g = genres.substr(start, sp == std::string_view::npos ? sp : sp - start);
      if (!g.empty() && n < kMovieLensGenreSlots) {
        k.push_back(FeatureKey(kGenreField, g));
        ++n;
      }
      if (sp == std::string_view::npos) break;
      start = sp + 1;
    }
    if (n == 0) k.push_back(FeatureKey(kGenreField, "unknown"));
    k.resize(2 + kMovieLensGenreSlots, 0);
    item_keys[std::string(c[0])] = std::move(k);
  }
  out.users = static_cast<int64_t>(user_keys.size());
  out.items = static_cast<int64_t>(item_keys.size());

  struct Rating {
    const std::vector<uint64_t>* user;
    const std::vector<uint64_t>* item;
    double timestamp;
    int32_t label;
    size_t line;
  };
  std::unordered_map<std::string, std::vector<Rating>> by_user;
  std::vector<std::string> user_order;  // users by first rating, for a deterministic split
  for (size_t i = 0; i < inter.lines.size(); ++i) {
    if (inter.lines[i].empty()) continue;
    LEASH_RETURN_IF_ERROR(Columns(inter, i, &c));
    auto u = user_keys.find(std::string(c[0]));
    auto it = item_keys.find(std::string(c[1]));
    if (u == user_keys.end() || it == item_keys.end()) {
      return InvalidArgument(
          inter.path + ":" + std::to_string(i + 2) + ": rating of unknown " +
          (u == user_keys.end() ? "user '" + std::string(c[0]) : "item '" + std::string(c[1])) +
          "' (not in ml-100k.user / ml-100k.item)");
    }
    LEASH_ASSIGN_OR_RETURN(double rating, Number<double>(inter, i, "rating", c[2]));
    LEASH_ASSIGN_OR_RETURN(double ts, Number<double>(inter, i, "timestamp", c[3]));
    auto& list = by_user[std::string(c[0])];
    if (list.empty()) user_order.emplace_back(c[0]);
    list.push_back({&u->second, &it->second, ts, rating >= 4 ? 1 : 0, i});
  }
  if (user_order.empty()) return InvalidArgument(inter.path + ": no ratings");

  // Per user, the latest 20% (by timestamp; ties in file order) are the test set. Both
  // sets keep the ratings in file order.
  std::vector<uint8_t> is_test(inter.lines.size(), 0);
  for (const std::string& user : user_order) {
    std::vector<Rating>& list = by_user[user];
    std::stable_sort(list.begin(), list.end(),
                     [](const Rating& a, const Rating& b) { return a.timestamp < b.timestamp; });
    const size_t n_test = list.size() / 5;
    for (size_t j = list.size() - n_test; j < list.size(); ++j) is_test[list[j].line] = 1;
  }
  std::vector<const Rating*> by_line(inter.lines.size(), nullptr);
  for (const auto& [user, list] : by_user)
    for (const Rating& r : list) by_line[r.line] = &r;
  for (Dataset* d : {&out.train, &out.test}) {
    d->num_classes = 2;
    d->key_slots = kMovieLensKeySlots;
  }
  for (size_t line = 0; line < by_line.size(); ++line) {
    const Rating* r = by_line[line];
    if (r == nullptr) continue;
    Dataset& d = is_test[line] ? out.test : out.train;
    // Slots: user, item, age, gender, occupation, zip, year, genres.
    const std::vector<uint64_t>& u = *r->user;
    const std::vector<uint64_t>& it = *r->item;
    d.keys.insert(d.keys.end(), {u[0], it[0], u[1], u[2], u[3], u[4], it[1]});
    d.keys.insert(d.keys.end(), it.begin() + 2, it.end());
    d.labels.push_back(r->label);
    ++d.count;
  }
  return out;
}

}  // namespace leash::worker

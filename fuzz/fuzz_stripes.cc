// libFuzzer target for striping's reassembly (common/src/stripes.cc), what a shard and a
// client do with parts that arrive from a peer. Single-threaded, as libFuzzer calls it.
//
// Input format: byte 0 chooses the stripe count (2..9) and byte 1 a mode; the rest is
// split at the 4-byte marker "LFRM" into chunks.
// - Forged parts: each chunk is a part as it arrives: its first byte the connection it
//   came on (0: the main one), the rest frames separated by "LFRP" (frame 0 the header).
//   The assembler must refuse what is malformed without crashing, never hold more than its
//   limit, and everything it delivers must have frames as its header declared, 8-byte
//   aligned.
// - Round trip: the chunks are a message's frames; it is split and its parts fed in an
//   order the input chooses, with a small message before and after; the three must come
//   out whole and in order. With a shard's assembler (checking: a mode bit), a frame of
//   the message comes out finite_f32() exactly when it is whole float32s, none NaN or Inf.
// A mode bit also picks a shard's assembler (checking finiteness as it copies) or a
// client's for the forged parts.
// Each frame is copied into its own allocation, as ZeroMQ delivers it, so a read past a
// frame's end is caught by AddressSanitizer. `fuzz_stripes --write-seeds=DIR` writes seeds.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "leash/common/finite.h"
#include "stripes.h"

namespace {

using leash::Frame;
using leash::Message;
namespace stripes = leash::stripes;

constexpr std::string_view kChunkMarker = "LFRM";
constexpr std::string_view kFrameMarker = "LFRP";
constexpr size_t kLimit = 1 << 20;

std::vector<std::string_view> SplitAt(std::string_view s, std::string_view marker) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (true) {
    size_t next = s.find(marker, at);
    if (next == std::string_view::npos) {
      out.push_back(s.substr(at));
      return out;
    }
    out.push_back(s.substr(at, next - at));
    at = next + marker.size();
  }
}

Frame Own(std::string_view bytes) { return Frame::Copy(bytes.data(), bytes.size()); }

bool Same(const Message& a, const Message& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return false;
    if (a[i].size() > 0 && std::memcmp(a[i].data(), b[i].data(), a[i].size()) != 0) return false;
  }
  return true;
}

void Forged(bool check_finite, const std::vector<std::string_view>& chunks) {
  stripes::Assembler a(kLimit, 50, check_finite);
  int64_t now = 0;
  for (std::string_view c : chunks) {
    if (c.empty()) continue;
    const auto index = static_cast<uint32_t>(static_cast<uint8_t>(c[0]) % 4);
    Message m;
    for (std::string_view f : SplitAt(c.substr(1), kFrameMarker)) m.push_back(Own(f));
    (void)(index == 0 ? a.OnMain(std::move(m), now) : a.OnPart(std::move(m), index, now));
    CHECK(a.held_bytes() <= kLimit);
    now += 7;
    while (auto out = a.Pop(now)) {
      for (const Frame& f : *out)
        CHECK(reinterpret_cast<uintptr_t>(f.data()) % 8 == 0 || f.empty());
    }
  }
  // Past the timeout everything incomplete goes, and whatever was complete comes out.
  for (int64_t later : {now + 1000, now + 2000}) {
    while (a.Pop(later)) {
    }
  }
  CHECK(a.idle());
  CHECK(a.held_bytes() == 0);
}

void RoundTrip(uint32_t count, uint8_t mode, const std::vector<std::string_view>& chunks) {
  if (chunks.size() > stripes::kMaxFrames) return;
  Message m;
  for (std::string_view f : chunks) m.push_back(Own(f));
  std::vector<Message> parts = stripes::Split(m, 5, count);
  CHECK(parts.size() == count);
  const bool check_finite = (mode & 1) != 0;
  stripes::Assembler a(kLimit * 64, 1000, check_finite);
  CHECK(a.OnMain({Own("before")}, 0).ok());
  // Part 0 goes at the position `mode` picks among the others (as the connections race).
  const uint32_t zero_at = (mode >> 1) % count;
  uint32_t side = 1;
  for (uint32_t k = 0; k < count; ++k) {
    if (k == zero_at) {
      CHECK(a.OnMain(parts[0], 0).ok());
      CHECK(a.OnMain({Own("after")}, 0).ok());
    } else {
      CHECK(a.OnPart(parts[side], side, 0).ok());
      ++side;
    }
  }
  auto first = a.Pop(0);
  CHECK(first && (*first)[0].view() == "before");
  auto whole = a.Pop(0);
  CHECK(whole && Same(*whole, m));
  for (const Frame& f : *whole) {
    const bool floats =
        f.size() > 0 && f.size() % sizeof(float) == 0 &&
        leash::AllFinite(reinterpret_cast<const float*>(f.data()), f.size() / sizeof(float));
    CHECK(f.finite_f32() == (check_finite && floats));
  }
  auto last = a.Pop(0);
  CHECK(last && (*last)[0].view() == "after");
  CHECK(a.idle());
}

void WriteSeeds(const std::string& dir) {
  Message m = {Own("header"), Own(std::string(300, 'x')), Own("tail")};
  std::vector<Message> parts = stripes::Split(m, 1, 3);
  std::string forged(1, '\3');
  forged.push_back('\0');
  for (size_t k = 0; k < parts.size(); ++k) {
    if (k > 0) forged += std::string(kChunkMarker);
    forged.push_back(static_cast<char>(k));
    for (size_t i = 0; i < parts[k].size(); ++i) {
      if (i > 0) forged += std::string(kFrameMarker);
      forged += std::string(parts[k][i].view());
    }
  }
  std::string round = std::string("\1\1") + "header" + std::string(kChunkMarker) +
                      std::string(100, 'y') + std::string(kChunkMarker) + "tail";
  // A shard's assembler (mode bit) on float frames: finite ones, and one with a NaN.
  std::string floats = std::string("\2\3") + "hdr" + std::string(kChunkMarker);
  const float one = 1.f, nan = std::numeric_limits<float>::quiet_NaN();
  for (int i = 0; i < 96; ++i) floats.append(reinterpret_cast<const char*>(&one), sizeof one);
  floats += std::string(kChunkMarker);
  for (int i = 0; i < 40; ++i)
    floats.append(reinterpret_cast<const char*>(i == 29 ? &nan : &one), sizeof one);
  std::ofstream(dir + "/forged") << forged;
  std::ofstream(dir + "/roundtrip") << round;
  std::ofstream(dir + "/roundtrip_floats") << floats;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint32_t count = 2 + data[0] % 8;
  const uint8_t mode = data[1];
  std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  std::vector<std::string_view> chunks = SplitAt(rest, kChunkMarker);
  if (mode % 2 == 0) {
    Forged((mode & 2) != 0, chunks);
  } else {
    RoundTrip(count, static_cast<uint8_t>(mode / 2), chunks);
  }
  return 0;
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  leash::fuzz::WriteSeedsIfAsked(*argc, *argv, WriteSeeds);
  return 0;
}

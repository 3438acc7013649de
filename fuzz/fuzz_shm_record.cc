// libFuzzer target for what a shard and a client read from a same-host peer's shared-memory
// queue (common/src/shm_link.cc): a record of a message's frames, and the trailer that may
// end it. Single-threaded, as libFuzzer calls it.
//
// Input: byte 0 chooses a mode, the rest is the record.
// - Forged (mode even): the bytes as a record. Decoding must refuse what is malformed
//   without reading past the end; what it accepts must re-encode to the same bytes; a pause
//   is never a message; a trailer in the last frame decodes with descriptors of the ring
//   asked for, and encoded again says the same.
// - Round trip (mode odd): the bytes split at "LFRP" into frames, encoded and decoded back
//   unchanged.
// The input is copied into its own allocation so that AddressSanitizer catches any read
// past its end. `fuzz_shm_record --write-seeds=DIR` writes seeds.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "shm_link.h"

namespace {

using leash::Frame;
using leash::Message;
namespace shm = leash::shm;

void Forged(const uint8_t* p, size_t n) {
  std::vector<uint8_t> copy(p, p + n);
  auto m = shm::DecodeRecord(copy.data(), copy.size());
  if (shm::IsPause(copy.data(), copy.size())) CHECK(!m.ok());
  if (!m.ok()) return;
  CHECK(!m->empty());
  CHECK(shm::EncodeRecord(*m) == std::string(reinterpret_cast<const char*>(p), n));
  const Frame& last = m->back();
  if (auto t = shm::DecodeTrailer(last.data(), last.size(), 1)) {
    for (const auto& [index, d] : t->frames) CHECK(d.ring == 1);
    // What was read is what it says (its reserved word aside): encoded again, the same.
    const std::string again = shm::EncodeTrailer(t->token, t->name, t->frames);
    CHECK(again.size() == last.size());
    auto u = shm::DecodeTrailer(again.data(), again.size(), 1);
    CHECK(u && u->token == t->token && u->name == t->name && u->frames.size() == t->frames.size());
    for (size_t i = 0; i < t->frames.size(); ++i) {
      CHECK(u->frames[i].first == t->frames[i].first);
      CHECK(u->frames[i].second.offset == t->frames[i].second.offset);
      CHECK(u->frames[i].second.size == t->frames[i].second.size);
      CHECK(u->frames[i].second.generation == t->frames[i].second.generation);
    }
  }
}

void RoundTrip(std::string_view s) {
  Message m;
  size_t at = 0;
  while (true) {
    size_t next = s.find("LFRP", at);
    std::string_view part = s.substr(at, next == std::string_view::npos ? s.npos : next - at);
    m.push_back(part.empty() ? Frame() : Frame::Copy(part));
    if (next == std::string_view::npos) break;
    at = next + 4;
  }
  const std::string r = shm::EncodeRecord(m);
  auto back = shm::DecodeRecord(reinterpret_cast<const uint8_t*>(r.data()), r.size());
  CHECK(back.ok());
  CHECK(back->size() == m.size());
  for (size_t i = 0; i < m.size(); ++i) CHECK((*back)[i].view() == m[i].view());
}

void WriteSeeds(const std::string& dir) {
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
  };
  Message m = {Frame::Copy("header"), Frame(), Frame::Copy(std::string(600, 'x'))};
  write("record", std::string(1, '\0') + shm::EncodeRecord(m));
  shm::Descriptor d{0, 7, 16384, 100000};
  Message t = {Frame::Copy("push"), Frame(),
               Frame::Copy(shm::EncodeTrailer(42, "/leash-shm-1-0123456789abcdef", {{1, d}}))};
  write("trailer", std::string(1, '\2') + shm::EncodeRecord(t));
  write("pause", std::string(1, '\4') + shm::EncodeRecord({}));
  write("roundtrip", "\1headerLFRPLFRPpayload");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  if (data[0] % 2 == 0) {
    Forged(data + 1, size - 1);
  } else {
    RoundTrip(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
  }
  return 0;
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  leash::fuzz::WriteSeedsIfAsked(*argc, *argv, WriteSeeds);
  return 0;
}

// libFuzzer target for the wire decoder (common/src/wire.cc and the readers the shard and
// the client apply to a verified envelope). Single-threaded, as libFuzzer calls it.
//
// Input format: the bytes are one multipart message whose frames are separated by the
// 4-byte marker "LFRM" (kFrameMarker): frame 0 is the FlatBuffers header, frames 1.. are
// payloads, so payload decoding (DecodeValues) is fuzzed as well as the header. Each frame
// is copied into its own allocation, as ZeroMQ delivers it, so a read past a frame's end
// is caught by AddressSanitizer.
//
// A batch (wire.h PackBatch) is unpacked and each of its messages read as below.
// The target verifies the message with VerifyEnvelope (default limits and tight ones),
// then runs every reader the shard and the client apply to that body: ReadRows (several
// table sizes and key limits), DecodeValues on the payloads (with the counts the headers
// imply), ErrorToStatus, CanonicalSpec and Table::Create for table specs, the data plan
// through DataCoverage, and the field reads of every reply. It aborts when a reader
// accepts something its contract says it must reject (see CHECK below).
//
// `fuzz_wire --write-seeds=DIR` writes the seed corpus (one file per message kind, built
// with the Make* helpers, so it follows the schema) and exits.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <spdlog/spdlog.h>

#include "leash/common/partition.h"
#include "leash/common/wire.h"
#include "leash/ps/coverage.h"
#include "leash/ps/table.h"

namespace {

using namespace leash;

constexpr std::string_view kFrameMarker = "LFRM";

#define CHECK(cond, what)                                                         \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "fuzz_wire: invariant broken: %s (%s)\n", what, #cond); \
      std::abort();                                                               \
    }                                                                             \
  } while (0)

Message Split(const uint8_t* data, size_t size) {
  Message msg;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  while (true) {
    size_t at = in.find(kFrameMarker);
    std::string_view frame = in.substr(0, at);
    msg.push_back(Frame::Copy(frame));
    if (at == std::string_view::npos) break;
    in.remove_prefix(at + kFrameMarker.size());
  }
  return msg;
}

void CheckRows(const wire::RowSet* rs) {
  for (uint64_t table_rows : {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t{1} << 40, UINT64_MAX}) {
    for (size_t max_keys : {size_t{4}, WireLimits{}.max_keys}) {
      WireLimits limits;
      limits.max_keys = max_keys;
      auto r = ReadRows(rs, table_rows, limits);
      if (!r.ok()) {
        CHECK(!r.status().message().empty(), "a ReadRows error says what is wrong");
        continue;
      }
      CHECK(rs != nullptr, "ReadRows accepts no missing row set");
      if (r->explicit_keys) {
        CHECK(r->keys.size() <= max_keys, "ReadRows enforces the key limit");
        for (uint64_t k : r->keys) CHECK(k < table_rows, "ReadRows keys are inside the table");
        CHECK(r->size() == r->keys.size(), "Rows::size of explicit keys");
      } else {
        CHECK(r->begin <= r->end && r->end <= table_rows, "ReadRows ranges are inside the table");
        CHECK(r->size() == r->end - r->begin, "Rows::size of a range");
      }
    }
  }
}

// Decodes `frame` as `count` values of `dtype` the way the shard (push) and the client
// (pull reply) do, into a buffer no larger than the frame can fill: a decoder that
// accepted a count its frame does not hold would write past it.
void CheckDecode(const Frame& frame, wire::DType dtype, uint64_t count) {
  size_t width = DTypeSize(dtype);
  size_t fits = width == 0 ? 0 : frame.size() / width;
  std::vector<float> out(std::min<uint64_t>(count, fits) + 1);
  Status st = DecodeValues(frame, dtype, count, out.data());
  if (!st.ok()) return;
  CHECK(width != 0, "DecodeValues rejects unknown dtypes");
  CHECK(count <= fits && count * width == frame.size(), "DecodeValues accepts only a frame of exactly count values");
}

void CheckPayloads(const Message& msg, wire::DType dtype, uint64_t rows, uint64_t cols) {
  for (size_t i = 1; i < msg.size(); ++i) {
    CheckDecode(msg[i], dtype, rows * cols);  // as a reader multiplying header fields would
    CheckDecode(msg[i], dtype, rows);
    for (auto d : {wire::DType::F32, wire::DType::F16, wire::DType::BF16}) {
      CheckDecode(msg[i], d, msg[i].size() / DTypeSize(d));
    }
  }
}

void CheckTableSpec(const wire::TableSpec* spec) {
  auto canon = ps::CanonicalSpec(spec);
  if (!canon.ok()) return;
  // The canonical form verifies and is a fixed point: equal specs compare byte for byte.
  flatbuffers::Verifier v(canon->data(), canon->size());
  CHECK(v.VerifyBuffer<wire::TableSpec>(nullptr), "a canonical spec verifies");
  const auto* again = flatbuffers::GetRoot<wire::TableSpec>(canon->data());
  auto canon2 = ps::CanonicalSpec(again);
  CHECK(canon2.ok() && *canon2 == *canon, "CanonicalSpec is idempotent");
  for (int shards : {1, 3}) {
    RangePartitioner part(shards);
    for (int s = 0; s < shards; ++s) {
      RowRange r = part.Range(spec->rows(), s);
      CHECK(r.begin <= r.end && r.end <= spec->rows(), "a shard's row range is inside the table");
      // Build only tables that fit comfortably in the fuzzer's memory; the shard's own
      // size limit is fuzzed by fuzz_shard.
      if (r.size() * spec->cols() > (1u << 16) || r.size() > (1u << 16)) continue;
      auto t = ps::Table::Create(0, *canon, r);
      if (!t.ok()) continue;
      ps::TableSnapshot snap = t->ToSnapshot();
      for (float x : snap.values) CHECK(std::isfinite(x), "a table's initial values are finite");
      auto back = ps::Table::FromSnapshot(snap);
      CHECK(back.ok(), "a table's own snapshot restores");
    }
  }
}

void CheckPlan(const wire::ChunkRequest* m) {
  const wire::DataPlan* p = m->plan();
  ps::DataCoverage cov;
  DataPlan plan{p->num_samples(), p->chunk_size(), p->epochs(), p->seed()};
  if (!cov.SetPlan(plan).ok()) {
    CHECK(plan.chunks() > ps::kMaxChunks || plan.num_samples == 0 || plan.chunk_size == 0 || plan.epochs == 0,
          "SetPlan refuses only empty or oversized plans");
    return;
  }
  CHECK(plan.chunks() <= ps::kMaxChunks, "SetPlan enforces the chunk limit");
  if (plan.chunks() > (1u << 16)) return;  // valid but slow to lease: keep the fuzzer fast
  for (uint64_t w = 1; w <= 3; ++w) {
    ChunkGrant g = cov.Next(w);
    if (g.kind == ChunkGrant::Kind::kChunk) {
      CHECK(g.begin < g.end && g.end <= p->num_samples(), "a granted chunk is a non-empty part of the data");
    }
  }
  if (m->has_done()) cov.Complete(m->done_epoch(), m->done_chunk());
  cov.Release(2);
  auto bytes = cov.Serialize();
  auto back = ps::DataCoverage::Deserialize(bytes);
  CHECK(back.ok(), "DataCoverage restores its own serialization");
  CHECK(back->Serialize() == bytes, "DataCoverage round-trips");
}

void ReadBody(const wire::Envelope* env, const Message& msg) {
  (void)wire::EnumNameBody(env->body_type());
  switch (env->body_type()) {
    case wire::Body::Register: {
      auto* m = env->body_as_Register();
      if (m->name()) (void)m->name()->str();
      break;
    }
    case wire::Body::CreateTable: CheckTableSpec(env->body_as_CreateTable()->spec()); break;
    case wire::Body::Pull: CheckRows(env->body_as_Pull()->rows()); break;
    case wire::Body::Push: {
      auto* m = env->body_as_Push();
      CheckRows(m->rows());
      for (uint64_t cols : {uint64_t{1}, uint64_t{3}}) {
        auto r = ReadRows(m->rows(), UINT64_MAX);
        if (r.ok()) CheckPayloads(msg, m->dtype(), r->size(), cols);
      }
      break;
    }
    case wire::Body::PullReply: {
      auto* m = env->body_as_PullReply();
      CheckPayloads(msg, m->dtype(), m->num_rows(), m->cols());
      break;
    }
    case wire::Body::Error: {
      Status st = ErrorToStatus(env->body_as_Error());
      CHECK(!st.ok(), "an Error body never converts to Ok");
      (void)st.ToString();
      break;
    }
    case wire::Body::ChunkRequest: CheckPlan(env->body_as_ChunkRequest()); break;
    case wire::Body::StatsReply: {
      auto* r = env->body_as_StatsReply();
      if (r->workers()) {
        for (const auto* w : *r->workers()) {
          if (w->name()) (void)w->name()->str();
        }
      }
      if (r->tables()) {
        for (const auto* t : *r->tables()) {
          if (t->name()) (void)t->name()->str();
        }
      }
      break;
    }
    default: break;  // the remaining bodies hold scalars only, read by the verifier already
  }
}

std::vector<std::pair<std::string, Message>> Seeds() {
  std::vector<std::pair<std::string, Message>> s;
  TableSpecArgs t;
  t.name = "fc1.w";
  t.rows = 10;
  t.cols = 4;
  t.optimizer = wire::OptimizerKind::Adam;
  t.init = wire::InitKind::Normal;
  t.init_scale = 0.1f;
  std::vector<float> grad(8, 0.5f);
  Rows keys;
  keys.explicit_keys = true;
  keys.keys = {1, 3};
  ChunkDone done{0, 2};
  s.emplace_back("register", MakeRegister(1, 7, 1, "worker-7"));
  s.emplace_back("create_table", MakeCreateTable(2, t));
  s.emplace_back("pull_range", MakePull(3, 0, Rows::Range(2, 6), 7, 4, 1));
  s.emplace_back("pull_keys_fp16", MakePull(4, 0, keys, 7, 4, 1, wire::DType::F16));
  s.emplace_back("push_range", MakePush(5, 0, Rows::Range(0, 2), 7, 1, 1, wire::DType::F32, EncodeValues(grad, wire::DType::F32)));
  s.emplace_back("push_keys_bf16", MakePush(6, 0, keys, 7, 1, 2, wire::DType::BF16, EncodeValues(grad, wire::DType::BF16)));
  s.emplace_back("clock", MakeClock(7, 7, 5));
  s.emplace_back("heartbeat", MakeHeartbeat(8, 7, 1));
  s.emplace_back("leave", MakeLeave(9, 7, 1));
  s.emplace_back("stats", MakeStats(10));
  s.emplace_back("checkpoint", MakeCheckpoint(11));
  s.emplace_back("chunk_request", MakeChunkRequest(12, 7, 1, 60000, 1000, 3, 42, &done));
  s.emplace_back("error", MakeError(13, NotRegistered("worker 7 is not registered"), 99));
  s.emplace_back("pull_reply", MakeMessage(
                                   14,
                                   [](flatbuffers::FlatBufferBuilder& fbb) {
                                     return std::make_pair(wire::Body::PullReply,
                                                           wire::CreatePullReply(fbb, 0, 2, 4, wire::DType::F16, 3).Union());
                                   },
                                   {EncodeValues(grad, wire::DType::F16)}));
  s.emplace_back("stats_reply", MakeMessage(15, [](flatbuffers::FlatBufferBuilder& fbb) {
                   std::vector<flatbuffers::Offset<wire::WorkerInfo>> w{
                       wire::CreateWorkerInfo(fbb, 7, 1, fbb.CreateString("w7"), 3, 12)};
                   std::vector<flatbuffers::Offset<wire::TableInfo>> tb{
                       wire::CreateTableInfo(fbb, 0, fbb.CreateString("fc1.w"), 10, 4, 5)};
                   auto wv = fbb.CreateVector(w);
                   auto tv = fbb.CreateVector(tb);
                   return std::make_pair(wire::Body::StatsReply,
                                         wire::CreateStatsReply(fbb, 0, 2, 3, 1, 10, 20, 0, 2, -1, wv, tv).Union());
                 }));
  s.emplace_back("welcome", MakeMessage(16, [](flatbuffers::FlatBufferBuilder& fbb) {
                   return std::make_pair(wire::Body::Welcome, wire::CreateWelcome(fbb, 0, 2, 3, 10000, -1, 99).Union());
                 }));
  s.emplace_back("chunk_grant", MakeMessage(17, [](flatbuffers::FlatBufferBuilder& fbb) {
                   return std::make_pair(wire::Body::ChunkGrant,
                                         wire::CreateChunkGrant(fbb, wire::GrantKind::Chunk, 0, 3, 3000, 4000, 0, 1, 60).Union());
                 }));
  // A batch of an iteration's pushes and clock, as RemoteParams sends them.
  std::vector<Message> batch;
  for (const auto& [name, msg] : s) {
    if (name == "push_range" || name == "pull_range" || name == "clock") batch.push_back(msg);
  }
  if (!batch.empty()) s.emplace_back("batch", PackBatch(batch));
  return s;
}

void WriteSeeds(const std::string& dir) {
  for (const auto& [name, msg] : Seeds()) {
    std::string bytes;
    for (size_t i = 0; i < msg.size(); ++i) {
      if (i > 0) bytes += kFrameMarker;
      bytes += msg[i].view();
    }
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
  }
  std::fprintf(stderr, "fuzz_wire: wrote %zu seeds to %s\n", Seeds().size(), dir.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  spdlog::set_level(spdlog::level::off);
  for (int i = 1; i < *argc; ++i) {
    std::string_view a = (*argv)[i];
    if (a.starts_with("--write-seeds=")) {
      WriteSeeds(std::string(a.substr(14)));
      std::exit(0);
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Message msg = Split(data, size);
  if (IsBatch(msg)) {
    auto parts = UnpackBatch(msg);
    if (!parts.ok()) {
      CHECK(!parts.status().message().empty(), "a batch error says what is wrong");
      return 0;
    }
    size_t frames = 0;
    for (const Message& m : *parts) {
      CHECK(!m.empty(), "every message of a batch has a frame");
      frames += m.size();
      if (auto env = VerifyEnvelope(m); env.ok()) ReadBody(*env, m);
    }
    CHECK(frames + 1 == msg.size(), "a batch's messages hold exactly the frames after its header");
    return 0;
  }
  (void)PeekRequestId(msg);
  WireLimits tight;
  tight.max_header_bytes = 256;
  tight.max_keys = 4;
  auto small = VerifyEnvelope(msg, tight);
  auto env = VerifyEnvelope(msg);
  if (!env.ok()) {
    CHECK(!small.ok(), "tighter limits accept no more than the defaults");
    CHECK(!env.status().message().empty(), "a verification error says what is wrong");
    return 0;
  }
  CHECK((*env)->version() == kProtocolVersion, "VerifyEnvelope checks the version");
  CHECK(PeekRequestId(msg) == (*env)->request_id(), "PeekRequestId agrees with VerifyEnvelope");
  ReadBody(*env, msg);
  return 0;
}

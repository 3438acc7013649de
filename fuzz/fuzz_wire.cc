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
// The target decodes the message through the codec as a request (default limits and
// tight ones) and as a reply, then runs every reader the shard and the client apply to
// what decoded: the table's row checks (several table sizes), DecodeValues on the payloads
// (with the counts the headers imply), ValidateSpec, the stored spec bytes and
// Table::Create for table specs, the data plan through DataCoverage; and re-encodes what
// decoded. It aborts when a reader accepts something its contract says it must reject
// (see CHECK below).
//
// `fuzz_wire --write-seeds=DIR` writes the seed corpus (one file per message kind, built
// with the codec, so it follows the schema) and exits.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <spdlog/spdlog.h>

#include "fuzz_util.h"
#include "leash/common/partition.h"
#include "leash/common/wire.h"
#include "leash/ps/coverage.h"
#include "leash/ps/table.h"
#include "wire_format.h"

namespace {

using namespace leash;

constexpr std::string_view kFrameMarker = "LFRM";

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

// The row checks a shard applies to a decoded pull or push (keys inside the table), on
// tables of several sizes (built with no rows on this shard, so nothing is allocated).
void CheckRows(const Rows& rows, size_t max_keys) {
  if (rows.explicit_keys) {
    CHECK(rows.keys.size() <= max_keys, "the codec enforces the key limit");
    CHECK(rows.size() == rows.keys.size(), "Rows::size of explicit keys");
  }
  for (uint64_t table_rows : {uint64_t{1}, uint64_t{7}, uint64_t{1} << 40}) {
    TableSpec spec;
    spec.name = "t";
    spec.rows = table_rows;
    spec.cols = 1;
    auto table = ps::Table::Create(0, spec, RowRange{0, 0});
    CHECK(table.ok(), "an empty share of a valid table is created");
    Status st = table->CheckInTable(rows);
    if (!st.ok()) {
      CHECK(!st.message().empty(), "a row-check error says what is wrong");
      continue;
    }
    if (rows.explicit_keys) {
      for (uint64_t k : rows.keys) CHECK(k < table_rows, "checked keys are inside the table");
    } else {
      CHECK(rows.begin <= rows.end && rows.end <= table_rows,
            "checked ranges are inside the table");
      CHECK(rows.size() == rows.end - rows.begin, "Rows::size of a range");
    }
  }
}

// Decodes `frame` as `count` values of `dtype` the way the shard (push) and the client
// (pull reply) do, into a buffer no larger than the frame can fill: a decoder that
// accepted a count its frame does not hold would write past it.
void CheckDecode(const Frame& frame, DType dtype, uint64_t count) {
  size_t width = DTypeSize(dtype);
  size_t fits = width == 0 ? 0 : frame.size() / width;
  std::vector<float> out(std::min<uint64_t>(count, fits) + 1);
  Status st = DecodeValues(frame, dtype, count, out.data());
  if (!st.ok()) return;
  CHECK(width != 0, "DecodeValues rejects unknown dtypes");
  CHECK(count <= fits && count * width == frame.size(),
        "DecodeValues accepts only a frame of exactly count values");
}

void CheckPayloads(std::span<const Frame> payloads, DType dtype, uint64_t rows, uint64_t cols) {
  for (const Frame& f : payloads) {
    CheckDecode(f, dtype, rows * cols);  // as a reader multiplying header fields would
    CheckDecode(f, dtype, rows);
    for (auto d : {DType::kF32, DType::kF16, DType::kBF16})
      CheckDecode(f, d, f.size() / DTypeSize(d));
    CheckDecode(f, static_cast<DType>(7), 1);
  }
}

void CheckTableSpec(const TableSpec& spec) {
  if (!ps::ValidateSpec(spec).ok()) return;
  // The bytes the snapshot store keeps decode to the same spec.
  auto back = DecodeTableSpec(EncodeTableSpec(spec));
  CHECK(back.ok() && *back == spec, "a valid spec round-trips through its stored bytes");
  CHECK(ps::SameTableSpec(spec, *back), "SameTableSpec is reflexive");
  (void)ps::DescribeSpec(spec);
  for (int shards : {1, 3}) {
    RangePartitioner part(shards);
    for (int s = 0; s < shards; ++s) {
      RowRange r = part.Range(spec.rows, s);
      CHECK(r.begin <= r.end && r.end <= spec.rows, "a shard's row range is inside the table");
      // Build only tables that fit comfortably in the fuzzer's memory; the shard's own
      // size limit is fuzzed by fuzz_shard.
      if (r.size() * spec.cols > (1u << 16) || r.size() > (1u << 16)) continue;
      auto t = ps::Table::Create(0, spec, r);
      if (!t.ok()) continue;
      ps::TableSnapshot snap = t->ToSnapshot();
      for (float x : snap.values) CHECK(std::isfinite(x), "a table's initial values are finite");
      auto restored = ps::Table::FromSnapshot(snap);
      CHECK(restored.ok(), "a table's own snapshot restores");
    }
  }
}

void CheckPlan(const ChunkRequest& m) {
  const DataPlan& plan = m.plan;
  ps::DataCoverage cov;
  if (!cov.SetPlan(plan).ok()) {
    CHECK(ps::PlanChunks(plan) > ps::kMaxChunks || plan.num_samples == 0 || plan.chunk_size == 0 ||
              plan.epochs == 0,
          "SetPlan refuses only empty or oversized plans");
    return;
  }
  CHECK(ps::PlanChunks(plan) <= ps::kMaxChunks, "SetPlan enforces the chunk limit");
  if (ps::PlanChunks(plan) > (1u << 16)) return;  // valid but slow to lease: keep the fuzzer fast
  for (uint64_t w = 1; w <= 3; ++w) {
    ChunkGrant g = cov.Next(w);
    if (g.kind == ChunkGrant::Kind::kChunk) {
      CHECK(g.begin < g.end && g.end <= plan.num_samples,
            "a granted chunk is a non-empty part of the data");
    }
  }
  if (m.done) cov.Complete(m.done->epoch, m.done->chunk);
  cov.Release(2);
  auto bytes = cov.Serialize();
  auto back = ps::DataCoverage::Deserialize(bytes);
  CHECK(back.ok(), "DataCoverage restores its own serialization");
  CHECK(back->Serialize() == bytes, "DataCoverage round-trips");
}

// Runs the readers the shard applies to a decoded request.
void CheckRequest(Request& request, std::span<const Frame> payloads, size_t max_keys) {
  if (auto* m = std::get_if<CreateTableRequest>(&request)) CheckTableSpec(m->spec);
  if (auto* m = std::get_if<PullRequest>(&request)) {
    CHECK(payloads.empty(), "a decoded pull carries no payload");
    CheckRows(m->rows, max_keys);
  }
  if (auto* m = std::get_if<PushRequest>(&request)) {
    CheckRows(m->rows, max_keys);
    for (uint64_t cols : {uint64_t{1}, uint64_t{3}})
      CheckPayloads(payloads, m->dtype, m->rows.size(), cols);
  }
  if (auto* m = std::get_if<ChunkRequest>(&request)) CheckPlan(*m);
}

// Decodes `msg` as a request (default and tight limits) and as a reply, runs the readers
// on what decodes and checks that re-encoding it decodes again.
void ReadMessage(const Message& msg) {
  WireLimits tight;
  tight.max_header_bytes = 256;
  tight.max_keys = 4;
  auto small = DecodeRequest(msg, tight);
  auto request = DecodeRequest(msg);
  auto reply = DecodeReply(msg);
  CHECK(!(request.ok() && reply.ok()), "no message is both a request and a reply");
  if (!request.ok()) {
    CHECK(!small.ok(), "tighter limits accept no more than the defaults");
    CHECK(!request.status().message().empty(), "a decoding error says what is wrong");
  } else {
    CHECK(PeekRequestId(msg) == request->request_id, "PeekRequestId agrees with DecodeRequest");
    if (small.ok()) CheckRequest(small->value, small->payloads, tight.max_keys);
    CheckRequest(request->value, request->payloads, WireLimits{}.max_keys);
    std::vector<Frame> payloads(request->payloads.begin(), request->payloads.end());
    Message again = EncodeRequest(request->request_id, request->value, std::move(payloads));
    auto decoded = DecodeRequest(again);
    CHECK(decoded.ok() && decoded->value.index() == request->value.index(),
          "a decoded request re-encodes");
  }
  if (!reply.ok()) {
    CHECK(!reply.status().message().empty(), "a decoding error says what is wrong");
    return;
  }
  CHECK(PeekRequestId(msg) == reply->request_id, "PeekRequestId agrees with DecodeReply");
  if (const auto* r = std::get_if<PullReply>(&reply->value))
    CheckPayloads(reply->payloads, r->dtype, r->num_rows, r->cols);
  if (const auto* e = std::get_if<ErrorReply>(&reply->value)) {
    CHECK(!e->status.ok(), "an Error body never converts to Ok");
    (void)e->status.ToString();
  }
  Message again = EncodeReply(reply->request_id, reply->value);
  auto decoded = DecodeReply(again);
  CHECK(decoded.ok() && decoded->value.index() == reply->value.index(),
        "a decoded reply re-encodes");
}

std::vector<std::pair<std::string, Message>> Seeds() {
  std::vector<std::pair<std::string, Message>> s;
  TableSpec t;
  t.name = "fc1.w";
  t.rows = 10;
  t.cols = 4;
  t.optimizer.kind = OptimizerKind::kAdam;
  t.init = {InitKind::kNormal, 0.1f, 0};
  std::vector<float> grad(8, 0.5f);
  Rows keys;
  keys.explicit_keys = true;
  keys.keys = {1, 3};
  ChunkDone done{0, 2};
  s.emplace_back("register", MakeRegister(1, 7, 1, "worker-7"));
  s.emplace_back("create_table", MakeCreateTable(2, t));
  s.emplace_back("pull_range", MakePull(3, 0, Rows::Range(2, 6), 7, 4, 1));
  s.emplace_back("pull_keys_fp16", MakePull(4, 0, keys, 7, 4, 1, DType::kF16));
  s.emplace_back("push_range", MakePush(5, 0, Rows::Range(0, 2), 7, 1, 1, DType::kF32,
                                        EncodeValues(grad, DType::kF32)));
  s.emplace_back("push_keys_bf16",
                 MakePush(6, 0, keys, 7, 1, 2, DType::kBF16, EncodeValues(grad, DType::kBF16)));
  s.emplace_back("clock", MakeClock(7, 7, 5));
  s.emplace_back("heartbeat", MakeHeartbeat(8, 7, 1));
  s.emplace_back("leave", MakeLeave(9, 7, 1));
  s.emplace_back("stats", MakeStats(10));
  s.emplace_back("checkpoint", MakeCheckpoint(11));
  s.emplace_back("chunk_request", MakeChunkRequest(12, 7, 1, DataPlan{60000, 1000, 3, 42}, &done));
  s.emplace_back("error", MakeError(13, NotRegistered("worker 7 is not registered"), 99));
  s.emplace_back("pull_reply", EncodeReply(14, PullReply{0, 2, 4, DType::kF16, 3},
                                           {EncodeValues(grad, DType::kF16)}));
  ShardStats stats;
  stats.num_shards = 2;
  stats.min_clock = 3;
  stats.parked_pulls = 1;
  stats.pushes_applied = 10;
  stats.pulls_served = 20;
  stats.last_snapshot_clock = 2;
  stats.workers = {{7, 1, "w7", 3, 12}};
  stats.tables = {{0, "fc1.w", 10, 4, 5}};
  s.emplace_back("stats_reply", EncodeReply(15, stats));
  s.emplace_back("welcome", EncodeReply(16, Welcome{0, 2, 3, 10000, -1, 99, 0}));
  s.emplace_back("chunk_grant",
                 EncodeReply(17, ChunkGrant{ChunkGrant::Kind::kChunk, 0, 3, 3000, 4000, 0, 1, 60}));
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
  leash::fuzz::WriteSeedsIfAsked(*argc, *argv, WriteSeeds);
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
      ReadMessage(m);
    }
    CHECK(frames + 1 == msg.size(), "a batch's messages hold exactly the frames after its header");
    return 0;
  }
  (void)PeekRequestId(msg);
  // The envelope layer on its own: the version check and the request id.
  if (auto env = VerifyEnvelope(msg); env.ok()) {
    CHECK((*env)->version() == kProtocolVersion, "VerifyEnvelope checks the version");
    CHECK(PeekRequestId(msg) == (*env)->request_id(), "PeekRequestId agrees with VerifyEnvelope");
  }
  ReadMessage(msg);
  return 0;
}

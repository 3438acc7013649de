// Encoding and verification of Leash messages (schema/leash.fbs). Every inbound header
// is verified here before any field is read; FlatBuffers verification failures are
// translated to Status only in this file. Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "leash/common/domain.h"
#include "leash/common/message.h"
#include "leash/common/status.h"
#include "leash/schema/leash_generated.h"

namespace leash {

inline constexpr uint16_t kProtocolVersion = 1;

// Limits a reader enforces on a header before trusting it.
struct WireLimits {
  size_t max_header_bytes = 1 << 20;
  size_t max_keys = size_t{1} << 24;
};

// Verifies frame 0 of `msg` as an Envelope of this protocol version with a body.
// InvalidArgument for empty, truncated or garbage bytes; VersionMismatch for another
// protocol version. The returned pointer lives as long as msg[0].
Result<const wire::Envelope*> VerifyEnvelope(const Message& msg, const WireLimits& limits = {});

// Request id of a header that may be malformed; 0 when it cannot be read safely.
uint64_t PeekRequestId(const Message& msg);

// Builds a one-frame-header message. `build` fills the body and returns its union type
// and offset. Payload frames are appended after the header.
template <typename BuildBody>
Message MakeMessage(uint64_t request_id, BuildBody&& build, std::vector<Frame> payloads = {}) {
  flatbuffers::FlatBufferBuilder fbb(256);
  auto [type, body] = build(fbb);
  auto env = wire::CreateEnvelope(fbb, kProtocolVersion, request_id, type, body);
  wire::FinishEnvelopeBuffer(fbb, env);
  Message m;
  m.reserve(1 + payloads.size());
  auto detached = std::make_shared<flatbuffers::DetachedBuffer>(fbb.Release());
  m.push_back(Frame::Wrap(detached->data(), detached->size(), std::shared_ptr<const void>(detached)));
  for (auto& p : payloads) m.push_back(std::move(p));
  return m;
}

// Batches: several messages (requests, or their replies) as one ZeroMQ message, so an
// iteration's pulls, or its pushes and clock, cost one message each way per shard
// instead of one per table. Frame 0 is a batch header (never a valid Envelope: it starts
// with 0xff), then every message's frames in order. A shard handles the messages of a
// batch one by one, as if they had come alone, and answers them in one batch.
inline constexpr size_t kMaxBatchMessages = 4096;
// True if frame 0 of `msg` is a batch header (the rest may still be malformed).
bool IsBatch(const Message& msg);
// `messages` (each at least one frame, at most kMaxBatchMessages) as one message.
Message PackBatch(std::vector<Message> messages);
// The messages of a batch, sharing its frames. InvalidArgument, saying what is wrong,
// for a header that is truncated, names no message or too many, an empty message, or
// frame counts that do not add up to the frames that follow it.
Result<std::vector<Message>> UnpackBatch(const Message& batch);

Message MakeError(uint64_t request_id, const Status& status, uint64_t boot_id = 0);
// Converts an Error body back to a Status (code and message).
Status ErrorToStatus(const wire::Error* error);

wire::ErrorCode ToWireCode(StatusCode code);
StatusCode FromWireCode(wire::ErrorCode code);

// Bytes per value of a wire dtype.
size_t DTypeSize(wire::DType dtype);
const char* DTypeName(wire::DType dtype);
// Domain dtype (domain.h) to its wire enum and back (the values are the same).
inline wire::DType ToWire(DType dtype) { return static_cast<wire::DType>(dtype); }
inline DType FromWire(wire::DType dtype) { return static_cast<DType>(dtype); }

// Encodes float32 values as a payload frame in `dtype`.
Frame EncodeValues(std::span<const float> values, wire::DType dtype);
// The same into `out`, which holds values.size() * DTypeSize(dtype) bytes.
void EncodeValuesInto(std::span<const float> values, wire::DType dtype, uint8_t* out);
// Decodes a payload frame holding exactly `count` values of `dtype` into `out`.
// InvalidArgument (naming both sizes) if the frame has another size.
Status DecodeValues(const Frame& frame, wire::DType dtype, size_t count, float* out);

flatbuffers::Offset<wire::RowSet> BuildRows(flatbuffers::FlatBufferBuilder& fbb, const Rows& rows);
// Validates `rs` against a table of `table_rows` rows: keys in range, begin <= end.
Result<Rows> ReadRows(const wire::RowSet* rs, uint64_t table_rows, const WireLimits& limits = {});

// Requests, as the client sends them (also used by tests and tools).
Message MakeRegister(uint64_t rid, uint64_t worker_id, uint64_t incarnation, const std::string& name);
Message MakePull(uint64_t rid, uint32_t table_id, const Rows& rows, uint64_t worker_id, int64_t clock,
                 int64_t staleness, wire::DType dtype = wire::DType::F32);
// `payload` holds the gradient encoded in `dtype` (see EncodeValues).
Message MakePush(uint64_t rid, uint32_t table_id, const Rows& rows, uint64_t worker_id, uint64_t incarnation,
                 uint64_t seq, wire::DType dtype, Frame payload);
Message MakeClock(uint64_t rid, uint64_t worker_id, int64_t clock);
Message MakeHeartbeat(uint64_t rid, uint64_t worker_id, uint64_t incarnation);
Message MakeLeave(uint64_t rid, uint64_t worker_id, uint64_t incarnation);
Message MakeStats(uint64_t rid);
Message MakeChunkRequest(uint64_t rid, uint64_t worker_id, uint64_t incarnation, uint64_t num_samples,
                         uint32_t chunk_size, uint32_t epochs, uint64_t seed, const ChunkDone* done);
Message MakeCheckpoint(uint64_t rid);

struct TableSpecArgs {
  std::string name;
  uint64_t rows = 0;
  uint32_t cols = 0;
  wire::OptimizerKind optimizer = wire::OptimizerKind::SGD;
  float learning_rate = 0.01f;
  float momentum = 0.9f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  float weight_decay = 0.f;
  wire::InitKind init = wire::InitKind::Zeros;
  float init_scale = 0.f;
  uint64_t init_seed = 0;
};
flatbuffers::Offset<wire::TableSpec> BuildTableSpec(flatbuffers::FlatBufferBuilder& fbb, const TableSpecArgs& t);
Message MakeCreateTable(uint64_t rid, const TableSpecArgs& t);

}  // namespace leash

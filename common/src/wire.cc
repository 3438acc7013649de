// Envelope verification, error replies and tensor payload encoding.
#include "leash/common/wire.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "leash/common/half.h"

namespace leash {

Result<const wire::Envelope*> VerifyEnvelope(const Message& msg, const WireLimits& limits) {
  if (msg.empty()) return InvalidArgument("empty message: expected a FlatBuffers Envelope header frame");
  const Frame& h = msg[0];
  if (h.size() < 8) {
    return InvalidArgument("header of " + std::to_string(h.size()) + " bytes is too short to be an Envelope");
  }
  if (h.size() > limits.max_header_bytes) {
    return ResourceExhausted("header of " + std::to_string(h.size()) + " bytes exceeds the limit of " +
                             std::to_string(limits.max_header_bytes));
  }
  if (!wire::EnvelopeBufferHasIdentifier(h.data())) {
    return InvalidArgument("header is not a Leash message (file identifier is not LSH1)");
  }
  flatbuffers::Verifier::Options vo;
  vo.max_depth = 16;
  vo.max_tables = 100000;
  vo.check_alignment = true;
  flatbuffers::Verifier v(h.data(), h.size(), vo);
  if (!wire::VerifyEnvelopeBuffer(v)) {
    return InvalidArgument("header failed FlatBuffers verification (truncated or corrupt message)");
  }
  const wire::Envelope* env = wire::GetEnvelope(h.data());
  if (env->version() != kProtocolVersion) {
    return VersionMismatch("peer speaks protocol version " + std::to_string(env->version()) + ", this build speaks " +
                           std::to_string(kProtocolVersion) + "; run the same Leash release everywhere");
  }
  if (env->body_type() == wire::Body::NONE || env->body() == nullptr) {
    return InvalidArgument("message has no body");
  }
  return env;
}

uint64_t PeekRequestId(const Message& msg) {
  auto env = VerifyEnvelope(msg);
  if (env.ok()) return (*env)->request_id();
  if (!msg.empty() && msg[0].size() >= 8) {
    flatbuffers::Verifier v(msg[0].data(), msg[0].size());
    // A table that verifies on its own still gives a usable request id.
    if (v.VerifyBuffer<wire::Envelope>(nullptr)) return wire::GetEnvelope(msg[0].data())->request_id();
  }
  return 0;
}

wire::ErrorCode ToWireCode(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return wire::ErrorCode::Ok;
    case StatusCode::kInvalidArgument: return wire::ErrorCode::InvalidArgument;
    case StatusCode::kNotFound: return wire::ErrorCode::NotFound;
    case StatusCode::kAlreadyExists: return wire::ErrorCode::AlreadyExists;
    case StatusCode::kFailedPrecondition: return wire::ErrorCode::FailedPrecondition;
    case StatusCode::kResourceExhausted: return wire::ErrorCode::ResourceExhausted;
    case StatusCode::kUnavailable: return wire::ErrorCode::Unavailable;
    case StatusCode::kVersionMismatch: return wire::ErrorCode::VersionMismatch;
    case StatusCode::kDataLoss: return wire::ErrorCode::DataLoss;
    case StatusCode::kAborted: return wire::ErrorCode::Aborted;
    case StatusCode::kNotRegistered: return wire::ErrorCode::NotRegistered;
    default: return wire::ErrorCode::Internal;
  }
}

StatusCode FromWireCode(wire::ErrorCode code) {
  switch (code) {
    case wire::ErrorCode::Ok: return StatusCode::kOk;
    case wire::ErrorCode::InvalidArgument: return StatusCode::kInvalidArgument;
    case wire::ErrorCode::NotFound: return StatusCode::kNotFound;
    case wire::ErrorCode::AlreadyExists: return StatusCode::kAlreadyExists;
    case wire::ErrorCode::FailedPrecondition: return StatusCode::kFailedPrecondition;
    case wire::ErrorCode::ResourceExhausted: return StatusCode::kResourceExhausted;
    case wire::ErrorCode::Unavailable: return StatusCode::kUnavailable;
    case wire::ErrorCode::VersionMismatch: return StatusCode::kVersionMismatch;
    case wire::ErrorCode::DataLoss: return StatusCode::kDataLoss;
    case wire::ErrorCode::Aborted: return StatusCode::kAborted;
    case wire::ErrorCode::NotRegistered: return StatusCode::kNotRegistered;
    default: return StatusCode::kInternal;
  }
}

namespace {
constexpr char kBatchMagic[8] = {'\xff', 'L', 'B', 'A', 'T', 'C', 'H', '1'};
}  // namespace

bool IsBatch(const Message& msg) {
  return !msg.empty() && msg[0].size() >= 8 && std::memcmp(msg[0].data(), kBatchMagic, 8) == 0;
}

Message PackBatch(std::vector<Message> messages) {
  std::vector<uint8_t> head(8 + 4 + 4 * messages.size());
  std::memcpy(head.data(), kBatchMagic, 8);
  auto count = static_cast<uint32_t>(messages.size());
  std::memcpy(head.data() + 8, &count, 4);
  size_t frames = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    auto n = static_cast<uint32_t>(messages[i].size());
    std::memcpy(head.data() + 12 + 4 * i, &n, 4);
    frames += n;
  }
  Message out;
  out.reserve(1 + frames);
  out.push_back(Frame::Own(std::move(head)));
  for (Message& m : messages) {
    for (Frame& f : m) out.push_back(std::move(f));
  }
  return out;
}

Result<std::vector<Message>> UnpackBatch(const Message& batch) {
  if (!IsBatch(batch)) return InvalidArgument("not a batch (frame 0 is no batch header)");
  const Frame& head = batch[0];
  if (head.size() < 12) return InvalidArgument("batch header of " + std::to_string(head.size()) + " bytes is truncated");
  uint32_t count;
  std::memcpy(&count, head.data() + 8, 4);
  if (count == 0 || count > kMaxBatchMessages) {
    return InvalidArgument("a batch must hold 1 to " + std::to_string(kMaxBatchMessages) + " messages, says " +
                           std::to_string(count));
  }
  if (head.size() != 12 + 4 * size_t{count}) {
    return InvalidArgument("batch header of " + std::to_string(head.size()) + " bytes for " + std::to_string(count) +
                           " messages (expected " + std::to_string(12 + 4 * size_t{count}) + ")");
  }
  std::vector<Message> out;
  out.reserve(count);
  size_t next = 1;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t n;
    std::memcpy(&n, head.data() + 12 + 4 * size_t{i}, 4);
    if (n == 0) return InvalidArgument("message " + std::to_string(i) + " of a batch has no frames");
    if (n > batch.size() - next) {
      return InvalidArgument("batch header names " + std::to_string(n) + " frames for message " + std::to_string(i) +
                             " but only " + std::to_string(batch.size() - next) + " follow");
    }
    out.emplace_back(batch.begin() + static_cast<std::ptrdiff_t>(next),
                     batch.begin() + static_cast<std::ptrdiff_t>(next + n));
    next += n;
  }
  if (next != batch.size()) {
    return InvalidArgument("batch has " + std::to_string(batch.size() - next) + " frames beyond its messages");
  }
  return out;
}

Message MakeError(uint64_t request_id, const Status& status, uint64_t boot_id) {
  return MakeMessage(request_id, [&](flatbuffers::FlatBufferBuilder& fbb) {
    auto msg = fbb.CreateString(status.message());
    return std::make_pair(wire::Body::Error, wire::CreateError(fbb, ToWireCode(status.code()), msg, boot_id).Union());
  });
}

Status ErrorToStatus(const wire::Error* error) {
  if (error == nullptr) return Internal("error reply without an error body");
  StatusCode code = FromWireCode(error->code());
  if (code == StatusCode::kOk) code = StatusCode::kInternal;
  return Status(code, error->message() ? error->message()->str() : std::string("(no message)"));
}

size_t DTypeSize(wire::DType dtype) {
  switch (dtype) {
    case wire::DType::F32: return 4;
    case wire::DType::F16: return 2;
    case wire::DType::BF16: return 2;
  }
  return 0;
}

const char* DTypeName(wire::DType dtype) {
  switch (dtype) {
    case wire::DType::F32: return "fp32";
    case wire::DType::F16: return "fp16";
    case wire::DType::BF16: return "bf16";
  }
  return "unknown";
}

Frame EncodeValues(std::span<const float> values, wire::DType dtype) {
  if (dtype == wire::DType::F32) return Frame::Copy(values.data(), values.size_bytes());
  std::vector<uint8_t> out(values.size() * DTypeSize(dtype));
  EncodeValuesInto(values, dtype, out.data());
  return Frame::Own(std::move(out));
}

void EncodeValuesInto(std::span<const float> values, wire::DType dtype, uint8_t* out) {
  switch (dtype) {
    case wire::DType::F32:
      if (!values.empty()) std::memcpy(out, values.data(), values.size_bytes());
      return;
    case wire::DType::F16:
    case wire::DType::BF16:
      for (size_t i = 0; i < values.size(); ++i) {
        uint16_t h = dtype == wire::DType::F16 ? FloatToHalf(values[i]) : FloatToBf16(values[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
  }
}

Status DecodeValues(const Frame& frame, wire::DType dtype, size_t count, float* out) {
  size_t width = DTypeSize(dtype);
  if (width == 0) return InvalidArgument("unknown payload dtype " + std::to_string(static_cast<int>(dtype)));
  // count > size / width first: count * width may wrap around to the frame's size.
  if (count > frame.size() / width || frame.size() != count * width) {
    return InvalidArgument("payload has " + std::to_string(frame.size()) + " bytes but the header describes " +
                           std::to_string(count) + " " + DTypeName(dtype) + " values (" +
                           std::to_string(count * width) + " bytes)");
  }
  const uint8_t* p = frame.data();
  switch (dtype) {
    case wire::DType::F32:
      if (count > 0) std::memcpy(out, p, count * 4);
      break;
    case wire::DType::F16:
    case wire::DType::BF16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = dtype == wire::DType::F16 ? HalfToFloat(h) : Bf16ToFloat(h);
      }
      break;
  }
  return Status::Ok();
}

flatbuffers::Offset<wire::RowSet> BuildRows(flatbuffers::FlatBufferBuilder& fbb, const Rows& rows) {
  if (rows.explicit_keys) {
    auto keys = fbb.CreateVector(rows.keys);
    return wire::CreateRowSet(fbb, 0, 0, keys);
  }
  return wire::CreateRowSet(fbb, rows.begin, rows.end);
}

Result<Rows> ReadRows(const wire::RowSet* rs, uint64_t table_rows, const WireLimits& limits) {
  if (rs == nullptr) return InvalidArgument("request has no row set");
  Rows r;
  if (rs->keys() != nullptr) {
    if (rs->keys()->size() > limits.max_keys) {
      return ResourceExhausted("request names " + std::to_string(rs->keys()->size()) + " keys; the limit is " +
                               std::to_string(limits.max_keys));
    }
    // FlatBuffers 2.0 verifies a vector's length field, not its 8-byte elements, for
    // alignment; a builder always aligns them, so a misaligned one is a forged message.
    if (reinterpret_cast<uintptr_t>(rs->keys()->Data()) % alignof(uint64_t) != 0) {
      return InvalidArgument("request has a misaligned key vector (corrupt or forged message)");
    }
    r.explicit_keys = true;
    r.keys.assign(rs->keys()->begin(), rs->keys()->end());
    for (uint64_t k : r.keys) {
      if (k >= table_rows) {
        return InvalidArgument("key " + std::to_string(k) + " is out of range for a table of " +
                               std::to_string(table_rows) + " rows");
      }
    }
    return r;
  }
  r.begin = rs->begin();
  r.end = rs->end();
  if (r.begin > r.end || r.end > table_rows) {
    return InvalidArgument("row range [" + std::to_string(r.begin) + ", " + std::to_string(r.end) +
                           ") is not inside a table of " + std::to_string(table_rows) + " rows");
  }
  return r;
}

Message MakeRegister(uint64_t rid, uint64_t worker_id, uint64_t incarnation, const std::string& name) {
  return MakeMessage(rid, [&](flatbuffers::FlatBufferBuilder& fbb) {
    auto n = fbb.CreateString(name);
    return std::make_pair(wire::Body::Register, wire::CreateRegister(fbb, worker_id, incarnation, n).Union());
  });
}

Message MakePull(uint64_t rid, uint32_t table_id, const Rows& rows, uint64_t worker_id, int64_t clock,
                 int64_t staleness, wire::DType dtype) {
  return MakeMessage(rid, [&](flatbuffers::FlatBufferBuilder& fbb) {
    auto rs = BuildRows(fbb, rows);
    return std::make_pair(wire::Body::Pull, wire::CreatePull(fbb, table_id, rs, worker_id, clock,
                                                             static_cast<int32_t>(staleness), dtype)
                                                .Union());
  });
}

Message MakePush(uint64_t rid, uint32_t table_id, const Rows& rows, uint64_t worker_id, uint64_t incarnation,
                 uint64_t seq, wire::DType dtype, Frame payload) {
  return MakeMessage(
      rid,
      [&](flatbuffers::FlatBufferBuilder& fbb) {
        auto rs = BuildRows(fbb, rows);
        return std::make_pair(wire::Body::Push,
                              wire::CreatePush(fbb, table_id, rs, worker_id, incarnation, seq, dtype).Union());
      },
      {std::move(payload)});
}

Message MakeClock(uint64_t rid, uint64_t worker_id, int64_t clock) {
  return MakeMessage(rid, [&](flatbuffers::FlatBufferBuilder& fbb) {
    return std::make_pair(wire::Body::ClockUpdate, wire::CreateClockUpdate(fbb, worker_id, clock).Union());
  });
}

Message MakeHeartbeat(uint64_t rid, uint64_t worker_id, uint64_t incarnation) {
  return MakeMessage(rid, [&](flatbuffers::FlatBufferBuilder& fbb) {
    return std::make_pair(wire::Body::Heartbeat, wire::CreateHeartbeat(fbb, worker_id, incarnation).Union());
  });
}

Message MakeLeave(uint64_t rid, uint64_t worker_id, uint64_t incarnation) {
  return MakeMessage(rid, [&](flatbuffers::FlatBufferBuilder& fbb) {
    return std::make_pair(wire::Body::Leave, wire::CreateLeave(fbb, worker_id, incarnation).Union());
  });
}

Message MakeStats(uint64_t rid) {
  return MakeMessage(rid, [](flatbuffers::FlatBufferBuilder& fbb) {
    return std::make_pair(wire::Body::Stats, wire::CreateStats(fbb).Union());
  });
}

Message MakeChunkRequest(uint64_t rid, uint64_t worker_id, uint64_t incarnation, uint64_t num_samples,
                         uint32_t chunk_size, uint32_t epochs, uint64_t seed, const ChunkDone* done) {
  return MakeMessage(rid, [&](flatbuffers::FlatBufferBuilder& fbb) {
    auto plan = wire::CreateDataPlan(fbb, num_samples, chunk_size, epochs, seed);
    return std::make_pair(wire::Body::ChunkRequest,
                          wire::CreateChunkRequest(fbb, worker_id, incarnation, plan, done != nullptr,
                                                   done ? done->epoch : 0, done ? done->chunk : 0)
                              .Union());
  });
}

Message MakeCheckpoint(uint64_t rid) {
  return MakeMessage(rid, [](flatbuffers::FlatBufferBuilder& fbb) {
    return std::make_pair(wire::Body::Checkpoint, wire::CreateCheckpoint(fbb).Union());
  });
}

flatbuffers::Offset<wire::TableSpec> BuildTableSpec(flatbuffers::FlatBufferBuilder& fbb, const TableSpecArgs& t) {
  auto name = fbb.CreateString(t.name);
  auto opt = wire::CreateOptimizerSpec(fbb, t.optimizer, t.learning_rate, t.momentum, t.beta1, t.beta2, t.epsilon,
                                       t.weight_decay);
  auto init = wire::CreateInitSpec(fbb, t.init, t.init_scale, t.init_seed);
  return wire::CreateTableSpec(fbb, name, t.rows, t.cols, opt, init);
}

Message MakeCreateTable(uint64_t rid, const TableSpecArgs& t) {
  return MakeMessage(rid, [&](flatbuffers::FlatBufferBuilder& fbb) {
    auto spec = BuildTableSpec(fbb, t);
    return std::make_pair(wire::Body::CreateTable, wire::CreateCreateTable(fbb, spec).Union());
  });
}

}  // namespace leash

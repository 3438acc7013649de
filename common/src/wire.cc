// The codec: envelope verification, requests and replies to and from the domain types,
// error replies and tensor payload encoding. Thread-safe (no shared state).
#include "leash/common/wire.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <variant>

#include "leash/common/half.h"
#include "wire_format.h"

namespace leash {

Result<const wire::Envelope*> VerifyEnvelope(const Message& msg, const WireLimits& limits) {
  if (msg.empty())
    return InvalidArgument("empty message: expected a FlatBuffers Envelope header frame");
  const Frame& h = msg[0];
  if (h.size() < 8) {
    return InvalidArgument("header of " + std::to_string(h.size()) +
                           " bytes is too short to be an Envelope");
  }
  if (h.size() > limits.max_header_bytes) {
    return ResourceExhausted("header of " + std::to_string(h.size()) +
                             " bytes exceeds the limit of " +
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
    return VersionMismatch("peer speaks protocol version " + std::to_string(env->version()) +
                           ", this build speaks " + std::to_string(kProtocolVersion) +
                           "; run the same Leash release everywhere");
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
    if (v.VerifyBuffer<wire::Envelope>(nullptr))
      return wire::GetEnvelope(msg[0].data())->request_id();
  }
  return 0;
}

wire::ErrorCode ToWireCode(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return wire::ErrorCode::Ok;
    case StatusCode::kInvalidArgument:
      return wire::ErrorCode::InvalidArgument;
    case StatusCode::kNotFound:
      return wire::ErrorCode::NotFound;
    case StatusCode::kAlreadyExists:
      return wire::ErrorCode::AlreadyExists;
    case StatusCode::kFailedPrecondition:
      return wire::ErrorCode::FailedPrecondition;
    case StatusCode::kResourceExhausted:
      return wire::ErrorCode::ResourceExhausted;
    case StatusCode::kUnavailable:
      return wire::ErrorCode::Unavailable;
    case StatusCode::kVersionMismatch:
      return wire::ErrorCode::VersionMismatch;
    case StatusCode::kDataLoss:
      return wire::ErrorCode::DataLoss;
    case StatusCode::kAborted:
      return wire::ErrorCode::Aborted;
    case StatusCode::kNotRegistered:
      return wire::ErrorCode::NotRegistered;
    default:
      return wire::ErrorCode::Internal;
  }
}

StatusCode FromWireCode(wire::ErrorCode code) {
  switch (code) {
    case wire::ErrorCode::Ok:
      return StatusCode::kOk;
    case wire::ErrorCode::InvalidArgument:
      return StatusCode::kInvalidArgument;
    case wire::ErrorCode::NotFound:
      return StatusCode::kNotFound;
    case wire::ErrorCode::AlreadyExists:
      return StatusCode::kAlreadyExists;
    case wire::ErrorCode::FailedPrecondition:
      return StatusCode::kFailedPrecondition;
    case wire::ErrorCode::ResourceExhausted:
      return StatusCode::kResourceExhausted;
    case wire::ErrorCode::Unavailable:
      return StatusCode::kUnavailable;
    case wire::ErrorCode::VersionMismatch:
      return StatusCode::kVersionMismatch;
    case wire::ErrorCode::DataLoss:
      return StatusCode::kDataLoss;
    case wire::ErrorCode::Aborted:
      return StatusCode::kAborted;
    case wire::ErrorCode::NotRegistered:
      return StatusCode::kNotRegistered;
    default:
      return StatusCode::kInternal;
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
  if (head.size() < 12)
    return InvalidArgument("batch header of " + std::to_string(head.size()) +
                           " bytes is truncated");
  uint32_t count;
  std::memcpy(&count, head.data() + 8, 4);
  if (count == 0 || count > kMaxBatchMessages) {
    return InvalidArgument("a batch must hold 1 to " + std::to_string(kMaxBatchMessages) +
                           " messages, says " + std::to_string(count));
  }
  if (head.size() != 12 + 4 * size_t{count}) {
    return InvalidArgument("batch header of " + std::to_string(head.size()) + " bytes for " +
                           std::to_string(count) + " messages (expected " +
                           std::to_string(12 + 4 * size_t{count}) + ")");
  }
  std::vector<Message> out;
  out.reserve(count);
  size_t next = 1;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t n;
    std::memcpy(&n, head.data() + 12 + 4 * size_t{i}, 4);
    if (n == 0)
      return InvalidArgument("message " + std::to_string(i) + " of a batch has no frames");
    if (n > batch.size() - next) {
      return InvalidArgument("batch header names " + std::to_string(n) + " frames for message " +
                             std::to_string(i) + " but only " +
                             std::to_string(batch.size() - next) + " follow");
    }
    out.emplace_back(batch.begin() + static_cast<std::ptrdiff_t>(next),
                     batch.begin() + static_cast<std::ptrdiff_t>(next + n));
    next += n;
  }
  if (next != batch.size()) {
    return InvalidArgument("batch has " + std::to_string(batch.size() - next) +
                           " frames beyond its messages");
  }
  return out;
}

Frame EncodeValues(std::span<const float> values, DType dtype) {
  if (dtype == DType::kF32) return Frame::Copy(values.data(), values.size_bytes());
  std::vector<uint8_t> out(values.size() * DTypeSize(dtype));
  EncodeValuesInto(values, dtype, out.data());
  return Frame::Own(std::move(out));
}

void EncodeValuesInto(std::span<const float> values, DType dtype, uint8_t* out) {
  switch (dtype) {
    case DType::kF32:
      if (!values.empty()) std::memcpy(out, values.data(), values.size_bytes());
      return;
    case DType::kF16:
      FloatToHalfN(values.data(), values.size(), out);
      return;
    case DType::kBF16:
      FloatToBf16N(values.data(), values.size(), out);
      return;
  }
}

Status DecodeValues(const Frame& frame, DType dtype, size_t count, float* out) {
  size_t width = DTypeSize(dtype);
  if (width == 0)
    return InvalidArgument("unknown payload dtype " + std::to_string(static_cast<int>(dtype)));
  // count > size / width first: count * width may wrap around to the frame's size.
  if (count > frame.size() / width || frame.size() != count * width) {
    return InvalidArgument("payload has " + std::to_string(frame.size()) +
                           " bytes but the header describes " + std::to_string(count) + " " +
                           DTypeName(dtype) + " values (" + std::to_string(count * width) +
                           " bytes)");
  }
  const uint8_t* p = frame.data();
  switch (dtype) {
    case DType::kF32:
      if (count > 0) std::memcpy(out, p, count * 4);
      break;
    case DType::kF16:
      HalfToFloatN(p, count, out);
      break;
    case DType::kBF16:
      Bf16ToFloatN(p, count, out);
      break;
  }
  return Status::Ok();
}

Status ErrorToStatus(const wire::Error* error) {
  if (error == nullptr) return Internal("error reply without an error body");
  StatusCode code = FromWireCode(error->code());
  if (code == StatusCode::kOk) code = StatusCode::kInternal;
  return Status(code, error->message() ? error->message()->str() : std::string("(no message)"));
}

// ---- rows and table specs -------------------------------------------------------------

flatbuffers::Offset<wire::RowSet> BuildRows(flatbuffers::FlatBufferBuilder& fbb, const Rows& rows) {
  if (rows.explicit_keys) {
    auto keys = fbb.CreateVector(rows.keys);
    return wire::CreateRowSet(fbb, 0, 0, keys);
  }
  return wire::CreateRowSet(fbb, rows.begin, rows.end);
}

namespace {

// A row set as sent; the range and keys are checked against the table by the shard.
Result<Rows> DecodeRows(const wire::RowSet* rs, const WireLimits& limits) {
  if (rs == nullptr) return InvalidArgument("request has no row set");
  Rows r;
  if (rs->keys() != nullptr) {
    if (rs->keys()->size() > limits.max_keys) {
      return ResourceExhausted("request names " + std::to_string(rs->keys()->size()) +
                               " keys; the limit is " + std::to_string(limits.max_keys));
    }
    // FlatBuffers 2.0 verifies a vector's length field, not its 8-byte elements, for
    // alignment; a builder always aligns them, so a misaligned one is a forged message.
    if (reinterpret_cast<uintptr_t>(rs->keys()->Data()) % alignof(uint64_t) != 0) {
      return InvalidArgument("request has a misaligned key vector (corrupt or forged message)");
    }
    r.explicit_keys = true;
    r.keys.assign(rs->keys()->begin(), rs->keys()->end());
    return r;
  }
  r.begin = rs->begin();
  r.end = rs->end();
  return r;
}

flatbuffers::Offset<wire::TableSpec> BuildTableSpec(flatbuffers::FlatBufferBuilder& fbb,
                                                    const TableSpec& t) {
  auto name = fbb.CreateString(t.name);
  const OptimizerConfig& o = t.optimizer;
  auto opt = wire::CreateOptimizerSpec(fbb, static_cast<wire::OptimizerKind>(o.kind), o.lr,
                                       o.momentum, o.beta1, o.beta2, o.epsilon, o.weight_decay,
                                       o.l1, o.ftrl_beta, o.clip_value);
  auto init = wire::CreateInitSpec(fbb, static_cast<wire::InitKind>(t.init.kind), t.init.scale,
                                   t.init.seed);
  return wire::CreateTableSpec(fbb, name, t.rows, t.cols, opt, init,
                               static_cast<wire::TableKind>(t.kind), t.sparse.admit_after,
                               t.sparse.expire_after_clocks);
}

// A verified TableSpec table as a domain spec. InvalidArgument for an empty name or an
// optimizer or initializer outside the enums (the other checks are the table's).
Result<TableSpec> ReadTableSpec(const wire::TableSpec* s) {
  if (s == nullptr || s->name() == nullptr || s->name()->size() == 0) {
    return InvalidArgument("table spec needs a non-empty name");
  }
  TableSpec t;
  t.name = s->name()->str();
  t.rows = s->rows();
  t.cols = s->cols();
  if (const wire::OptimizerSpec* o = s->optimizer()) {
    if (static_cast<int>(o->kind()) > static_cast<int>(kMaxOptimizerKind)) {
      return InvalidArgument("table '" + t.name + "' names an unknown optimizer");
    }
    t.optimizer.kind = static_cast<OptimizerKind>(o->kind());
    t.optimizer.lr = o->learning_rate();
    t.optimizer.momentum = o->momentum();
    t.optimizer.beta1 = o->beta1();
    t.optimizer.beta2 = o->beta2();
    t.optimizer.epsilon = o->epsilon();
    t.optimizer.weight_decay = o->weight_decay();
    t.optimizer.l1 = o->l1();
    t.optimizer.ftrl_beta = o->ftrl_beta();
    t.optimizer.clip_value = o->clip_value();
  }
  if (static_cast<int>(s->kind()) > static_cast<int>(kMaxTableKind)) {
    return InvalidArgument("table '" + t.name + "' names an unknown table kind");
  }
  t.kind = static_cast<TableKind>(s->kind());
  t.sparse.admit_after = s->admit_after();
  t.sparse.expire_after_clocks = s->expire_after_clocks();
  if (const wire::InitSpec* i = s->init()) {
    if (static_cast<int>(i->kind()) > static_cast<int>(kMaxInitKind)) {
      return InvalidArgument("table '" + t.name + "' names an unknown initializer");
    }
    t.init.kind = static_cast<InitKind>(i->kind());
    t.init.scale = i->scale();
    t.init.seed = i->seed();
  }
  return t;
}

Result<DType> ReadDType(wire::DType d, const char* what) {
  if (static_cast<int>(d) > static_cast<int>(kMaxDType))
    return InvalidArgument(std::string("unknown ") + what);
  return static_cast<DType>(d);
}

}  // namespace

std::vector<uint8_t> EncodeTableSpec(const TableSpec& spec) {
  flatbuffers::FlatBufferBuilder fbb(128);
  fbb.Finish(BuildTableSpec(fbb, spec));
  return std::vector<uint8_t>(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}

Result<TableSpec> DecodeTableSpec(std::span<const uint8_t> bytes) {
  flatbuffers::Verifier v(bytes.data(), bytes.size());
  if (bytes.empty() || !v.VerifyBuffer<wire::TableSpec>(nullptr)) {
    return DataLoss("stored table spec of " + std::to_string(bytes.size()) +
                    " bytes does not verify");
  }
  auto spec = ReadTableSpec(flatbuffers::GetRoot<wire::TableSpec>(bytes.data()));
  if (!spec.ok()) return DataLoss("stored table spec is invalid: " + spec.status().message());
  return spec;
}

// ---- requests -------------------------------------------------------------------------

namespace {

Result<Request> ReadRequest(const wire::Envelope* env, size_t payloads, const WireLimits& limits) {
  // Payload frames are only legal where the body says so (a push's gradient); a reply
  // body is refused below whatever follows it.
  const wire::Body body = env->body_type();
  const bool is_request = body == wire::Body::Register || body == wire::Body::CreateTable ||
                          body == wire::Body::Pull || body == wire::Body::Push ||
                          body == wire::Body::ClockUpdate || body == wire::Body::Heartbeat ||
                          body == wire::Body::Leave || body == wire::Body::Checkpoint ||
                          body == wire::Body::Stats || body == wire::Body::ChunkRequest;
  if (is_request && body != wire::Body::Push && payloads > 0) {
    return InvalidArgument("a " + std::string(wire::EnumNameBody(body)) +
                           " request carries no payload frames, got " + std::to_string(payloads));
  }
  switch (env->body_type()) {
    case wire::Body::Register: {
      const wire::Register* m = env->body_as_Register();
      return Request(RegisterRequest{m->worker_id(), m->incarnation(),
                                     m->name() ? m->name()->str() : std::string()});
    }
    case wire::Body::CreateTable: {
      LEASH_ASSIGN_OR_RETURN(TableSpec spec, ReadTableSpec(env->body_as_CreateTable()->spec()));
      return Request(CreateTableRequest{std::move(spec)});
    }
    case wire::Body::Pull: {
      const wire::Pull* m = env->body_as_Pull();
      PullRequest r;
      r.table_id = m->table_id();
      LEASH_ASSIGN_OR_RETURN(r.rows, DecodeRows(m->rows(), limits));
      r.worker_id = m->worker_id();
      r.clock = m->clock();
      r.staleness = m->staleness();
      LEASH_ASSIGN_OR_RETURN(r.dtype, ReadDType(m->dtype(), "reply dtype"));
      return Request(std::move(r));
    }
    case wire::Body::Push: {
      const wire::Push* m = env->body_as_Push();
      PushRequest r;
      r.table_id = m->table_id();
      LEASH_ASSIGN_OR_RETURN(r.rows, DecodeRows(m->rows(), limits));
      r.worker_id = m->worker_id();
      r.incarnation = m->incarnation();
      r.seq = m->seq();
      LEASH_ASSIGN_OR_RETURN(r.dtype, ReadDType(m->dtype(), "gradient dtype"));
      r.clock_after = m->clock_after();
      r.samples = m->samples();
      r.global_batch = m->global_batch();
      r.clock_step = m->clock_step();
      return Request(std::move(r));
    }
    case wire::Body::ClockUpdate: {
      const wire::ClockUpdate* m = env->body_as_ClockUpdate();
      return Request(ClockRequest{m->worker_id(), m->clock(), m->samples_per_second()});
    }
    case wire::Body::Heartbeat: {
      const wire::Heartbeat* m = env->body_as_Heartbeat();
      return Request(HeartbeatRequest{m->worker_id(), m->incarnation()});
    }
    case wire::Body::Leave: {
      const wire::Leave* m = env->body_as_Leave();
      return Request(LeaveRequest{m->worker_id(), m->incarnation()});
    }
    case wire::Body::Checkpoint:
      return Request(CheckpointRequest{});
    case wire::Body::Stats:
      return Request(StatsRequest{});
    case wire::Body::ChunkRequest: {
      const wire::ChunkRequest* m = env->body_as_ChunkRequest();
      ChunkRequest r;
      r.worker_id = m->worker_id();
      r.incarnation = m->incarnation();
      const wire::DataPlan* p = m->plan();
      if (p == nullptr) return InvalidArgument("chunk request has no data plan");
      r.plan = DataPlan{p->num_samples(), p->chunk_size(), p->epochs(), p->seed()};
      if (m->has_done()) r.done = ChunkDone{m->done_epoch(), m->done_chunk()};
      r.samples_per_second = m->samples_per_second();
      r.others_samples_per_second = m->others_samples_per_second();
      return Request(std::move(r));
    }
    default:
      return InvalidArgument(std::string("a shard does not accept ") +
                             wire::EnumNameBody(env->body_type()) + " messages");
  }
}

}  // namespace

Result<Decoded<Request>> DecodeRequest(const Message& msg, const WireLimits& limits) {
  LEASH_ASSIGN_OR_RETURN(const wire::Envelope* env, VerifyEnvelope(msg, limits));
  LEASH_ASSIGN_OR_RETURN(Request r, ReadRequest(env, msg.size() - 1, limits));
  return Decoded<Request>{env->request_id(), std::move(r), std::span<const Frame>(msg).subspan(1)};
}

Message EncodeRequest(uint64_t rid, const Request& request, std::vector<Frame> payloads) {
  return MakeMessage(
      rid,
      [&](flatbuffers::FlatBufferBuilder& fbb) -> std::pair<wire::Body, flatbuffers::Offset<void>> {
        return std::visit(
            [&](const auto& r) -> std::pair<wire::Body, flatbuffers::Offset<void>> {
              using T = std::decay_t<decltype(r)>;
              if constexpr (std::is_same_v<T, RegisterRequest>) {
                auto n = fbb.CreateString(r.name);
                return {wire::Body::Register,
                        wire::CreateRegister(fbb, r.worker_id, r.incarnation, n).Union()};
              } else if constexpr (std::is_same_v<T, CreateTableRequest>) {
                auto spec = BuildTableSpec(fbb, r.spec);
                return {wire::Body::CreateTable, wire::CreateCreateTable(fbb, spec).Union()};
              } else if constexpr (std::is_same_v<T, PullRequest>) {
                auto rs = BuildRows(fbb, r.rows);
                return {wire::Body::Pull,
                        wire::CreatePull(fbb, r.table_id, rs, r.worker_id, r.clock,
                                         static_cast<int32_t>(r.staleness), ToWire(r.dtype))
                            .Union()};
              } else if constexpr (std::is_same_v<T, PushRequest>) {
                auto rs = BuildRows(fbb, r.rows);
                return {wire::Body::Push,
                        wire::CreatePush(fbb, r.table_id, rs, r.worker_id, r.incarnation, r.seq,
                                         ToWire(r.dtype), r.clock_after, r.samples, r.global_batch,
                                         r.clock_step)
                            .Union()};
              } else if constexpr (std::is_same_v<T, ClockRequest>) {
                return {wire::Body::ClockUpdate,
                        wire::CreateClockUpdate(fbb, r.worker_id, r.clock, r.samples_per_second)
                            .Union()};
              } else if constexpr (std::is_same_v<T, HeartbeatRequest>) {
                return {wire::Body::Heartbeat,
                        wire::CreateHeartbeat(fbb, r.worker_id, r.incarnation).Union()};
              } else if constexpr (std::is_same_v<T, LeaveRequest>) {
                return {wire::Body::Leave,
                        wire::CreateLeave(fbb, r.worker_id, r.incarnation).Union()};
              } else if constexpr (std::is_same_v<T, CheckpointRequest>) {
                return {wire::Body::Checkpoint, wire::CreateCheckpoint(fbb).Union()};
              } else if constexpr (std::is_same_v<T, StatsRequest>) {
                return {wire::Body::Stats, wire::CreateStats(fbb).Union()};
              } else {
                static_assert(std::is_same_v<T, ChunkRequest>);
                const DataPlan& p = r.plan;
                auto plan =
                    wire::CreateDataPlan(fbb, p.num_samples, p.chunk_size, p.epochs, p.seed);
                return {wire::Body::ChunkRequest,
                        wire::CreateChunkRequest(fbb, r.worker_id, r.incarnation, plan,
                                                 r.done.has_value(), r.done ? r.done->epoch : 0,
                                                 r.done ? r.done->chunk : 0, r.samples_per_second,
                                                 r.others_samples_per_second)
                            .Union()};
              }
            },
            request);
      },
      std::move(payloads));
}

// ---- replies --------------------------------------------------------------------------

Message EncodeReply(uint64_t rid, const Reply& reply, std::vector<Frame> payloads) {
  return MakeMessage(
      rid,
      [&](flatbuffers::FlatBufferBuilder& fbb) -> std::pair<wire::Body, flatbuffers::Offset<void>> {
        return std::visit(
            [&](const auto& r) -> std::pair<wire::Body, flatbuffers::Offset<void>> {
              using T = std::decay_t<decltype(r)>;
              if constexpr (std::is_same_v<T, Welcome>) {
                return {wire::Body::Welcome,
                        wire::CreateWelcome(fbb, r.shard, r.num_shards, r.start_clock, r.lease_ms,
                                            r.recovered_clock, r.boot_id, r.max_message_bytes)
                            .Union()};
              } else if constexpr (std::is_same_v<T, TableCreated>) {
                return {wire::Body::TableCreated,
                        wire::CreateTableCreated(fbb, r.table_id, r.created).Union()};
              } else if constexpr (std::is_same_v<T, PullReply>) {
                return {wire::Body::PullReply,
                        wire::CreatePullReply(fbb, r.table_id, r.num_rows, r.cols, ToWire(r.dtype),
                                              r.min_clock)
                            .Union()};
              } else if constexpr (std::is_same_v<T, PushReply>) {
                return {wire::Body::PushReply,
                        wire::CreatePushReply(fbb, r.applied, r.skipped_rows).Union()};
              } else if constexpr (std::is_same_v<T, ClockReply>) {
                return {
                    wire::Body::ClockReply,
                    wire::CreateClockReply(fbb, r.min_clock, r.cluster_samples_per_second).Union()};
              } else if constexpr (std::is_same_v<T, HeartbeatReply>) {
                return {wire::Body::HeartbeatReply,
                        wire::CreateHeartbeatReply(fbb, r.min_clock, r.boot_id).Union()};
              } else if constexpr (std::is_same_v<T, LeaveReply>) {
                return {wire::Body::LeaveReply, wire::CreateLeaveReply(fbb).Union()};
              } else if constexpr (std::is_same_v<T, CheckpointReply>) {
                return {wire::Body::CheckpointReply,
                        wire::CreateCheckpointReply(fbb, r.clock).Union()};
              } else if constexpr (std::is_same_v<T, ShardStats>) {
                std::vector<flatbuffers::Offset<wire::WorkerInfo>> workers;
                workers.reserve(r.workers.size());
                for (const ShardStats::Worker& w : r.workers) {
                  workers.push_back(wire::CreateWorkerInfo(fbb, w.id, w.incarnation,
                                                           fbb.CreateString(w.name), w.clock,
                                                           w.ms_since_heartbeat));
                }
                std::vector<flatbuffers::Offset<wire::TableInfo>> tables;
                tables.reserve(r.tables.size());
                for (const ShardStats::TableStat& t : r.tables) {
                  tables.push_back(wire::CreateTableInfo(
                      fbb, t.table_id, fbb.CreateString(t.name), t.rows, t.cols, t.local_rows,
                      static_cast<wire::TableKind>(t.kind), t.resident_rows, t.memory_bytes,
                      t.tier_hits, t.tier_misses, t.evictions, t.admissions, t.unadmitted_reads,
                      t.dropped_gradients, t.expired_rows));
                }
                auto wv = fbb.CreateVector(workers);
                auto tv = fbb.CreateVector(tables);
                std::vector<flatbuffers::Offset<wire::BackupLag>> backups;
                backups.reserve(r.backups.size());
                for (const ShardStats::Backup& b : r.backups) {
                  backups.push_back(wire::CreateBackupLag(fbb, b.replica, b.in_sync, b.match_index,
                                                          b.entries_behind, b.bytes_behind,
                                                          b.ms_behind, b.ms_since_ack));
                }
                auto bv = fbb.CreateVector(backups);
                const CoverageProgress& p = r.coverage;
                return {
                    wire::Body::StatsReply,
                    wire::CreateStatsReply(
                        fbb, r.shard, r.num_shards, r.min_clock, r.parked_pulls, r.pushes_applied,
                        r.pulls_served, r.errors, r.last_snapshot_clock, r.recovered_clock, wv, tv,
                        p.epochs_done, p.epochs, p.chunks_done, p.num_chunks, p.chunks_leased,
                        r.snapshot_age_ms, r.memory_budget_bytes, r.memory_used_bytes,
                        r.resident_bytes, r.backup_workers, r.stale_pushes_dropped, r.replicas,
                        r.replica, r.term, r.log_index, r.replication_lag, r.replicas_in_sync,
                        r.commit_index, bv, r.pushes_summed, r.clock_steps,
                        static_cast<wire::DurableLogMode>(r.durable_log), r.durable_log_bytes,
                        r.durable_log_failed)
                        .Union()};
              } else if constexpr (std::is_same_v<T, ChunkGrant>) {
                return {wire::Body::ChunkGrant,
                        wire::CreateChunkGrant(fbb, static_cast<wire::GrantKind>(r.kind), r.epoch,
                                               r.chunk, r.begin, r.end, r.epochs_done,
                                               r.chunks_done, r.num_chunks)
                            .Union()};
              } else {
                static_assert(std::is_same_v<T, ErrorReply>);
                auto msg = fbb.CreateString(r.status.message());
                return {
                    wire::Body::Error,
                    wire::CreateError(fbb, ToWireCode(r.status.code()), msg, r.boot_id).Union()};
              }
            },
            reply);
      },
      std::move(payloads));
}

Message MakeError(uint64_t request_id, const Status& status, uint64_t boot_id) {
  return EncodeReply(request_id, ErrorReply{status, boot_id});
}

namespace {

Result<Reply> ReadReply(const wire::Envelope* env) {
  switch (env->body_type()) {
    case wire::Body::Welcome: {
      const wire::Welcome* w = env->body_as_Welcome();
      return Reply(Welcome{w->shard(), w->num_shards(), w->start_clock(), w->lease_ms(),
                           w->recovered_clock(), w->boot_id(), w->max_message_bytes()});
    }
    case wire::Body::TableCreated: {
      const wire::TableCreated* t = env->body_as_TableCreated();
      return Reply(TableCreated{t->table_id(), t->created()});
    }
    case wire::Body::PullReply: {
      const wire::PullReply* p = env->body_as_PullReply();
      LEASH_ASSIGN_OR_RETURN(DType dtype, ReadDType(p->dtype(), "pull reply dtype"));
      return Reply(PullReply{p->table_id(), p->num_rows(), p->cols(), dtype, p->min_clock()});
    }
    case wire::Body::PushReply: {
      const wire::PushReply* p = env->body_as_PushReply();
      return Reply(PushReply{p->applied(), p->skipped_rows()});
    }
    case wire::Body::ClockReply:
      return Reply(ClockReply{env->body_as_ClockReply()->min_clock(),
                              env->body_as_ClockReply()->cluster_samples_per_second()});
    case wire::Body::HeartbeatReply: {
      const wire::HeartbeatReply* h = env->body_as_HeartbeatReply();
      return Reply(HeartbeatReply{h->min_clock(), h->boot_id()});
    }
    case wire::Body::LeaveReply:
      return Reply(LeaveReply{});
    case wire::Body::CheckpointReply:
      return Reply(CheckpointReply{env->body_as_CheckpointReply()->clock()});
    case wire::Body::StatsReply: {
      const wire::StatsReply* r = env->body_as_StatsReply();
      ShardStats o;
      o.shard = r->shard();
      o.num_shards = r->num_shards();
      o.min_clock = r->min_clock();
      o.parked_pulls = r->parked_pulls();
      o.pushes_applied = r->pushes_applied();
      o.pulls_served = r->pulls_served();
      o.errors = r->errors();
      o.last_snapshot_clock = r->last_snapshot_clock();
      o.recovered_clock = r->recovered_clock();
      o.snapshot_age_ms = r->snapshot_age_ms();
      o.memory_budget_bytes = r->memory_budget_bytes();
      o.memory_used_bytes = r->memory_used_bytes();
      o.resident_bytes = r->resident_bytes();
      o.backup_workers = r->backup_workers();
      o.stale_pushes_dropped = r->stale_pushes_dropped();
      o.pushes_summed = r->pushes_summed();
      o.clock_steps = r->clock_steps();
      o.replicas = r->replicas();
      o.replica = r->replica();
      o.term = r->term();
      o.log_index = r->log_index();
      o.replication_lag = r->replication_lag();
      o.replicas_in_sync = r->replicas_in_sync();
      o.commit_index = r->commit_index();
      o.durable_log = r->durable_log() <= wire::DurableLogMode::MAX
                          ? static_cast<DurableLogMode>(r->durable_log())
                          : DurableLogMode::kOff;
      o.durable_log_bytes = r->durable_log_bytes();
      o.durable_log_failed = r->durable_log_failed();
      if (r->backups()) {
        for (const auto* b : *r->backups()) {
          o.backups.push_back({b->replica(), b->in_sync(), b->match_index(), b->entries_behind(),
                               b->bytes_behind(), b->ms_behind(), b->ms_since_ack()});
        }
      }
      o.coverage = CoverageProgress{r->epochs_done(), r->epochs(), r->chunks_done(),
                                    r->num_chunks(), r->chunks_leased()};
      if (r->workers()) {
        for (const auto* w : *r->workers()) {
          o.workers.push_back({w->worker_id(), w->incarnation(), w->name() ? w->name()->str() : "",
                               w->clock(), w->ms_since_heartbeat()});
        }
      }
      if (r->tables()) {
        for (const auto* t : *r->tables()) {
          ShardStats::TableStat ts;
          ts.table_id = t->table_id();
          ts.name = t->name() ? t->name()->str() : "";
          ts.rows = t->rows();
          ts.cols = t->cols();
          ts.local_rows = t->local_rows();
          // An unknown kind from a newer shard shows as sparse rather than failing stats.
          ts.kind = t->kind() == wire::TableKind::Dense ? TableKind::kDense : TableKind::kSparse;
          ts.resident_rows = t->resident_rows();
          ts.memory_bytes = t->memory_bytes();
          ts.tier_hits = t->tier_hits();
          ts.tier_misses = t->tier_misses();
          ts.evictions = t->evictions();
          ts.admissions = t->admissions();
          ts.unadmitted_reads = t->unadmitted_reads();
          ts.dropped_gradients = t->dropped_gradients();
          ts.expired_rows = t->expired_rows();
          o.tables.push_back(std::move(ts));
        }
      }
      return Reply(std::move(o));
    }
    case wire::Body::ChunkGrant: {
      const wire::ChunkGrant* g = env->body_as_ChunkGrant();
      if (static_cast<int>(g->kind()) > static_cast<int>(wire::GrantKind::MAX)) {
        return InvalidArgument("chunk grant of unknown kind " +
                               std::to_string(static_cast<int>(g->kind())));
      }
      ChunkGrant o;
      o.kind = static_cast<ChunkGrant::Kind>(g->kind());
      o.epoch = g->epoch();
      o.chunk = g->chunk();
      o.begin = g->begin();
      o.end = g->end();
      o.epochs_done = g->epochs_done();
      o.chunks_done = g->chunks_done();
      o.num_chunks = g->num_chunks();
      return Reply(o);
    }
    case wire::Body::Error: {
      const wire::Error* e = env->body_as_Error();
      return Reply(ErrorReply{ErrorToStatus(e), e->boot_id()});
    }
    default:
      return InvalidArgument(std::string("a ") + wire::EnumNameBody(env->body_type()) +
                             " message is not a reply");
  }
}

}  // namespace

Result<Decoded<Reply>> DecodeReply(const Message& msg, const WireLimits& limits) {
  LEASH_ASSIGN_OR_RETURN(const wire::Envelope* env, VerifyEnvelope(msg, limits));
  LEASH_ASSIGN_OR_RETURN(Reply r, ReadReply(env));
  return Decoded<Reply>{env->request_id(), std::move(r), std::span<const Frame>(msg).subspan(1)};
}

// ---- request shorthands ---------------------------------------------------------------

Message MakeRegister(uint64_t rid, uint64_t worker_id, uint64_t incarnation,
                     const std::string& name) {
  return EncodeRequest(rid, RegisterRequest{worker_id, incarnation, name});
}

Message MakePull(uint64_t rid, uint32_t table_id, const Rows& rows, uint64_t worker_id,
                 int64_t clock, int64_t staleness, DType dtype) {
  return EncodeRequest(rid, PullRequest{table_id, rows, worker_id, clock, staleness, dtype});
}

Message MakePush(uint64_t rid, uint32_t table_id, const Rows& rows, uint64_t worker_id,
                 uint64_t incarnation, uint64_t seq, DType dtype, Frame payload,
                 PushWeight weight) {
  std::vector<Frame> payloads;
  payloads.push_back(std::move(payload));
  return EncodeRequest(rid,
                       PushRequest{table_id, rows, worker_id, incarnation, seq, dtype, -1,
                                   weight.samples, weight.global_batch, weight.clock_step},
                       std::move(payloads));
}

Message MakeClock(uint64_t rid, uint64_t worker_id, int64_t clock, float samples_per_second) {
  return EncodeRequest(rid, ClockRequest{worker_id, clock, samples_per_second});
}

Message MakeHeartbeat(uint64_t rid, uint64_t worker_id, uint64_t incarnation) {
  return EncodeRequest(rid, HeartbeatRequest{worker_id, incarnation});
}

Message MakeLeave(uint64_t rid, uint64_t worker_id, uint64_t incarnation) {
  return EncodeRequest(rid, LeaveRequest{worker_id, incarnation});
}

Message MakeStats(uint64_t rid) { return EncodeRequest(rid, StatsRequest{}); }

Message MakeChunkRequest(uint64_t rid, uint64_t worker_id, uint64_t incarnation,
                         const DataPlan& plan, const ChunkDone* done) {
  ChunkRequest r;
  r.worker_id = worker_id;
  r.incarnation = incarnation;
  r.plan = plan;
  if (done != nullptr) r.done = *done;
  return EncodeRequest(rid, r);
}

Message MakeCheckpoint(uint64_t rid) { return EncodeRequest(rid, CheckpointRequest{}); }

Message MakeCreateTable(uint64_t rid, const TableSpec& spec) {
  return EncodeRequest(rid, CreateTableRequest{spec});
}

// ---- replication (appended; docs/replication.md) --------------------------------------

namespace {

bool IsReplicationBody(wire::Body b) {
  return b == wire::Body::ReplAppend || b == wire::Body::ReplAck || b == wire::Body::ReplSnapshot;
}

std::string BytesToString(const flatbuffers::Vector<uint8_t>* v) {
  return v == nullptr ? std::string() : std::string(v->begin(), v->end());
}

std::vector<uint8_t> BytesToVector(const flatbuffers::Vector<uint8_t>* v) {
  return v == nullptr ? std::vector<uint8_t>() : std::vector<uint8_t>(v->begin(), v->end());
}

}  // namespace

bool IsReplication(const Message& msg, const WireLimits& limits) {
  if (msg.empty() || IsBatch(msg)) return false;
  auto env = VerifyEnvelope(msg, limits);
  return env.ok() && IsReplicationBody((*env)->body_type());
}

RequestPeek PeekRequest(const Message& msg, const WireLimits& limits) {
  RequestPeek p;
  auto env = VerifyEnvelope(msg, limits);
  if (!env.ok()) return p;
  switch ((*env)->body_type()) {
    case wire::Body::Register:
      p.kind = RequestPeek::kRegister;
      break;
    case wire::Body::CreateTable:
      p.kind = RequestPeek::kCreateTable;
      break;
    case wire::Body::Pull:
      p.kind = RequestPeek::kPull;
      p.table_id = (*env)->body_as_Pull()->table_id();
      break;
    case wire::Body::Push:
      p.kind = RequestPeek::kPush;
      p.table_id = (*env)->body_as_Push()->table_id();
      break;
    case wire::Body::ClockUpdate:
      p.kind = RequestPeek::kClock;
      break;
    case wire::Body::Heartbeat:
      p.kind = RequestPeek::kHeartbeat;
      break;
    case wire::Body::Leave:
      p.kind = RequestPeek::kLeave;
      break;
    case wire::Body::Checkpoint:
      p.kind = RequestPeek::kCheckpoint;
      break;
    case wire::Body::Stats:
      p.kind = RequestPeek::kStats;
      break;
    case wire::Body::ChunkRequest:
      p.kind = RequestPeek::kChunkRequest;
      break;
    case wire::Body::ReplAppend:
    case wire::Body::ReplAck:
    case wire::Body::ReplSnapshot:
      p.kind = RequestPeek::kReplication;
      break;
    default:
      break;
  }
  return p;
}

Result<Decoded<ReplMessage>> DecodeReplication(const Message& msg, const WireLimits& limits) {
  LEASH_ASSIGN_OR_RETURN(const wire::Envelope* env, VerifyEnvelope(msg, limits));
  const size_t payloads = msg.size() - 1;
  std::span<const Frame> rest = std::span<const Frame>(msg).subspan(1);
  switch (env->body_type()) {
    case wire::Body::ReplAppend: {
      const wire::ReplAppend* a = env->body_as_ReplAppend();
      ReplAppendMsg m{a->term(),   a->primary(), a->prev_index(),    a->prev_term(),
                      a->commit(), {},           a->backup_answers()};
      size_t at = 0;
      if (a->entries() != nullptr) {
        m.entries.reserve(a->entries()->size());
        for (const wire::ReplEntry* e : *a->entries()) {
          if (e->kind() > ReplEntryWire::kNoop) {
            return InvalidArgument("replication entry of unknown kind " +
                                   std::to_string(e->kind()));
          }
          ReplEntryWire w;
          w.term = e->term();
          w.index = e->index();
          w.now_ms = e->now_ms();
          w.kind = static_cast<ReplEntryWire::Kind>(e->kind());
          w.peer = BytesToString(e->peer());
          w.worker_id = e->worker_id();
          if (e->frames() > payloads - at) {
            return InvalidArgument("replication append names " + std::to_string(e->frames()) +
                                   " frames for entry " + std::to_string(e->index()) + ", only " +
                                   std::to_string(payloads - at) + " follow");
          }
          w.message.assign(rest.begin() + at, rest.begin() + at + e->frames());
          at += e->frames();
          // Frames read in place where the primary's checking copy wrote them know what it
          // found; frames that came any other way are checked again where they are applied.
          for (size_t f = 0; f < w.message.size() && f < 64; ++f) {
            if ((e->finite_frames() >> f & 1) != 0) w.message[f] = Frame::LentFinite(w.message[f]);
          }
          m.entries.push_back(std::move(w));
        }
      }
      if (at != payloads) {
        return InvalidArgument("replication append carries " + std::to_string(payloads) +
                               " frames, its entries name " + std::to_string(at));
      }
      return Decoded<ReplMessage>{env->request_id(), ReplMessage(std::move(m)), {}};
    }
    case wire::Body::ReplAck: {
      const wire::ReplAck* a = env->body_as_ReplAck();
      if (payloads != 0) return InvalidArgument("a replication ack carries no payload frames");
      ReplAckMsg m{a->term(),           a->replica(), a->ok(),       a->last_index(),
                   a->needs_snapshot(), a->boot_id(), a->transfer(), a->chunk()};
      if (a->answered() != nullptr) m.answered.assign(a->answered()->begin(), a->answered()->end());
      return Decoded<ReplMessage>{env->request_id(), ReplMessage(std::move(m)), {}};
    }
    case wire::Body::ReplSnapshot: {
      const wire::ReplSnapshot* s = env->body_as_ReplSnapshot();
      ReplSnapshotMsg m;
      m.term = s->term();
      m.primary = s->primary();
      m.index = s->index();
      m.index_term = s->index_term();
      m.commit = s->commit();
      m.shard = s->shard();
      m.num_shards = s->num_shards();
      m.min_clock = s->min_clock();
      if (s->workers() != nullptr) {
        for (const wire::ReplWorker* w : *s->workers()) {
          m.workers.push_back({w->worker_id(), w->incarnation(), w->clock(), w->last_seq(),
                               w->name() == nullptr ? std::string() : w->name()->str(),
                               w->staleness(), w->samples_per_second(), w->speed_reported(),
                               w->push_decided_clock(), w->push_dropped()});
        }
      }
      if (s->tables() != nullptr) {
        for (const wire::ReplTable* t : *s->tables()) {
          std::vector<int64_t> pending;
          if (t->pending_clocks() != nullptr) {
            pending.assign(t->pending_clocks()->begin(), t->pending_clocks()->end());
          }
          m.tables.push_back({t->table_id(), BytesToVector(t->spec()), t->row_begin(), t->row_end(),
                              t->cols(), t->slots(), t->optimizer_steps(), t->tier_bytes(),
                              std::move(pending)});
        }
      }
      m.coverage = BytesToVector(s->coverage());
      m.transfer = s->transfer();
      m.chunk = s->chunk();
      m.last = s->last();
      if (s->part() > ReplSnapshotMsg::kRows) {
        return InvalidArgument("replication snapshot chunk of unknown part " +
                               std::to_string(s->part()));
      }
      m.part = static_cast<ReplSnapshotMsg::Part>(s->part());
      m.part_id = s->part_id();
      m.offset = s->offset();
      const size_t frames = m.part == ReplSnapshotMsg::kHeader ? 0 : 1;
      if ((m.chunk == 0) != (m.part == ReplSnapshotMsg::kHeader) || frames != payloads) {
        return InvalidArgument("replication snapshot chunk " + std::to_string(m.chunk) +
                               " of part " + std::to_string(s->part()) + " carries " +
                               std::to_string(payloads) + " payload frames");
      }
      return Decoded<ReplMessage>{env->request_id(), ReplMessage(std::move(m)), rest};
    }
    default:
      return InvalidArgument(std::string("not a replication message: ") +
                             wire::EnumNameBody(env->body_type()));
  }
}

Message EncodeReplication(const ReplMessage& msg, std::vector<Frame> payloads) {
  return std::visit(
      [&](const auto& m) -> Message {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, ReplAppendMsg>) {
          std::vector<Frame> frames;
          for (const ReplEntryWire& e : m.entries)
            frames.insert(frames.end(), e.message.begin(), e.message.end());
          return MakeMessage(
              0,
              [&](flatbuffers::FlatBufferBuilder& fbb)
                  -> std::pair<wire::Body, flatbuffers::Offset<void>> {
                std::vector<flatbuffers::Offset<wire::ReplEntry>> entries;
                entries.reserve(m.entries.size());
                for (const ReplEntryWire& e : m.entries) {
                  auto peer = fbb.CreateVector(reinterpret_cast<const uint8_t*>(e.peer.data()),
                                               e.peer.size());
                  uint64_t finite = 0;
                  for (size_t f = 0; f < e.message.size() && f < 64; ++f)
                    finite |= uint64_t{e.message[f].finite_f32()} << f;
                  entries.push_back(wire::CreateReplEntry(
                      fbb, e.term, e.index, e.now_ms, static_cast<uint8_t>(e.kind), peer,
                      e.worker_id, static_cast<uint32_t>(e.message.size()), finite));
                }
                auto v = fbb.CreateVector(entries);
                return {wire::Body::ReplAppend,
                        wire::CreateReplAppend(fbb, m.term, m.primary, m.prev_index, m.prev_term,
                                               m.commit, v, m.backup_answers)
                            .Union()};
              },
              std::move(frames));
        } else if constexpr (std::is_same_v<T, ReplAckMsg>) {
          return MakeMessage(0,
                             [&](flatbuffers::FlatBufferBuilder& fbb)
                                 -> std::pair<wire::Body, flatbuffers::Offset<void>> {
                               auto answered =
                                   m.answered.empty() ? 0 : fbb.CreateVector(m.answered);
                               return {wire::Body::ReplAck,
                                       wire::CreateReplAck(fbb, m.term, m.replica, m.ok,
                                                           m.last_index, m.needs_snapshot,
                                                           m.boot_id, m.transfer, m.chunk, answered)
                                           .Union()};
                             });
        } else {
          return MakeMessage(
              0,
              [&](flatbuffers::FlatBufferBuilder& fbb)
                  -> std::pair<wire::Body, flatbuffers::Offset<void>> {
                std::vector<flatbuffers::Offset<wire::ReplWorker>> workers;
                for (const auto& w : m.workers) {
                  workers.push_back(wire::CreateReplWorker(
                      fbb, w.worker_id, w.incarnation, w.clock, w.last_seq,
                      fbb.CreateString(w.name), w.staleness, w.samples_per_second, w.speed_reported,
                      w.push_decided_clock, w.push_dropped));
                }
                std::vector<flatbuffers::Offset<wire::ReplTable>> tables;
                for (const auto& t : m.tables) {
                  tables.push_back(wire::CreateReplTable(
                      fbb, t.table_id, fbb.CreateVector(t.spec), t.row_begin, t.row_end, t.cols,
                      t.slots, t.optimizer_steps, t.tier_bytes,
                      t.pending_clocks.empty() ? 0 : fbb.CreateVector(t.pending_clocks)));
                }
                auto wv = fbb.CreateVector(workers);
                auto tv = fbb.CreateVector(tables);
                auto cv = fbb.CreateVector(m.coverage);
                return {wire::Body::ReplSnapshot,
                        wire::CreateReplSnapshot(fbb, m.term, m.primary, m.index, m.index_term,
                                                 m.commit, m.shard, m.num_shards, m.min_clock, wv,
                                                 tv, cv, m.transfer, m.chunk, m.last,
                                                 static_cast<uint8_t>(m.part), m.part_id, m.offset)
                            .Union()};
              },
              std::move(payloads));
        }
      },
      msg);
}

}  // namespace leash

// The codec: Leash messages (schema/leash.fbs) to and from the domain model (domain.h).
// A message is verified and decoded once, here, into a typed Request or Reply; replies
// and requests are encoded from those types. No generated FlatBuffers type appears in
// this header, and FlatBuffers verification failures become Status only in wire.cc.
// Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "leash/common/domain.h"
#include "leash/common/message.h"
#include "leash/common/status.h"

namespace leash {

inline constexpr uint16_t kProtocolVersion = 1;

// Limits a reader enforces on a header before trusting it.
struct WireLimits {
  size_t max_header_bytes = 1 << 20;
  size_t max_keys = size_t{1} << 24;
};

// A decoded message: its request id, its typed body and the payload frames after the
// header (a view into the decoded message, which must outlive it).
template <typename T>
struct Decoded {
  uint64_t request_id = 0;
  T value;
  std::span<const Frame> payloads;
};

// Verifies frame 0 of `msg` as an Envelope of this protocol version holding a request
// and decodes it. InvalidArgument for empty, truncated or garbage bytes, a reply where a
// request belongs, an enum out of range, a missing required field or a misaligned key
// vector; ResourceExhausted for a header over limits.max_header_bytes or more keys than
// limits.max_keys; VersionMismatch for another protocol version. Checks that need a
// table (keys in range, rows owned) are the shard's.
Result<Decoded<Request>> DecodeRequest(const Message& msg, const WireLimits& limits = {});
// The same for a reply (an ErrorReply is a reply like any other).
Result<Decoded<Reply>> DecodeReply(const Message& msg, const WireLimits& limits = {});

// Encodes a request or a reply as a header frame followed by `payloads`.
Message EncodeRequest(uint64_t request_id, const Request& request,
                      std::vector<Frame> payloads = {});
Message EncodeReply(uint64_t request_id, const Reply& reply, std::vector<Frame> payloads = {});

// Request id of a header that may be malformed; 0 when it cannot be read safely.
uint64_t PeekRequestId(const Message& msg);

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

// An error reply (EncodeReply of an ErrorReply).
Message MakeError(uint64_t request_id, const Status& status, uint64_t boot_id = 0);

// Encodes float32 values as a payload frame in `dtype`.
Frame EncodeValues(std::span<const float> values, DType dtype);
// The same into `out`, which holds values.size() * DTypeSize(dtype) bytes.
void EncodeValuesInto(std::span<const float> values, DType dtype, uint8_t* out);
// Decodes a payload frame holding exactly `count` values of `dtype` into `out`.
// InvalidArgument (naming both sizes) if the frame has another size.
Status DecodeValues(const Frame& frame, DType dtype, size_t count, float* out);

// A table spec as the bytes of a serialized TableSpec table (what the snapshot store
// keeps on disk), and back. DecodeTableSpec verifies the bytes: DataLoss if they are
// not a valid spec.
std::vector<uint8_t> EncodeTableSpec(const TableSpec& spec);
Result<TableSpec> DecodeTableSpec(std::span<const uint8_t> bytes);

// Requests, as the client sends them (shorthands of EncodeRequest for tests and tools).
Message MakeRegister(uint64_t rid, uint64_t worker_id, uint64_t incarnation,
                     const std::string& name);
Message MakePull(uint64_t rid, uint32_t table_id, const Rows& rows, uint64_t worker_id,
                 int64_t clock, int64_t staleness, DType dtype = DType::kF32);
// `payload` holds the gradient encoded in `dtype` (see EncodeValues); `weight` its samples
// and the job's global batch (work in proportion to speed; zeros: unweighted).
Message MakePush(uint64_t rid, uint32_t table_id, const Rows& rows, uint64_t worker_id,
                 uint64_t incarnation, uint64_t seq, DType dtype, Frame payload,
                 PushWeight weight = {});
// `samples_per_second` > 0: the worker's measured speed (work in proportion to speed).
Message MakeClock(uint64_t rid, uint64_t worker_id, int64_t clock, float samples_per_second = 0);
Message MakeHeartbeat(uint64_t rid, uint64_t worker_id, uint64_t incarnation);
Message MakeLeave(uint64_t rid, uint64_t worker_id, uint64_t incarnation);
Message MakeStats(uint64_t rid);
Message MakeChunkRequest(uint64_t rid, uint64_t worker_id, uint64_t incarnation,
                         const DataPlan& plan, const ChunkDone* done);
Message MakeCheckpoint(uint64_t rid);
Message MakeCreateTable(uint64_t rid, const TableSpec& spec);

// ---- replication between the replicas of one shard (docs/replication.md) ------------

// One log entry as it travels; `message` is the input (kInput) as the primary received it.
struct ReplEntryWire {
  enum Kind : uint8_t { kInput = 0, kEvict = 1, kExpirySweep = 2, kNoop = 3 };
  uint64_t term = 0;
  uint64_t index = 0;
  int64_t now_ms = 0;
  Kind kind = kInput;
  std::string peer;
  uint64_t worker_id = 0;
  Message message;
};
struct ReplAppendMsg {
  uint64_t term = 0;
  uint32_t primary = 0;
  uint64_t prev_index = 0;
  uint64_t prev_term = 0;
  uint64_t commit = 0;
  std::vector<ReplEntryWire> entries;
  // The backup is the primary's only in-sync one: what it holds is committed, and it answers
  // the pushes and clocks of the workers connected to it (Replica, --backup-answers).
  bool backup_answers = false;
};
struct ReplAckMsg {
  uint64_t term = 0;
  uint32_t replica = 0;
  bool ok = false;
  uint64_t last_index = 0;
  bool needs_snapshot = false;
  uint64_t boot_id = 0;
  uint64_t transfer = 0;  // nonzero: acknowledges chunks of this snapshot transfer
  uint32_t chunk = 0;     // it holds the transfer's chunks before this one
  // Entries (sorted) whose replies to their workers this backup sends itself: the primary
  // drops its own.
  std::vector<uint64_t> answered = {};
};
// One chunk of a shard's state after log entry `index` (schema/leash.fbs, ReplSnapshot):
// chunk 0 holds everything but the tables' contents; every later chunk one payload frame,
// bytes of one array (kBytes) or sparse rows (kRows).
struct ReplSnapshotMsg {
  enum Part : uint8_t { kHeader = 0, kBytes = 1, kRows = 2 };
  struct Worker {
    uint64_t worker_id = 0;
    uint64_t incarnation = 0;
    int64_t clock = 0;
    uint64_t last_seq = 0;
    std::string name;
    int64_t staleness = -1;
    double samples_per_second = 0;
    bool speed_reported = false;
    int64_t push_decided_clock = -1;
    bool push_dropped = false;
  };
  struct Table {
    uint32_t table_id = 0;
    std::vector<uint8_t> spec;  // EncodeTableSpec
    uint64_t row_begin = 0;
    uint64_t row_end = 0;
    uint32_t cols = 0;
    uint32_t slots = 0;
    uint64_t optimizer_steps = 0;
    uint64_t tier_bytes = 0;
    std::vector<int64_t> pending_clocks;  // the last `slots` are these iterations' clock steps
  };
  uint64_t term = 0;
  uint32_t primary = 0;
  uint64_t index = 0;
  uint64_t index_term = 0;
  uint64_t commit = 0;
  uint32_t shard = 0;
  uint32_t num_shards = 0;
  int64_t min_clock = 0;
  std::vector<Worker> workers;
  std::vector<Table> tables;
  std::vector<uint8_t> coverage;
  uint64_t transfer = 0;
  uint32_t chunk = 0;
  bool last = false;
  Part part = kHeader;
  uint32_t part_id = 0;
  uint64_t offset = 0;
};
using ReplMessage = std::variant<ReplAppendMsg, ReplAckMsg, ReplSnapshotMsg>;

// True if `msg` is a well-formed Envelope holding a replication message (the check a
// replica makes before DecodeReplication; a worker's request answers false).
bool IsReplication(const Message& msg, const WireLimits& limits = {});
// Decodes a replication message; its entries' messages and the snapshot's payloads share
// `msg`'s frames. InvalidArgument for anything malformed (frame counts that do not add
// up, a body that is not a replication message).
Result<Decoded<ReplMessage>> DecodeReplication(const Message& msg, const WireLimits& limits = {});
// Encodes one: an append's entries' frames, or `payloads` (a snapshot's floats), follow
// the header.
Message EncodeReplication(const ReplMessage& m, std::vector<Frame> payloads = {});

// What a replica needs to know of a worker's request to decide whether to log it, read
// from a verified header without decoding its keys. kind kOther: not a request (or
// malformed: the shard will say why).
struct RequestPeek {
  enum Kind {
    kOther,
    kRegister,
    kCreateTable,
    kPull,
    kPush,
    kClock,
    kHeartbeat,
    kLeave,
    kCheckpoint,
    kStats,
    kChunkRequest,
    kReplication
  };
  Kind kind = kOther;
  uint32_t table_id = 0;  // kPull, kPush
};
RequestPeek PeekRequest(const Message& msg, const WireLimits& limits = {});

}  // namespace leash

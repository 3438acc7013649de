// libFuzzer target for a shard's request handling (server/src/shard.cc and what it uses:
// clock table, parked pulls, tables and optimizers, data coverage, snapshots). One
// leash::server::Shard with a MemorySnapshotStore and a fake clock gets a sequence of
// messages from four peers, with Tick calls, clock advances and restarts in between;
// after every step the harness checks invariants and aborts (a libFuzzer crash) when
// one breaks. Single-threaded, as libFuzzer calls it.
//
// Input format (read front to back; a value past the end reads as 0, which ends the run):
//   byte 0: configuration: bit 0 non-finite policy (0 reject, 1 skip rows); (byte >> 1) % 3
//           the layout (shard 0 of 1, 0 of 2, 1 of 2); bit 3 disables periodic snapshots.
//   then ops: one byte `op % kNumOps`, followed by its arguments (see Decode*). Request
//   ops build a valid message with the Make* helpers from small argument bytes, so the
//   fuzzer explores protocol states rather than FlatBuffers framing; kMutate flips bytes
//   of the next request's header, and kRaw sends raw bytes, so malformed input is fuzzed
//   too.
//
// Invariants (checked after every step):
//   - every reply verifies as an Envelope, goes to the peer that asked, and answers a
//     request that had no reply yet (at most one reply per request); a structured
//     request gets an Error or the reply of its kind;
//   - every request is answered at once unless it is a parked pull: requests without a
//     reply == Shard::parked_pulls(), which stays <= peers * max_parked_per_peer;
//   - a pull reply reflects a minimum clock >= clock - staleness of its pull, at most the
//     shard's; its payload holds exactly num_rows x cols values of its dtype;
//   - the minimum clock never goes back (within one shard life; a restart resumes at the
//     snapshot's);
//   - table values and optimizer state stay finite (checked on pull replies and every
//     snapshot) as long as every table and gradient came from the bounded generators
//     (finite hyper-parameters in sane ranges, |gradient| <= 1e3): once a mutated or raw
//     message creates a table or applies a push, arbitrary finite floats may overflow;
//   - a restarted shard recovers the snapshot its predecessor wrote, and Tick asks to be
//     called again after a positive delay.
//
// `fuzz_shard --write-seeds=DIR` writes the seed corpus (scripted sessions) and exits;
// FUZZ_SHARD_TRACE=1 fuzz_shard FILE prints every step and reply of one input.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <spdlog/spdlog.h>

#include "fuzz_util.h"
#include "leash/common/wire.h"
#include "leash/server/shard.h"
#include "wire_format.h"

namespace {

using namespace leash;
using namespace leash::server;

enum Op : uint8_t {
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
  kTick,
  kAdvance,
  kRestart,
  kRaw,
  kMutate,
  kNumOps
};

constexpr int kPeers = 4;
constexpr size_t kMaxParkedPerPeer = 8;
constexpr float kLr[] = {0.f, 1e-3f, 0.1f, 1.f};
constexpr float kUnit[] = {0.f, 0.5f, 0.9f, 0.999f};
constexpr float kEps[] = {0.f, 1e-8f, 1e-3f, 1.f};
constexpr float kWd[] = {0.f, 1e-4f, 0.1f, 0.f};
constexpr float kScale[] = {0.f, 0.01f, 1.f, 100.f};
const float kGrad[] = {0.f,
                       1.f,
                       -1.f,
                       0.5f,
                       -0.25f,
                       1e3f,
                       -1e3f,
                       1e-30f,
                       std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity(),
                       0.f};

template <typename T, size_t N>
T Pick(const T (&table)[N], uint8_t b) {
  return table[b % N];
}

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t U16() { return static_cast<uint16_t>(U8() | U8() << 8); }
  uint32_t U32() { return static_cast<uint32_t>(U16()) | static_cast<uint32_t>(U16()) << 16; }
  uint64_t U64() { return static_cast<uint64_t>(U32()) | static_cast<uint64_t>(U32()) << 32; }
  int8_t I8() { return static_cast<int8_t>(U8()); }
  float F32() {
    uint32_t bits = U32();
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// A request the harness sent and has no reply for yet.
struct Pending {
  wire::Body request = wire::Body::NONE;  // NONE for raw or mutated messages
  int64_t pull_need =
      std::numeric_limits<int64_t>::min();  // pulls: min clock the reply must reflect
  bool bounded = true;                      // built by the bounded generators
  uint32_t table_cols = 0;                  // CreateTable: the spec's cols
};

wire::Body ReplyKind(wire::Body request) {
  switch (request) {
    case wire::Body::Register:
      return wire::Body::Welcome;
    case wire::Body::CreateTable:
      return wire::Body::TableCreated;
    case wire::Body::Pull:
      return wire::Body::PullReply;
    case wire::Body::Push:
      return wire::Body::PushReply;
    case wire::Body::ClockUpdate:
      return wire::Body::ClockReply;
    case wire::Body::Heartbeat:
      return wire::Body::HeartbeatReply;
    case wire::Body::Leave:
      return wire::Body::LeaveReply;
    case wire::Body::Checkpoint:
      return wire::Body::CheckpointReply;
    case wire::Body::Stats:
      return wire::Body::StatsReply;
    case wire::Body::ChunkRequest:
      return wire::Body::ChunkGrant;
    default:
      return wire::Body::NONE;
  }
}

bool AllFinite(const std::vector<float>& v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

class Harness {
 public:
  explicit Harness(uint8_t config) {
    options_.nonfinite = (config & 1) ? NonFinitePolicy::kSkipRows : NonFinitePolicy::kReject;
    switch ((config >> 1) % 3) {
      case 0:
        options_.shard = 0, options_.num_shards = 1;
        break;
      case 1:
        options_.shard = 0, options_.num_shards = 2;
        break;
      default:
        options_.shard = 1, options_.num_shards = 2;
        break;
    }
    options_.lease_ms = 1000;
    options_.checkpoint_interval_ms = (config & 8) ? 0 : 3000;
    options_.max_message_bytes = size_t{1} << 18;
    options_.boot_id = 42;
    options_.max_parked_per_peer = kMaxParkedPerPeer;
    options_.max_table_values = 1 << 16;
    options_.limits.max_keys = 64;
    now_ = 1000000;
    shard_ = std::make_unique<Shard>(
        options_, &store_, [this] { return now_; }, &sparse_store_);
    last_min_ = shard_->min_clock();
  }

  void Run(Input& in) {
    for (int steps = 0; !in.done() && steps < 200; ++steps) Step(in);
  }

 private:
  static PeerId Peer(uint8_t b) { return "p" + std::to_string(b % kPeers); }

  Rows DecodeRows(Input& in) {
    uint8_t mode = in.U8();
    Rows r;
    if (mode & 1) {
      r.explicit_keys = true;
      size_t n = in.U8() % 6;
      for (size_t i = 0; i < n; ++i) r.keys.push_back((mode & 2) ? in.U64() : in.U8() % 48);
      if (mode & 4) r.keys.resize(70, r.keys.empty() ? 0 : r.keys[0]);  // past the key limit
    } else if (mode & 2) {
      r.begin = in.U64();
      r.end = in.U64();
    } else {
      r.begin = in.U8() % 48;
      r.end = in.U8() % 48;
    }
    return r;
  }

  void Step(Input& in) {
    uint8_t op = in.U8() % kNumOps;
    if (trace_)
      std::fprintf(stderr, "op %d (min clock %lld, parked %zu)\n", op,
                   static_cast<long long>(shard_->min_clock()), shard_->parked_pulls());
    switch (op) {
      case kTick: {
        std::vector<Outgoing> out;
        int64_t next = shard_->Tick(&out);
        CHECK(next > 0, "Tick asks to be called again after a positive delay");
        Replies(out);
        break;
      }
      case kAdvance:
        now_ += in.U16();
        break;
      case kRestart:
        Restart();
        break;
      case kRaw: {
        PeerId peer = Peer(in.U8());
        size_t frames = 1 + in.U8() % 2;
        Message m;
        for (size_t f = 0; f < frames; ++f) {
          std::vector<uint8_t> bytes(in.U8() | (in.U8() & 1) << 8);
          for (auto& b : bytes) b = in.U8();
          m.push_back(Frame::Own(std::move(bytes)));
        }
        Send(peer, m, Pending{});
        break;
      }
      case kMutate: {
        size_t edits = 1 + in.U8() % 4;
        std::vector<std::pair<uint16_t, uint8_t>> e;
        for (size_t i = 0; i < edits; ++i) e.emplace_back(in.U16(), in.U8());
        PeerId peer;
        Pending p;
        Message m;
        if (!Request(in, in.U8() % kNumOps, &peer, &m, &p)) break;
        std::vector<uint8_t> h(m[0].data(), m[0].data() + m[0].size());
        for (auto [pos, x] : e) h[pos % h.size()] ^= x == 0 ? 1 : x;
        m[0] = Frame::Own(std::move(h));
        Send(peer, m, Pending{});
        break;
      }
      default: {
        PeerId peer;
        Pending p;
        Message m;
        if (Request(in, op, &peer, &m, &p)) Send(peer, m, p);
        break;
      }
    }
    CheckState();
  }

  // Builds the request of `op` from the input; false if `op` is not a request.
  bool Request(Input& in, uint8_t op, PeerId* peer, Message* m, Pending* p) {
    uint64_t rid = ++next_rid_;
    switch (op) {
      case kRegister: {
        *peer = Peer(in.U8());
        uint64_t worker = in.U8() % 4;
        *m = MakeRegister(rid, worker, in.U8() % 3, "w" + std::to_string(worker));
        p->request = wire::Body::Register;
        return true;
      }
      case kCreateTable: {
        *peer = Peer(in.U8());
        TableSpec t;
        t.name = "t" + std::to_string(in.U8() % 4);
        uint8_t mode = in.U8();
        if (mode & 1) {
          t.rows = in.U64();
          t.cols = in.U32();
        } else {
          t.rows = in.U8() % 40;
          t.cols = in.U8() % 6;
        }
        uint8_t kind = in.U8() % 5;
        // Kind 9 is outside the enum: the codec sends it as it is, for the shard to refuse.
        t.optimizer.kind = static_cast<OptimizerKind>(kind == 4 ? 9 : kind);
        if (mode & 2) {  // arbitrary hyper-parameters: no longer the bounded generator
          t.optimizer.lr = in.F32();
          t.optimizer.momentum = in.F32();
          t.optimizer.beta1 = in.F32();
          t.optimizer.beta2 = in.F32();
          t.optimizer.epsilon = in.F32();
          t.optimizer.weight_decay = in.F32();
          t.init.scale = in.F32();
          p->bounded = false;
        } else {
          t.optimizer.lr = Pick(kLr, in.U8());
          t.optimizer.momentum = Pick(kUnit, in.U8());
          t.optimizer.beta1 = Pick(kUnit, in.U8());
          t.optimizer.beta2 = Pick(kUnit, in.U8());
          t.optimizer.epsilon = Pick(kEps, in.U8());
          t.optimizer.weight_decay = Pick(kWd, in.U8());
          t.init.scale = Pick(kScale, in.U8());
        }
        t.init.kind = static_cast<InitKind>(in.U8() % 5);
        t.init.seed = in.U8();
        if (mode & 4) {  // a sparse table: keys instead of rows, admission and expiry
          t.kind = TableKind::kSparse;
          t.rows = (mode & 8) ? in.U8() : 0;  // nonzero rows: refused
          t.sparse.admit_after = in.U8() % 3;
          t.sparse.expire_after_clocks = in.U8() % 4;
        }
        if (trace_) {
          std::fprintf(stderr,
                       "  create %s %llu x %u opt %d lr %g mom %g b1 %g b2 %g eps %g wd %g init %d "
                       "scale %g\n",
                       t.name.c_str(), static_cast<unsigned long long>(t.rows), t.cols,
                       static_cast<int>(t.optimizer.kind), t.optimizer.lr, t.optimizer.momentum,
                       t.optimizer.beta1, t.optimizer.beta2, t.optimizer.epsilon,
                       t.optimizer.weight_decay, static_cast<int>(t.init.kind), t.init.scale);
        }
        *m = MakeCreateTable(rid, t);
        p->request = wire::Body::CreateTable;
        p->table_cols = t.cols;
        return true;
      }
      case kPull: {
        *peer = Peer(in.U8());
        uint64_t worker = in.U8() % 4;
        uint32_t table = in.U8() % 4;
        Rows rows = DecodeRows(in);
        int64_t clock = shard_->min_clock() + in.I8();
        int64_t staleness = in.I8() % 4;
        auto dtype = static_cast<DType>(in.U8() % 4);  // 3 is outside the enum
        *m = MakePull(rid, table, rows, worker, clock, staleness, dtype);
        p->request = wire::Body::Pull;
        p->pull_need = clock - staleness;
        return true;
      }
      case kPush: {
        *peer = Peer(in.U8());
        uint64_t worker = in.U8() % 4;
        uint64_t inc = in.U8() % 3;
        uint32_t table = in.U8() % 4;
        Rows rows = DecodeRows(in);
        uint64_t seq = in.U8();
        auto dtype = static_cast<wire::DType>(in.U8() % 4);
        int64_t clock_after = in.I8() < 0 ? -1 : shard_->min_clock() + in.U8() % 8;
        uint8_t mode = in.U8();
        auto it = cols_.find(table);
        size_t cols = it != cols_.end() ? it->second : in.U8() % 6;
        size_t n = std::min<size_t>(rows.size() * cols, 4096);
        if (mode & 1) n += in.U8() % 3;  // a payload of the wrong size
        std::vector<float> grad(n);
        for (float& g : grad) g = (mode & 2) ? in.F32() : Pick(kGrad, in.U8());
        p->bounded = !(mode & 2);
        // Work in proportion to speed: weighted by samples of a global batch of 64 (a
        // weight byte past 64: refused), summed into a clock step with bit 5.
        uint32_t samples = 0, global_batch = 0;
        if (mode & 16) {
          samples = in.U8() % 80;
          global_batch = 64;
        }
        const bool clock_step = (mode & 32) != 0;
        if (trace_) {
          std::fprintf(stderr, "  push table %u rows %zu grads", table, rows.size());
          for (float g : grad) std::fprintf(stderr, " %g", g);
          std::fprintf(stderr, "\n");
        }
        Frame payload =
            EncodeValues(grad, static_cast<int>(dtype) > 2 ? DType::kF32 : FromWire(dtype));
        std::vector<Frame> frames{std::move(payload)};
        if (mode & 4) frames.clear();
        if (mode & 8) frames.push_back(Frame::Copy("x"));
        *m = MakeMessage(
            rid,
            [&](flatbuffers::FlatBufferBuilder& fbb) {
              auto rs = BuildRows(fbb, rows);
              return std::make_pair(wire::Body::Push,
                                    wire::CreatePush(fbb, table, rs, worker, inc, seq, dtype,
                                                     clock_after, samples, global_batch, clock_step)
                                        .Union());
            },
            std::move(frames));
        p->request = wire::Body::Push;
        return true;
      }
      case kClock: {
        *peer = Peer(in.U8());
        uint64_t worker = in.U8() % 4;
        *m = MakeClock(rid, worker, shard_->min_clock() + in.I8());
        p->request = wire::Body::ClockUpdate;
        return true;
      }
      case kHeartbeat: {
        *peer = Peer(in.U8());
        uint64_t worker = in.U8() % 4;
        *m = MakeHeartbeat(rid, worker, in.U8() % 3);
        p->request = wire::Body::Heartbeat;
        return true;
      }
      case kLeave: {
        *peer = Peer(in.U8());
        uint64_t worker = in.U8() % 4;
        *m = MakeLeave(rid, worker, in.U8() % 3);
        p->request = wire::Body::Leave;
        return true;
      }
      case kCheckpoint:
        *peer = Peer(in.U8());
        *m = MakeCheckpoint(rid);
        p->request = wire::Body::Checkpoint;
        return true;
      case kStats:
        *peer = Peer(in.U8());
        *m = MakeStats(rid);
        p->request = wire::Body::Stats;
        return true;
      case kChunkRequest: {
        *peer = Peer(in.U8());
        uint64_t worker = in.U8() % 4;
        uint64_t inc = in.U8() % 3;
        uint8_t mode = in.U8();
        uint64_t samples = (mode & 1) ? in.U64() : in.U8();
        uint32_t chunk = (mode & 1) ? in.U32() : in.U8() % 16;
        uint32_t epochs = (mode & 1) ? in.U32() : in.U8() % 4;
        // Plans up to kMaxChunks are valid but slow to lease; keep accepted ones small so
        // the fuzzer stays fast (larger ones still test the limit).
        if (chunk > 0 && samples / chunk > (1u << 12) && samples / chunk < ps::kMaxChunks)
          samples = uint64_t{chunk} << 12;
        uint64_t seed = in.U8() % 2;
        ChunkDone done{in.U8() % 4u, in.U8() % 32u};
        *m = MakeChunkRequest(rid, worker, inc, DataPlan{samples, chunk, epochs, seed},
                              (mode & 2) ? &done : nullptr);
        p->request = wire::Body::ChunkRequest;
        return true;
      }
      default:
        return false;
    }
  }

  void Send(const PeerId& peer, const Message& m, Pending p) {
    uint64_t rid = PeekRequestId(m);
    current_ = pending_.emplace(std::make_pair(peer, rid), p);
    std::vector<Outgoing> out;
    shard_->Handle(peer, m, &out);
    Replies(out);
    current_ = pending_.end();
  }

  void Replies(const std::vector<Outgoing>& out) {
    // First pass: which replies come from unbounded input (a mutated or raw message, or
    // arbitrary floats) that changed values; pulls released in the same batch read them.
    for (const Outgoing& o : out) {
      auto env = VerifyEnvelope(o.message);
      CHECK(env.ok(), "every reply verifies as an Envelope");
      auto it = pending_.find({o.peer, (*env)->request_id()});
      CHECK(it != pending_.end(), "a reply answers a request of its peer that had no reply yet");
      const Pending& p = it->second;
      bool unbounded = p.request == wire::Body::NONE || !p.bounded;
      if (auto* pr = (*env)->body_as_PushReply(); pr && pr->applied() && unbounded)
        unbounded_ = true;
      if (auto* tc = (*env)->body_as_TableCreated(); tc && tc->created() && unbounded)
        unbounded_ = true;
    }
    for (const Outgoing& o : out) {
      const wire::Envelope* env = *VerifyEnvelope(o.message);
      // A mutated request id may equal another request's: answer the request of this
      // reply's kind first, then a raw or mutated one, then any.
      auto [first, last] = pending_.equal_range({o.peer, env->request_id()});
      CHECK(first != last, "at most one reply per request");
      auto it = first;
      // An Error answers the message just sent (released pulls are always PullReplies).
      bool found = env->body_type() == wire::Body::Error && current_ != pending_.end() &&
                   current_->first == std::make_pair(o.peer, env->request_id());
      if (found) it = current_;
      for (int pass = 0; pass < 2 && !found; ++pass) {
        for (auto j = first; j != last && !found; ++j) {
          if (pass == 0 ? ReplyKind(j->second.request) == env->body_type()
                        : j->second.request == wire::Body::NONE) {
            it = j;
            found = true;
          }
        }
      }
      Pending p = it->second;
      if (it == current_) current_ = pending_.end();
      pending_.erase(it);
      if (trace_) {
        std::fprintf(stderr, "  -> %s rid %llu: %s%s\n", o.peer.c_str(),
                     static_cast<unsigned long long>(env->request_id()),
                     wire::EnumNameBody(env->body_type()),
                     env->body_as_Error()
                         ? (" " + ErrorToStatus(env->body_as_Error()).ToString()).c_str()
                         : "");
      }
      if (p.request != wire::Body::NONE) {
        CHECK(env->body_type() == wire::Body::Error || env->body_type() == ReplyKind(p.request),
              "a request gets an Error or the reply of its kind");
      }
      CHECK(env->body_type() == wire::Body::PullReply || o.message.size() == 1,
            "only pull replies carry payloads");
      switch (env->body_type()) {
        case wire::Body::Error: {
          CHECK(!ErrorToStatus(env->body_as_Error()).ok(), "an Error reply holds an error");
          CHECK(env->body_as_Error()->boot_id() == options_.boot_id,
                "an Error reply carries the boot id");
          break;
        }
        case wire::Body::PullReply: {
          const wire::PullReply* r = env->body_as_PullReply();
          CHECK(r->min_clock() >= p.pull_need, "a pull is served only within its staleness bound");
          CHECK(r->min_clock() <= shard_->min_clock(),
                "a pull reply reflects no future minimum clock");
          CHECK(o.message.size() == 2, "a pull reply carries one payload frame");
          uint64_t n = r->num_rows() * r->cols();
          CHECK(n <= (1u << 24), "pull replies stay small here");
          std::vector<float> values(n);
          CHECK(DecodeValues(o.message[1], FromWire(r->dtype()), n, values.data()).ok(),
                "a pull reply's payload decodes");
          if (!unbounded_) CHECK(AllFinite(values), "table values stay finite");
          break;
        }
        case wire::Body::TableCreated:
          if (p.request == wire::Body::CreateTable)
            cols_[env->body_as_TableCreated()->table_id()] = p.table_cols;
          break;
        case wire::Body::StatsReply:
          CHECK(env->body_as_StatsReply()->parked_pulls() == shard_->parked_pulls(),
                "stats report the parked pulls");
          break;
        default:
          break;
      }
    }
  }

  void CheckState() {
    CHECK(pending_.size() == shard_->parked_pulls(),
          "every request but a parked pull is answered at once");
    CHECK(shard_->parked_pulls() <= kPeers * kMaxParkedPerPeer,
          "parked pulls are bounded per peer");
    CHECK(shard_->min_clock() >= last_min_, "the minimum clock never goes back");
    last_min_ = shard_->min_clock();
    if (store_.saves() != checked_saves_) {
      checked_saves_ = store_.saves();
      auto snap = store_.Load();
      CHECK(snap.ok() && snap->has_value(), "a saved snapshot loads");
      CHECK((*snap)->min_clock <= shard_->min_clock(),
            "a snapshot's clock is not ahead of the shard");
      if (!unbounded_) {
        for (const auto& t : (*snap)->tables) {
          CHECK(AllFinite(t.values), "table values stay finite");
          for (const auto& s : t.slots) CHECK(AllFinite(s), "optimizer state stays finite");
        }
      }
    }
  }

  void Restart() {
    bool had_snapshot = store_.saves() > 0;
    int64_t snap_clock = had_snapshot ? (*store_.Load())->min_clock : -1;
    shard_ = std::make_unique<Shard>(
        options_, &store_, [this] { return now_; }, &sparse_store_);
    auto r = shard_->Recover();
    CHECK(r.ok(), "a shard recovers the snapshot its predecessor wrote");
    CHECK(*r == snap_clock, "recovery resumes at the snapshot's clock");
    pending_.clear();  // parked pulls died with the old shard; clients resend
    last_min_ = shard_->min_clock();
    if (!had_snapshot) cols_.clear();
  }

  ShardOptions options_;
  MemorySnapshotStore store_;
  MemorySparseStore sparse_store_;  // outlives restarts, like a data directory
  int64_t now_ = 0;
  std::unique_ptr<Shard> shard_;
  std::multimap<std::pair<PeerId, uint64_t>, Pending> pending_;
  decltype(pending_)::iterator current_ = pending_.end();  // the request being handled
  std::map<uint32_t, uint32_t> cols_;  // table id -> cols, from structured CreateTable replies
  uint64_t next_rid_ = 0;
  int64_t last_min_ = 0;
  int checked_saves_ = 0;
  bool unbounded_ = false;
  bool trace_ = std::getenv("FUZZ_SHARD_TRACE") != nullptr;  // prints every step and reply
};

// --- seeds ---------------------------------------------------------------------------

class Script {
 public:
  explicit Script(uint8_t config) { b_.push_back(config); }
  Script& U8(uint8_t v) { return b_.push_back(v), *this; }
  Script& Op(Op op) { return U8(op); }
  Script& Register(int peer, int worker, int inc) {
    return Op(kRegister).U8(peer).U8(worker).U8(inc);
  }
  // rows x cols table named t<name> with optimizer `opt`, lr 0.1, eps 1e-3, init Normal 0.01.
  Script& Create(int peer, int name, int rows, int cols, int opt, int mode = 0) {
    return Op(kCreateTable)
        .U8(peer)
        .U8(name)
        .U8(mode)
        .U8(rows)
        .U8(cols)
        .U8(opt)
        .U8(2)
        .U8(2)
        .U8(2)
        .U8(3)
        .U8(2)
        .U8(1)
        .U8(1)
        .U8(2)
        .U8(7);
  }
  // A sparse table t<name> of `cols`-wide rows (mode 4), then admit_after and expiry clocks.
  Script& CreateSparse(int peer, int name, int cols, int opt, int admit, int expire) {
    return Create(peer, name, 0, cols, opt, /*mode=*/4).U8(admit).U8(expire);
  }
  Script& Range(int b, int e) { return U8(0).U8(b).U8(e); }
  Script& Keys(std::initializer_list<int> keys) {
    U8(1).U8(static_cast<uint8_t>(keys.size()));
    for (int k : keys) U8(k);
    return *this;
  }
  // clock and staleness relative to the shard's minimum clock.
  // Rows (Range or Keys) follow, then PullTail.
  Script& Pull(int peer, int worker, int table) { return Op(kPull).U8(peer).U8(worker).U8(table); }
  Script& PullTail(int clock, int staleness, int dtype) {
    return U8(static_cast<uint8_t>(clock)).U8(static_cast<uint8_t>(staleness)).U8(dtype);
  }
  Script& Push(int peer, int worker, int inc, int table) {
    return Op(kPush).U8(peer).U8(worker).U8(inc).U8(table);
  }
  // seq, dtype, clock_after (-1: none), then one gradient byte per value.
  // `samples` >= 0: weighted by samples of 64 and summed into its iteration's clock step.
  Script& PushTail(int seq, int dtype, int clock_after, std::initializer_list<int> grads,
                   int samples = -1) {
    U8(seq).U8(dtype);
    if (clock_after < 0) {
      U8(0xff);
    } else {
      U8(0).U8(clock_after);
    }
    U8(samples < 0 ? 0 : 16 | 32);  // mode: bounded, right size, weighted and summed or not
    for (int g : grads) U8(g);
    if (samples >= 0) U8(samples);
    return *this;
  }
  Script& Clock(int peer, int worker, int delta) {
    return Op(kClock).U8(peer).U8(worker).U8(static_cast<uint8_t>(delta));
  }
  Script& Heartbeat(int peer, int worker, int inc) {
    return Op(kHeartbeat).U8(peer).U8(worker).U8(inc);
  }
  Script& Leave(int peer, int worker, int inc) { return Op(kLeave).U8(peer).U8(worker).U8(inc); }
  Script& Chunk(int peer, int worker, int inc, bool done, int epoch, int chunk) {
    return Op(kChunkRequest)
        .U8(peer)
        .U8(worker)
        .U8(inc)
        .U8(done ? 2 : 0)
        .U8(50)
        .U8(8)
        .U8(2)
        .U8(1)
        .U8(epoch)
        .U8(chunk);
  }
  Script& Advance(uint16_t ms) { return Op(kAdvance).U8(ms & 0xff).U8(ms >> 8); }
  const std::vector<uint8_t>& bytes() const { return b_; }

 private:
  std::vector<uint8_t> b_;
};

std::vector<std::pair<std::string, Script>> Seeds() {
  std::vector<std::pair<std::string, Script>> s;
  // Two workers under staleness 0: a pull parks until the slower one clocks.
  Script ssp(0);
  ssp.Register(0, 1, 1).Register(1, 2, 1).Create(2, 0, 8, 3, 0);
  ssp.Pull(0, 1, 0).Range(0, 8).PullTail(1, 0, 0);
  ssp.Clock(0, 1, 1).Clock(1, 2, 1);
  ssp.Push(0, 1, 1, 0).Range(0, 2).PushTail(1, 0, -1, {1, 2, 3, 4, 5, 6});
  ssp.Pull(1, 2, 0).Keys({1, 5}).PullTail(0, 0, 1);
  ssp.Op(kStats).U8(3).Op(kCheckpoint).U8(3);
  s.emplace_back("ssp_two_workers", ssp);
  // Every optimizer, pushes of every dtype, NaN gradients under skip-rows.
  Script opt(1);
  opt.Register(0, 1, 1);
  for (int o = 0; o < 4; ++o) {
    opt.Create(3, o, 6, 2, o);
    for (int d = 0; d < 3; ++d)
      opt.Push(0, 1, 1, o).Range(0, 2).PushTail(1 + d, d, -1, {1, 8, 2, 0});
  }
  opt.Op(kCheckpoint).U8(3);
  s.emplace_back("optimizers", opt);
  // Work in proportion to speed with clock steps: two workers' weighted pushes of one
  // iteration summed, a snapshot with the sum pending, a pull parked until both clock (the
  // step), an unweighted push and a refused weight beside them.
  Script steps(0);
  steps.Register(0, 1, 1).Register(1, 2, 1).Create(2, 2, 8, 3, 2);
  steps.Push(0, 1, 1, 0).Range(0, 2).PushTail(1, 0, -1, {1, 2, 3, 4, 5, 6}, 48);
  steps.Op(kCheckpoint).U8(3);
  steps.Pull(0, 1, 0).Range(0, 8).PullTail(1, 0, 0);
  steps.Push(1, 2, 1, 0).Range(0, 2).PushTail(1, 0, 1, {6, 5, 4, 3, 2, 1}, 16);
  steps.Push(1, 2, 1, 0).Range(0, 2).PushTail(2, 0, -1, {1, 1, 1, 1, 1, 1}, 70);
  steps.Clock(0, 1, 1);
  steps.Push(0, 1, 1, 0).Range(0, 2).PushTail(2, 0, -1, {1, 2, 3, 4, 5, 6});
  steps.Op(kStats).U8(3);
  s.emplace_back("clock_steps", steps);
  // A worker dies (lease expires), a parked pull is released by the eviction, a restart.
  Script lease(0);
  lease.Register(0, 1, 1).Register(1, 2, 1).Create(3, 1, 4, 4, 2);
  lease.Clock(0, 1, 3).Pull(0, 1, 0).Range(0, 4).PullTail(3, 0, 2);
  lease.Advance(1500).Heartbeat(0, 1, 1).Op(kTick).Advance(4000).Op(kTick).Op(kRestart);
  lease.Register(0, 1, 2).Heartbeat(0, 1, 2).Leave(0, 1, 2);
  s.emplace_back("lease_and_restart", lease);
  // Data coverage on shard 0: chunks granted, completed, released on leave.
  Script cov(0);
  cov.Register(0, 1, 1).Register(1, 2, 1).Chunk(0, 1, 1, false, 0, 0).Chunk(1, 2, 1, false, 0, 0);
  cov.Chunk(0, 1, 1, true, 0, 0)
      .Leave(1, 2, 1)
      .Chunk(0, 1, 1, true, 0, 1)
      .Op(kRestart)
      .Chunk(0, 1, 1, false, 0, 0);
  s.emplace_back("coverage", cov);
  // Two shards: rows owned by the other shard, and a mutated and a raw message.
  Script two(2);
  two.Register(0, 1, 1).Create(3, 0, 10, 2, 1).Pull(0, 1, 0).Range(0, 10).PullTail(0, 1, 0);
  two.Op(kMutate).U8(0).U8(20).U8(0).U8(0x40).Op(kHeartbeat).U8(0).U8(1).U8(1);
  two.Op(kRaw).U8(1).U8(0).U8(8).U8(0);
  for (char c : std::string("LSH1xxxx")) two.U8(static_cast<uint8_t>(c));
  s.emplace_back("two_shards_malformed", two);
  // Sparse tables beside a dense one: pulls make rows, pushes by key (one duplicated, one
  // as a range: refused), admission after 2 pulls, expiry after 2 clocks, a snapshot and a
  // restart that restores the cold tier's checkpoint.
  Script sparse(1);
  sparse.Register(0, 1, 1).Create(3, 0, 4, 2, 0).CreateSparse(3, 1, 3, 3, 0, 0);
  sparse.CreateSparse(3, 2, 2, 2, 2, 2);
  sparse.Pull(0, 1, 1).Keys({7, 200, 7}).PullTail(0, 0, 0);
  sparse.Push(0, 1, 1, 1).Keys({7, 200}).PushTail(1, 0, -1, {1, 2, 3, 4, 5, 6});
  sparse.Push(0, 1, 1, 1).Keys({7, 200}).PushTail(1, 0, -1, {1, 2, 3, 4, 5, 6});
  sparse.Push(0, 1, 1, 1).Range(0, 2).PushTail(2, 0, -1, {1, 2, 3, 4, 5, 6});
  sparse.Pull(0, 1, 2).Keys({9}).PullTail(0, 0, 1).Pull(0, 1, 2).Keys({9}).PullTail(0, 0, 2);
  sparse.Push(0, 1, 1, 2).Keys({9, 10}).PushTail(3, 1, 2, {1, 2, 3, 4});
  sparse.Op(kCheckpoint).U8(3).Clock(0, 1, 3).Op(kTick).Advance(200).Op(kTick);
  sparse.Op(kRestart).Pull(0, 1, 1).Keys({7, 200}).PullTail(0, 0, 0).Op(kStats).U8(3);
  s.emplace_back("sparse_tables", sparse);
  return s;
}

void WriteSeeds(const std::string& dir) {
  auto seeds = Seeds();
  for (const auto& [name, script] : seeds) {
    std::ofstream f(dir + "/" + name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(script.bytes().data()),
            static_cast<std::streamsize>(script.bytes().size()));
  }
  std::fprintf(stderr, "fuzz_shard: wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  spdlog::set_level(spdlog::level::off);
  leash::fuzz::WriteSeedsIfAsked(*argc, *argv, WriteSeeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Input in(data, size);
  Harness h(in.U8());
  h.Run(in);
  return 0;
}

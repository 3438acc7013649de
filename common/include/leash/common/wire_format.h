// The codec's FlatBuffers layer: envelope verification and raw message building on the
// generated types (schema/leash.fbs). Only the codec (wire.cc), its tests and the
// fuzzers include this header; everything else speaks domain types through wire.h.
// Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "leash/common/message.h"
#include "leash/common/status.h"
#include "leash/common/wire.h"
#include "leash/schema/leash_generated.h"

namespace leash {

// Verifies frame 0 of `msg` as an Envelope of this protocol version with a body.
// InvalidArgument for empty, truncated or garbage bytes; VersionMismatch for another
// protocol version. The returned pointer lives as long as msg[0].
Result<const wire::Envelope*> VerifyEnvelope(const Message& msg, const WireLimits& limits = {});

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
  m.push_back(
      Frame::Wrap(detached->data(), detached->size(), std::shared_ptr<const void>(detached)));
  for (auto& p : payloads) m.push_back(std::move(p));
  return m;
}

// A row set as the codec writes it.
flatbuffers::Offset<wire::RowSet> BuildRows(flatbuffers::FlatBufferBuilder& fbb, const Rows& rows);

// Converts an Error body back to a Status (code and message).
Status ErrorToStatus(const wire::Error* error);
wire::ErrorCode ToWireCode(StatusCode code);
StatusCode FromWireCode(wire::ErrorCode code);

inline wire::DType ToWire(DType dtype) { return static_cast<wire::DType>(dtype); }
inline DType FromWire(wire::DType dtype) { return static_cast<DType>(dtype); }

}  // namespace leash

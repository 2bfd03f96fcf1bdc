// The order a data channel request's payload chunks go in: a large multi-sequence forward's
// group by group, as the server computes them (data_channel.proto, "Groups"), so the server
// starts on group 0 after about a quarter of the payload; anything else in payload order. The
// split must stay the server's (GroupEnds, server/transport/data/group_tracker.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "attnserve/v1/data_channel.pb.h"

namespace attnserve::data_channel {

inline constexpr int64_t kMinGroupedPayloadBytes = int64_t{16} << 20;
inline constexpr int kMaxGroups = 4;

// Each group's end sequence index; empty when the server runs the call whole.
std::vector<int32_t> GroupEnds(const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k,
                               int64_t payload_bytes);

// Every chunk's offset once, in sending order; `grouped` false: payload order.
std::vector<uint64_t> ChunkOrder(const v1::DataRequest& request, bool grouped);

}  // namespace attnserve::data_channel

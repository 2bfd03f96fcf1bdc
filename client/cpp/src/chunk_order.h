// The order a data channel request's payload chunks go in: a large multi-sequence call's
// group by group, as the server computes them (data_channel.proto, "Groups"; the split and
// each group's bytes are common/data_channel_wire.h's, shared with the server), so the server
// starts on group 0 after about a quarter of the payload; anything else in payload order.
#pragma once

#include <cstdint>
#include <vector>

#include "attnserve/v1/data_channel.pb.h"
#include "common/data_channel_wire.h"

namespace attnserve::data_channel {

// Every chunk's offset once, in sending order; `grouped` false: payload order.
std::vector<uint64_t> ChunkOrder(const v1::DataRequest& request, bool grouped);

}  // namespace attnserve::data_channel

#include "client/cpp/src/chunk_order.h"

#include <algorithm>

#include "attnserve/tensor_codec.h"

namespace attnserve::data_channel {
namespace {

int64_t RowBytes(const v1::Tensor& t) {
  int64_t bytes = DTypeItemSize(t.dtype());
  for (int i = 1; i < t.shape_size(); ++i) bytes *= t.shape(i);
  return bytes;
}

int64_t TensorBytes(const v1::Tensor& t) {
  return t.shape_size() > 0 ? RowBytes(t) * t.shape(0) : 0;
}

}  // namespace

std::vector<uint64_t> ChunkOrder(const v1::DataRequest& request, bool grouped) {
  const uint64_t total = static_cast<uint64_t>(request.payload_bytes());
  const uint64_t chunk = static_cast<uint64_t>(request.chunk_bytes());
  const uint64_t count = (total + chunk - 1) / chunk;
  std::vector<uint64_t> order;
  order.reserve(count);
  std::vector<bool> taken(count, false);
  if (grouped) {
    // The tensors that travel, end to end in the payload, and the rows a group needs of each.
    using data_channel_wire::GroupRows;
    std::vector<std::pair<const v1::Tensor*, GroupRows>> fields;
    std::vector<int32_t> cu_q, cu_k;
    if (request.has_forward()) {
      const v1::ForwardRequest& f = request.forward();
      fields = {{&f.q(), GroupRows::kQuery}, {&f.k(), GroupRows::kKey}, {&f.v(), GroupRows::kKey}};
      cu_q.assign(f.cu_seqlens_q().begin(), f.cu_seqlens_q().end());
      cu_k.assign(f.cu_seqlens_k().begin(), f.cu_seqlens_k().end());
    } else if (request.has_backward()) {
      const v1::BackwardRequest& b = request.backward();
      const std::pair<bool, std::pair<const v1::Tensor*, GroupRows>> all[] = {
          {b.has_dout(), {&b.dout(), GroupRows::kQuery}},
          {b.has_q(), {&b.q(), GroupRows::kQuery}},
          {b.has_k(), {&b.k(), GroupRows::kKey}},
          {b.has_v(), {&b.v(), GroupRows::kKey}},
          {b.has_out(), {&b.out(), GroupRows::kQuery}},
          {b.has_lse(), {&b.lse(), GroupRows::kAllWithFirstGroup}}};
      for (const auto& [has, field] : all) {
        if (has) fields.push_back(field);
      }
      cu_q.assign(b.cu_seqlens_q().begin(), b.cu_seqlens_q().end());
      cu_k.assign(b.cu_seqlens_k().begin(), b.cu_seqlens_k().end());
    }
    std::vector<data_channel_wire::PayloadTensor> tensors;
    int64_t offset = 0;
    for (const auto& [tensor, rows] : fields) {
      const int64_t bytes = TensorBytes(*tensor);
      tensors.push_back({offset, bytes, RowBytes(*tensor), rows});
      offset += bytes;
    }
    const std::vector<int32_t> ends =
        data_channel_wire::GroupEnds(cu_q, cu_k, request.payload_bytes());
    for (const data_channel_wire::ByteRanges& group :
         data_channel_wire::GroupRanges(tensors, cu_q, cu_k, ends)) {
      for (const auto& [begin, stop] : group) {
        for (uint64_t c = begin / chunk; c <= (stop - 1) / chunk && c < count; ++c) {
          if (!taken[c]) order.push_back(c * chunk);
          taken[c] = true;
        }
      }
    }
  }
  // Everything not sent with a group (all of an ungrouped call) in payload order.
  for (uint64_t c = 0; c < count; ++c) {
    if (!taken[c]) order.push_back(c * chunk);
  }
  return order;
}

}  // namespace attnserve::data_channel

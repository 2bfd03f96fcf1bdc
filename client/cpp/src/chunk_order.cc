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

}  // namespace

std::vector<uint64_t> ChunkOrder(const v1::DataRequest& request, bool grouped) {
  const uint64_t total = static_cast<uint64_t>(request.payload_bytes());
  const uint64_t chunk = static_cast<uint64_t>(request.chunk_bytes());
  const uint64_t count = (total + chunk - 1) / chunk;
  std::vector<int32_t> ends;
  if (grouped && request.has_forward()) {
    const v1::ForwardRequest& f = request.forward();
    ends = data_channel_wire::GroupEnds({f.cu_seqlens_q().begin(), f.cu_seqlens_q().end()},
                                        {f.cu_seqlens_k().begin(), f.cu_seqlens_k().end()},
                                        request.payload_bytes());
  }
  std::vector<uint64_t> order;
  order.reserve(count);
  std::vector<bool> taken(count, false);
  if (!ends.empty()) {
    const v1::ForwardRequest& f = request.forward();
    const v1::Tensor* tensors[] = {&f.q(), &f.k(), &f.v()};
    const google::protobuf::RepeatedField<int32_t>* cus[] = {&f.cu_seqlens_q(), &f.cu_seqlens_k(),
                                                            &f.cu_seqlens_k()};
    int64_t start[3] = {0, 0, 0};
    start[1] = RowBytes(f.q()) * f.cu_seqlens_q(f.cu_seqlens_q_size() - 1);
    start[2] = start[1] + RowBytes(f.k()) * f.cu_seqlens_k(f.cu_seqlens_k_size() - 1);
    int32_t first = 0;
    for (int32_t end : ends) {
      for (int t = 0; t < 3; ++t) {
        const int64_t row = RowBytes(*tensors[t]);
        const uint64_t begin = start[t] + row * (*cus[t])[first];
        const uint64_t stop = start[t] + row * (*cus[t])[end];
        if (stop <= begin) continue;
        for (uint64_t c = begin / chunk; c <= (stop - 1) / chunk && c < count; ++c) {
          if (!taken[c]) order.push_back(c * chunk);
          taken[c] = true;
        }
      }
      first = end;
    }
  }
  // Everything not sent with a group (all of an ungrouped call) in payload order.
  for (uint64_t c = 0; c < count; ++c) {
    if (!taken[c]) order.push_back(c * chunk);
  }
  return order;
}

}  // namespace attnserve::data_channel

// What the data channel's two ends must compute alike (proto/attnserve/v1/data_channel.proto):
// the 32-byte frame header's byte layout, and how a large call is split into groups of
// sequences and which payload bytes each group needs (the server runs the groups as they
// arrive, clients send them in that order). Header-only
// and free of both sides' types, so the server and the C++ client share one definition.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace attnserve::data_channel_wire {

inline constexpr uint32_t kMagic = 0x31504441;  // "ADP1" in byte order
inline constexpr size_t kHeaderBytes = 32;

// A header's fields as they travel; what each side accepts is its own check.
struct RawHeader {
  uint32_t magic = kMagic;
  uint16_t type = 0;
  uint16_t flags = 0;
  uint64_t request_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

namespace internal {
template <typename T>
void Store(T value, char* out) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}
template <typename T>
T Load(const char* in) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    value |= static_cast<T>(static_cast<unsigned char>(in[i])) << (8 * i);
  }
  return value;
}
}  // namespace internal

// Little-endian: u32 magic, u16 type, u16 flags, u64 request_id, u64 offset, u64 length.
inline void EncodeHeader(const RawHeader& header, char out[kHeaderBytes]) {
  internal::Store<uint32_t>(header.magic, out);
  internal::Store<uint16_t>(header.type, out + 4);
  internal::Store<uint16_t>(header.flags, out + 6);
  internal::Store<uint64_t>(header.request_id, out + 8);
  internal::Store<uint64_t>(header.offset, out + 16);
  internal::Store<uint64_t>(header.length, out + 24);
}

inline RawHeader DecodeHeader(const char bytes[kHeaderBytes]) {
  RawHeader header;
  header.magic = internal::Load<uint32_t>(bytes);
  header.type = internal::Load<uint16_t>(bytes + 4);
  header.flags = internal::Load<uint16_t>(bytes + 6);
  header.request_id = internal::Load<uint64_t>(bytes + 8);
  header.offset = internal::Load<uint64_t>(bytes + 16);
  header.length = internal::Load<uint64_t>(bytes + 24);
  return header;
}

// Calls with smaller payloads, or one sequence, run whole.
inline constexpr int64_t kMinGroupedPayloadBytes = int64_t{16} << 20;
inline constexpr int kMaxGroups = 4;

// Each group's end sequence index (the last is the batch), or empty when the call runs
// whole: up to kMaxGroups runs of consecutive sequences of about equal q + k tokens, the cut
// before group g at the first sequence b (after the previous cut) with
// cu_q[b] + cu_k[b] >= (total_q + total_k) * g / groups.
inline std::vector<int32_t> GroupEnds(const std::vector<int32_t>& cu_q,
                                      const std::vector<int32_t>& cu_k, int64_t payload_bytes) {
  const int32_t batch = static_cast<int32_t>(cu_q.size()) - 1;
  if (payload_bytes < kMinGroupedPayloadBytes || batch < 2 || cu_k.size() != cu_q.size()) {
    return {};
  }
  const int groups = std::min<int>(kMaxGroups, batch);
  const int64_t tokens = int64_t{cu_q[batch]} + cu_k[batch];
  std::vector<int32_t> ends;
  int32_t b = 1;
  for (int g = 1; g < groups; ++g) {
    const int64_t target = tokens * g / groups;
    while (b < batch && int64_t{cu_q[b]} + cu_k[b] < target) ++b;
    if (b < batch && (ends.empty() || b > ends.back())) ends.push_back(b);
  }
  ends.push_back(batch);
  if (ends.size() < 2) return {};
  return ends;
}

// Which rows of a payload tensor a group needs: its query rows (q, out, dout), its key rows
// (k, v), or, for a backward's lse ([heads, total_q]: a group's part is a column of every
// head, so small and spread over the whole tensor), all of it, with the first group.
enum class GroupRows { kQuery, kKey, kAllWithFirstGroup };

struct PayloadTensor {
  int64_t offset = 0;     // where the tensor starts in the payload
  int64_t bytes = 0;      // its size
  int64_t row_bytes = 0;  // one row's bytes (unused for kAllWithFirstGroup)
  GroupRows rows = GroupRows::kQuery;
};

using ByteRanges = std::vector<std::pair<int64_t, int64_t>>;  // [begin, end) payload offsets

// Each group's payload ranges, tensor by tensor in the order given, empty ranges left out. A
// group has arrived when every chunk overlapping its ranges has; clients send the chunks in
// this order, group by group.
inline std::vector<ByteRanges> GroupRanges(const std::vector<PayloadTensor>& tensors,
                                           const std::vector<int32_t>& cu_q,
                                           const std::vector<int32_t>& cu_k,
                                           const std::vector<int32_t>& ends) {
  std::vector<ByteRanges> ranges(ends.size());
  int32_t first = 0;
  for (size_t g = 0; g < ends.size(); ++g) {
    for (const PayloadTensor& t : tensors) {
      int64_t begin = t.offset, end = t.offset;
      if (t.rows == GroupRows::kAllWithFirstGroup) {
        if (g == 0) end += t.bytes;
      } else {
        const std::vector<int32_t>& cu = t.rows == GroupRows::kQuery ? cu_q : cu_k;
        begin += cu[first] * t.row_bytes;
        end += cu[ends[g]] * t.row_bytes;
      }
      if (end > begin) ranges[g].emplace_back(begin, end);
    }
    first = ends[g];
  }
  return ranges;
}

}  // namespace attnserve::data_channel_wire

// Per-architecture hardware limits the kernels size themselves by, for when the code path of an
// older architecture runs on a newer GPU (ExecutionContext::compute_capability): the kernels
// then keep to what that older GPU would give, so tests on one GPU exercise its choices; the
// server's --emulate_compute_capability routes by the same table (server/devices).
#pragma once

namespace attnserve::kernels {

// The opt-in shared memory per block of an architecture (CUDA programming guide, "Compute
// capabilities"), in bytes; 0 where this table does not know it.
inline int SharedMemoryPerBlockOf(int compute_capability) {
  switch (compute_capability) {
    case 70:
    case 72:
      return 96 * 1024;
    case 75:
      return 64 * 1024;
    case 80:
    case 87:
      return 163 * 1024;
    case 86:
    case 89:
    case 120:
      return 99 * 1024;
    case 90:
    case 100:
      return 227 * 1024;
    default:
      return 0;
  }
}

}  // namespace attnserve::kernels

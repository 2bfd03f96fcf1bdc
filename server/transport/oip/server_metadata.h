// What the Open Inference Protocol's server metadata reports, the same on both protocols.
#pragma once

#include <string>
#include <vector>

namespace attnserve::transport::oip {

inline constexpr char kServerName[] = "attnserve";

// The protocol extensions served: binary tensors (REST), statistics, system shared memory,
// and CUDA shared memory in CUDA builds.
inline std::vector<std::string> ServerExtensions() {
  std::vector<std::string> extensions = {"binary_tensor_data", "statistics",
                                         "system_shared_memory"};
#ifdef ATTN_WITH_CUDA
  extensions.push_back("cuda_shared_memory");
#endif
  return extensions;
}

}  // namespace attnserve::transport::oip

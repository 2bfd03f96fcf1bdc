#include "server/transport/server_info.h"

namespace attnserve::transport {

v1::ServerInfo BuildServerInfo(const engine::Engine& engine, const std::string& version,
                               const CallLimits& call_limits) {
  v1::ServerInfo info;
  info.set_version(version);
  const std::vector<std::string> families = engine.KernelFamilies();
  for (const devices::DeviceDescription& device : engine.Devices()) {
    v1::DeviceInfo* out = info.add_devices();
    out->set_name(device.name);
    out->set_model(device.model);
    out->set_compute_capability(device.compute_capability);
    out->set_memory_total_bytes(device.memory_total_bytes);
    out->set_memory_free_bytes(device.memory_free_bytes);
    for (const std::string& family : families) out->add_kernel_families(family);
  }
  for (const std::string& family : families) info.add_kernel_families(family);
  const engine::Limits& limits = engine.limits();
  v1::ServerLimits* out_limits = info.mutable_limits();
  out_limits->set_max_message_bytes(limits.max_message_bytes);
  out_limits->set_max_total_tokens(limits.max_total_tokens);
  out_limits->set_max_head_dim(limits.max_head_dim);
  out_limits->set_max_num_heads(limits.max_num_heads);
  out_limits->set_max_batch(limits.max_batch);
  out_limits->set_max_concurrent_requests(call_limits.max_concurrent_requests);
  if (call_limits.max_deadline != absl::InfiniteDuration()) {
    out_limits->set_max_deadline_seconds(absl::ToInt64Seconds(call_limits.max_deadline));
  }
  for (v1::DType dtype : {v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16, v1::DTYPE_FLOAT32}) {
    info.add_dtypes(dtype);
  }
  return info;
}

}  // namespace attnserve::transport

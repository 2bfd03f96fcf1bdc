#include "server/transport/server_info.h"

#include <climits>

namespace attnserve::transport {
namespace {

v1::DType ProtoDType(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kFloat16:
      return v1::DTYPE_FLOAT16;
    case kernels::DType::kBFloat16:
      return v1::DTYPE_BFLOAT16;
    case kernels::DType::kFloat32:
      return v1::DTYPE_FLOAT32;
  }
  return v1::DTYPE_UNSPECIFIED;
}

void AddRoutes(const std::vector<engine::CoverageRow>& rows, v1::DeviceInfo* device) {
  for (const engine::CoverageRow& row : rows) {
    v1::KernelRoute* route = device->add_routes();
    route->set_family(row.family);
    route->set_direction(engine::DirectionName(row.direction));
    for (kernels::DType dtype : row.dtypes) route->add_dtypes(ProtoDType(dtype));
    route->set_min_head_dim(row.min_head_dim);
    route->set_max_head_dim(row.max_head_dim == INT_MAX ? 0 : row.max_head_dim);
    route->set_head_dim_multiple(row.head_dim_multiple);
    route->set_reason(row.reason);
  }
}

}  // namespace

v1::ServerInfo BuildServerInfo(const engine::Engine& engine, const std::string& version,
                               const CallLimits& call_limits) {
  v1::ServerInfo info;
  info.set_version(version);
  const std::vector<std::string> families = engine.KernelFamilies();
  for (const devices::DeviceDescription& device : engine.Devices()) {
    v1::DeviceInfo* out = info.add_devices();
    out->set_name(device.name);
    out->set_model(device.model);
    out->set_uuid(device.uuid);
    out->set_compute_capability(device.compute_capability);
    out->set_memory_total_bytes(device.memory_total_bytes);
    out->set_memory_free_bytes(device.memory_free_bytes);
    out->set_native_compute_capability(device.native_compute_capability);
    out->set_shared_memory_per_block(device.shared_memory_per_block);
    for (const std::string& family : engine.DeviceKernelFamilies(device.name)) {
      out->add_kernel_families(family);
    }
    AddRoutes(engine.DeviceCoverage(device.name), out);
    const engine::DeviceHealthReport health = engine.DeviceHealth(device.name);
    out->set_out_of_service(!health.healthy);
    out->set_fault(health.fault);
  }
  for (const std::string& family : families) info.add_kernel_families(family);
  const engine::Limits& limits = engine.limits();
  v1::ServerLimits* out_limits = info.mutable_limits();
  out_limits->set_max_message_bytes(limits.max_message_bytes);
  out_limits->set_max_total_tokens(limits.max_total_tokens);
  out_limits->set_max_head_dim(limits.max_head_dim);
  out_limits->set_max_num_heads(limits.max_num_heads);
  out_limits->set_max_batch(limits.max_batch);
  out_limits->set_max_request_compute_seconds(limits.max_request_compute_seconds);
  out_limits->set_max_concurrent_requests(call_limits.max_concurrent_requests);
  if (call_limits.max_deadline != absl::InfiniteDuration()) {
    out_limits->set_max_deadline_seconds(absl::ToInt64Seconds(call_limits.max_deadline));
  }
  const engine::ContextLimits contexts = engine.context_limits();
  out_limits->set_context_memory_bytes(contexts.memory_bytes);
  out_limits->set_context_ttl_seconds(absl::ToInt64Seconds(contexts.ttl));
  if (const CallLimits::DataChannel& data = call_limits.data_channel; data.port != 0) {
    v1::DataChannelInfo* channel = info.mutable_data_channel();
    channel->set_port(data.port);
    channel->set_protocol_version(1);
    channel->set_max_chunk_bytes(data.max_chunk_bytes);
    channel->set_max_connections_per_session(data.max_connections_per_session);
    channel->set_tls(data.tls);
  }
  for (v1::DType dtype : {v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16, v1::DTYPE_FLOAT32}) {
    info.add_dtypes(dtype);
  }
  return info;
}

}  // namespace attnserve::transport

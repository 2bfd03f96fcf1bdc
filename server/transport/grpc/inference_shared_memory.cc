// InferenceServiceImpl's shared-memory RPCs (Triton's extensions): register, status and
// unregister system and CUDA shared memory (the engine opens a CUDA region's IPC handle on its
// device; servers without that CUDA device answer FAILED_PRECONDITION).
#include "absl/strings/str_cat.h"
#include "server/transport/grpc/attention_service.h"
#include "server/transport/grpc/call_auth.h"
#include "server/transport/grpc/inference_service.h"

namespace attnserve::transport {

grpc::ServerUnaryReactor* InferenceServiceImpl::SystemSharedMemoryStatus(
    grpc::CallbackServerContext* context,
    const inference::SystemSharedMemoryStatusRequest* request,
    inference::SystemSharedMemoryStatusResponse* response) {
  return Unary(context, "SystemSharedMemoryStatus", options_.auth, [&]() -> absl::Status {
    auto regions = dispatcher_->shared_memory().Status(CallPrincipal(options_.auth, *context),
                                                       oip::RegionKind::kSystem, request->name());
    if (!regions.ok()) return regions.status();
    for (const auto& region : *regions) {
      auto& status = (*response->mutable_regions())[region->name()];
      status.set_name(region->name());
      status.set_key(region->key());
      status.set_offset(region->offset());
      status.set_byte_size(region->byte_size());
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* InferenceServiceImpl::SystemSharedMemoryRegister(
    grpc::CallbackServerContext* context,
    const inference::SystemSharedMemoryRegisterRequest* request,
    inference::SystemSharedMemoryRegisterResponse*) {
  return Unary(context, "SystemSharedMemoryRegister", options_.auth, [&]() -> absl::Status {
    return dispatcher_->shared_memory().RegisterSystem(CallPrincipal(options_.auth, *context),
                                                       request->name(), request->key(),
                                                       request->offset(), request->byte_size());
  });
}

grpc::ServerUnaryReactor* InferenceServiceImpl::SystemSharedMemoryUnregister(
    grpc::CallbackServerContext* context,
    const inference::SystemSharedMemoryUnregisterRequest* request,
    inference::SystemSharedMemoryUnregisterResponse*) {
  return Unary(context, "SystemSharedMemoryUnregister", options_.auth, [&]() -> absl::Status {
    return dispatcher_->shared_memory().Unregister(CallPrincipal(options_.auth, *context),
                                                   oip::RegionKind::kSystem, request->name());
  });
}

grpc::ServerUnaryReactor* InferenceServiceImpl::CudaSharedMemoryStatus(
    grpc::CallbackServerContext* context, const inference::CudaSharedMemoryStatusRequest* request,
    inference::CudaSharedMemoryStatusResponse* response) {
  return Unary(context, "CudaSharedMemoryStatus", options_.auth, [&]() -> absl::Status {
    auto regions = dispatcher_->shared_memory().Status(CallPrincipal(options_.auth, *context),
                                                       oip::RegionKind::kCuda, request->name());
    if (!regions.ok()) return regions.status();
    for (const auto& region : *regions) {
      auto& status = (*response->mutable_regions())[region->name()];
      status.set_name(region->name());
      status.set_device_id(static_cast<uint64_t>(region->device()));
      status.set_byte_size(region->byte_size());
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* InferenceServiceImpl::CudaSharedMemoryRegister(
    grpc::CallbackServerContext* context, const inference::CudaSharedMemoryRegisterRequest* request,
    inference::CudaSharedMemoryRegisterResponse*) {
  return Unary(context, "CudaSharedMemoryRegister", options_.auth, [&]() -> absl::Status {
    if (request->device_id() > static_cast<int64_t>(INT32_MAX) || request->device_id() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("device_id: not a CUDA ordinal (", request->device_id(), ")"));
    }
    return dispatcher_->shared_memory().RegisterCuda(
        CallPrincipal(options_.auth, *context), request->name(), [&] {
          return dispatcher_->engine().OpenForeignDeviceMemory(
              static_cast<int>(request->device_id()), request->raw_handle(),
              request->byte_size());
        });
  });
}

grpc::ServerUnaryReactor* InferenceServiceImpl::CudaSharedMemoryUnregister(
    grpc::CallbackServerContext* context,
    const inference::CudaSharedMemoryUnregisterRequest* request,
    inference::CudaSharedMemoryUnregisterResponse*) {
  return Unary(context, "CudaSharedMemoryUnregister", options_.auth, [&]() -> absl::Status {
    return dispatcher_->shared_memory().Unregister(CallPrincipal(options_.auth, *context),
                                                   oip::RegionKind::kCuda, request->name());
  });
}

}  // namespace attnserve::transport

// InferenceServiceImpl's shared-memory RPCs (Triton's extensions): register, status and
// unregister system shared memory; CUDA shared memory answers UNAVAILABLE in builds without it.
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
                                                       request->name());
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
    return dispatcher_->shared_memory().Register(CallPrincipal(options_.auth, *context),
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
                                                   request->name());
  });
}

namespace {
absl::Status NoCudaSharedMemory() {
  return absl::UnavailableError("CUDA shared memory is not available on this server");
}
}  // namespace

grpc::ServerUnaryReactor* InferenceServiceImpl::CudaSharedMemoryStatus(
    grpc::CallbackServerContext* context, const inference::CudaSharedMemoryStatusRequest*,
    inference::CudaSharedMemoryStatusResponse*) {
  return Unary(context, "CudaSharedMemoryStatus", options_.auth, NoCudaSharedMemory);
}

grpc::ServerUnaryReactor* InferenceServiceImpl::CudaSharedMemoryRegister(
    grpc::CallbackServerContext* context, const inference::CudaSharedMemoryRegisterRequest*,
    inference::CudaSharedMemoryRegisterResponse*) {
  return Unary(context, "CudaSharedMemoryRegister", options_.auth, NoCudaSharedMemory);
}

grpc::ServerUnaryReactor* InferenceServiceImpl::CudaSharedMemoryUnregister(
    grpc::CallbackServerContext* context, const inference::CudaSharedMemoryUnregisterRequest*,
    inference::CudaSharedMemoryUnregisterResponse*) {
  return Unary(context, "CudaSharedMemoryUnregister", options_.auth, NoCudaSharedMemory);
}

}  // namespace attnserve::transport

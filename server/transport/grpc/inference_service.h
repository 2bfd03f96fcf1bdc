// The Open Inference Protocol's gRPC service (inference.GRPCInferenceService) on the gRPC
// port, beside AttentionService: health, metadata, statistics, Triton's system shared memory
// extension, and ModelInfer for the two models, which runs on the same engine through the
// InferDispatcher. Authentication, the max_concurrent_requests slots, deadlines, the answer
// send timeout and the request metrics are as for Forward and Backward.
#pragma once

#include <functional>
#include <string>

#include "absl/functional/function_ref.h"
#include "inference/grpc_service.grpc.pb.h"
#include "server/metrics/server_metrics.h"
#include "server/transport/auth/authenticator.h"
#include "server/transport/call_limits.h"
#include "server/transport/call_slots.h"
#include "server/transport/oip/infer_dispatcher.h"

namespace attnserve::transport {

struct InferenceServiceOptions {
  std::string version;
  CallLimits limits;
  // Null: none needed. `health_auth` guards ServerLive, ServerReady and ModelReady (probes
  // usually carry no token), `auth` everything else.
  const Authenticator* auth = nullptr;
  const Authenticator* health_auth = nullptr;
  std::function<bool()> is_ready;  // unset: always ready
};

class InferenceServiceImpl final : public inference::GRPCInferenceService::CallbackService {
 public:
  // `dispatcher`, `metrics` and `slots` must outlive the service.
  InferenceServiceImpl(oip::InferDispatcher* dispatcher, metrics::ServerMetrics* metrics,
                       CallSlots* slots, InferenceServiceOptions options);

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context,
                                       const inference::ServerLiveRequest* request,
                                       inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context,
                                        const inference::ServerReadyRequest* request,
                                        inference::ServerReadyResponse* response) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context,
                                           const inference::ServerMetadataRequest* request,
                                           inference::ServerMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) override;
  grpc::ServerUnaryReactor* ModelStatistics(
      grpc::CallbackServerContext* context, const inference::ModelStatisticsRequest* request,
      inference::ModelStatisticsResponse* response) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryStatus(
      grpc::CallbackServerContext* context,
      const inference::SystemSharedMemoryStatusRequest* request,
      inference::SystemSharedMemoryStatusResponse* response) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryRegister(
      grpc::CallbackServerContext* context,
      const inference::SystemSharedMemoryRegisterRequest* request,
      inference::SystemSharedMemoryRegisterResponse* response) override;
  grpc::ServerUnaryReactor* SystemSharedMemoryUnregister(
      grpc::CallbackServerContext* context,
      const inference::SystemSharedMemoryUnregisterRequest* request,
      inference::SystemSharedMemoryUnregisterResponse* response) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryStatus(
      grpc::CallbackServerContext* context, const inference::CudaSharedMemoryStatusRequest*,
      inference::CudaSharedMemoryStatusResponse*) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryRegister(
      grpc::CallbackServerContext* context, const inference::CudaSharedMemoryRegisterRequest*,
      inference::CudaSharedMemoryRegisterResponse*) override;
  grpc::ServerUnaryReactor* CudaSharedMemoryUnregister(
      grpc::CallbackServerContext* context, const inference::CudaSharedMemoryUnregisterRequest*,
      inference::CudaSharedMemoryUnregisterResponse*) override;

 private:
  // Authenticates with `auth`, runs `body` when accepted, records and finishes the call.
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context, const char* rpc,
                                  const Authenticator* auth,
                                  absl::FunctionRef<absl::Status()> body);

  oip::InferDispatcher* const dispatcher_;
  metrics::ServerMetrics* const metrics_;
  CallSlots* const slots_;
  const InferenceServiceOptions options_;
};

}  // namespace attnserve::transport

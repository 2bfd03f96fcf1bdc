// attnserve::Client: a thin C++ client of the AttentionService. Messages are the wire's own
// (attnserve/v1/attention.pb.h); tensor_codec.h builds and reads their tensors.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention.grpc.pb.h"

namespace attnserve {

struct ClientOptions {
  // Largest message sent or received; attention tensors are large.
  int max_message_bytes = 1 << 30;
  // Per-call deadline; none by default.
  std::optional<std::chrono::milliseconds> timeout;
};

class Client {
 public:
  // `target` is a gRPC target such as "localhost:8001" or "dns:///attnserve:8001".
  static absl::StatusOr<std::unique_ptr<Client>> Create(const std::string& target,
                                                        const ClientOptions& options = {});

  absl::StatusOr<v1::ForwardResponse> Forward(const v1::ForwardRequest& request);
  absl::StatusOr<v1::BackwardResponse> Backward(const v1::BackwardRequest& request);
  absl::StatusOr<v1::ServerInfo> GetServerInfo();

 private:
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options);
  void PrepareContext(grpc::ClientContext& context) const;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
  ClientOptions options_;
};

}  // namespace attnserve

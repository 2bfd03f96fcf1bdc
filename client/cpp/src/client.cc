#include "attnserve/client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"

namespace attnserve {
namespace {

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const std::string& target,
                                                        const ClientOptions& options) {
  if (target.empty()) return absl::InvalidArgumentError("target must not be empty");
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create a channel to ", target));
  }
  return std::unique_ptr<Client>(new Client(std::move(channel), options));
}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : channel_(std::move(channel)),
      stub_(v1::AttentionService::NewStub(channel_)),
      options_(std::move(options)) {}

void Client::PrepareContext(grpc::ClientContext& context) const {
  if (options_.timeout) context.set_deadline(std::chrono::system_clock::now() + *options_.timeout);
}

absl::StatusOr<v1::ForwardResponse> Client::Forward(const v1::ForwardRequest& request) {
  grpc::ClientContext context;
  PrepareContext(context);
  v1::ForwardResponse response;
  if (absl::Status s = FromGrpc(stub_->Forward(&context, request, &response)); !s.ok()) return s;
  return response;
}

absl::StatusOr<v1::BackwardResponse> Client::Backward(const v1::BackwardRequest& request) {
  grpc::ClientContext context;
  PrepareContext(context);
  v1::BackwardResponse response;
  if (absl::Status s = FromGrpc(stub_->Backward(&context, request, &response)); !s.ok()) return s;
  return response;
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo() {
  grpc::ClientContext context;
  PrepareContext(context);
  v1::ServerInfo info;
  if (absl::Status s = FromGrpc(stub_->GetServerInfo(&context, {}, &info)); !s.ok()) return s;
  return info;
}

}  // namespace attnserve

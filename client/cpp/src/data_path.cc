#include "client/cpp/src/data_path.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "attnserve/tensor_codec.h"
#include "client/cpp/src/data_channel_choice.h"

namespace attnserve::internal {
namespace {

// A tensor the data channel can send: a known dtype, non-negative dimensions and exactly the
// bytes they need.
bool Sendable(const v1::Tensor& tensor) {
  int64_t elements = 1;
  for (int64_t d : tensor.shape()) {
    if (d < 0) return false;
    elements *= d;
  }
  const int64_t item = DTypeItemSize(tensor.dtype());
  return item > 0 && static_cast<int64_t>(tensor.data().size()) == elements * item;
}

bool ThreeDimensional(const v1::Tensor& tensor) { return tensor.shape_size() == 3; }

}  // namespace

DataPath::DataPath(std::string target, const ClientOptions& options, FetchInfo fetch_info)
    : target_(std::move(target)), options_(options), fetch_info_(std::move(fetch_info)) {
  if (options_.transport == Transport::kGrpc) state_ = State::kGrpc;
}

absl::Status DataPath::Decide() {
  absl::StatusOr<v1::ServerInfo> info = fetch_info_();
  if (!info.ok()) {
    const absl::StatusCode code = info.status().code();
    // The call itself would be refused the same way.
    if (code == absl::StatusCode::kUnauthenticated || code == absl::StatusCode::kPermissionDenied) {
      return info.status();
    }
    if (options_.transport == Transport::kDataChannel) {
      return absl::Status(code, absl::StrCat("transport=data: cannot ask the server for its data "
                                             "channel (GetServerInfo): ",
                                             info.status().message()));
    }
    // A server without GetServerInfo has no data channel either; any other failure (not up
    // yet, say) leaves the choice to a later call, and this one goes over gRPC.
    if (code == absl::StatusCode::kUnimplemented) state_ = State::kGrpc;
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<DataChannelOptions>> chosen = data_channel::ChooseDataChannel(
      options_.transport, target_, *info, options_.tls);
  if (!chosen.ok()) return chosen.status();
  if (!chosen->has_value()) {
    state_ = State::kGrpc;
    return absl::OkStatus();
  }
  endpoint_ = **chosen;
  const int advertised = info->data_channel().max_connections_per_session();
  endpoint_.connections = std::max(1, advertised > 0 ? std::min(options_.data_connections, advertised)
                                                     : options_.data_connections);
  endpoint_.chunk_bytes = options_.data_chunk_bytes;
  endpoint_.bearer_token = options_.bearer_token;
  endpoint_.timeout = options_.timeout ? absl::FromChrono(*options_.timeout)
                                       : absl::InfiniteDuration();
  replica_address_ = info->address();
  state_ = State::kData;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<DataChannelClient>> DataPath::Session() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == State::kUndecided) {
    if (absl::Status s = Decide(); !s.ok()) return s;
  }
  if (state_ != State::kData) return nullptr;
  if (session_ == nullptr) {
    absl::StatusOr<std::unique_ptr<DataChannelClient>> opened = DataChannelClient::Open(endpoint_);
    if (!opened.ok()) {
      if (options_.transport == Transport::kAuto) {
        state_ = State::kGrpc;
        replica_address_.clear();
        return nullptr;
      }
      return absl::Status(opened.status().code(),
                          absl::StrCat("cannot open the data channel at ", endpoint_.host, ":",
                                       endpoint_.port, ": ", opened.status().message()));
    }
    session_ = *std::move(opened);
  }
  return session_;
}

bool DataPath::Dropped(const std::shared_ptr<DataChannelClient>& session) {
  if (session->broken().ok()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (session_ == session) session_ = nullptr;
  return true;
}

bool DataPath::GrpcForGood() {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == State::kGrpc;
}

std::string DataPath::replica_address() {
  std::lock_guard<std::mutex> lock(mu_);
  return replica_address_;
}

bool FitsDataChannel(const v1::ForwardRequest& request) {
  return ThreeDimensional(request.q()) && Sendable(request.q()) && Sendable(request.k()) &&
         Sendable(request.v());
}

bool FitsDataChannel(const v1::BackwardRequest& request) {
  if (!ThreeDimensional(request.dout()) || !Sendable(request.dout())) return false;
  if (!request.has_k() || !request.has_v()) return false;  // dk and dv cannot be sized
  if (!ThreeDimensional(request.k()) || !ThreeDimensional(request.v())) return false;
  for (const v1::Tensor* t : {&request.q(), &request.k(), &request.v(), &request.out(),
                              &request.lse()}) {
    if (!Sendable(*t)) return false;
  }
  return true;
}

bool FitsDataChannel(const v1::BackwardRequest& request, const std::vector<int64_t>& k_shape) {
  return k_shape.size() == 3 && ThreeDimensional(request.dout()) && Sendable(request.dout());
}

}  // namespace attnserve::internal

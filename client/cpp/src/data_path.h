// The data channel of one attnserve::Client: whether its calls take it (ClientOptions::
// transport and the server's ServerInfo.data_channel, decided on the first call and kept),
// its session, and which requests it can carry.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "attnserve/client.h"
#include "attnserve/data_channel_client.h"
#include "attnserve/v1/attention.pb.h"

namespace attnserve::internal {

class DataPath {
 public:
  using FetchInfo = std::function<absl::StatusOr<v1::ServerInfo>()>;
  // `fetch_info` asks the target for its ServerInfo (the Client's GetServerInfo).
  DataPath(std::string target, const ClientOptions& options, FetchInfo fetch_info);

  // The session a call takes; null: the call goes over gRPC. Decides first (and opens the
  // session) when no call has. An error fails the call: a server that refuses this client
  // (UNAUTHENTICATED, PERMISSION_DENIED), and with Transport::kDataChannel a data channel that
  // is not offered (FAILED_PRECONDITION) or cannot be reached (UNAVAILABLE). With kAuto, a
  // server that cannot be asked leaves the choice to the next call; a data channel that
  // cannot be opened means gRPC from then on.
  absl::StatusOr<std::shared_ptr<DataChannelClient>> Session();
  // After a call on `session` failed: whether the session itself broke (a lost connection, a
  // restarted server). It is then dropped, the next Session() opens a new one, and the call
  // may be repeated (calls are pure functions of their requests).
  bool Dropped(const std::shared_ptr<DataChannelClient>& session);
  // Whether every call goes over gRPC from now on (kGrpc, or kAuto decided so).
  bool GrpcForGood();
  // The gRPC address the data channel's replica advertises (ServerInfo.address); empty when
  // calls go over gRPC or it advertises none.
  std::string replica_address();

 private:
  enum class State { kUndecided, kGrpc, kData };
  // Asks the server and chooses (mu_ held).
  absl::Status Decide();

  const std::string target_;
  const ClientOptions options_;
  const FetchInfo fetch_info_;
  std::mutex mu_;  // held while deciding and opening, so concurrent first calls wait for it
  State state_ = State::kUndecided;
  DataChannelOptions endpoint_;
  std::string replica_address_;
  std::shared_ptr<DataChannelClient> session_;
};

// Whether the data channel can carry `request`: every tensor it sends has a dtype and bytes
// that agree with its shape, and q (a full backward's k and v too) is 3-dimensional, so the
// answer can be sized before it comes. Others go over gRPC, whose error names the field.
bool FitsDataChannel(const v1::ForwardRequest& request);
bool FitsDataChannel(const v1::BackwardRequest& request);
// A backward on a saved context (dout only), with the forward's k shape.
bool FitsDataChannel(const v1::BackwardRequest& request, const std::vector<int64_t>& k_shape);

}  // namespace attnserve::internal

// Whether an attnserve::Client's Forward and Backward go through shared memory
// (ClientOptions::shared_memory, the target's host, and the server's answer to a first
// registration, decided on the first call), and the calls that do.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "attnserve/client.h"
#include "client/cpp/src/shared_memory_path.h"

namespace attnserve::internal {

class SharedMemoryRoute {
 public:
  SharedMemoryRoute(const std::string& target, SharedMemory mode,
                    std::shared_ptr<grpc::Channel> channel, SharedMemoryPath::Prepare prepare);

  // The call through shared memory, or nullopt when it goes another way (kAuto: off, the
  // target remote, the server refusing; requests FitsDataChannel refuses; backwards on a
  // context). With kOn an answer always, FAILED_PRECONDITION saying why it cannot go.
  std::optional<absl::StatusOr<v1::ForwardResponse>> Forward(const v1::ForwardRequest& request);
  std::optional<absl::StatusOr<v1::BackwardResponse>> Backward(const v1::BackwardRequest& request);

  // Whether calls go through shared memory now (deciding first): for ActiveTransport. With
  // kOn, the reason they cannot as an error.
  absl::StatusOr<bool> Active();
  // Whether no call will ever go through shared memory (kOff, or kAuto decided so).
  bool OffForGood();

 private:
  // The path when calls take it now, deciding first; null: another way (kAuto only). An
  // error: the caller refused (as the call would be), or kOn's reason.
  absl::StatusOr<std::shared_ptr<SharedMemoryPath>> Path();
  // After a call found shared memory unavailable: nullopt (another way) or kOn's error; turns
  // shared memory off for good when `why` is permanent.
  template <typename Response>
  std::optional<absl::StatusOr<Response>> Unavailable(const ShmUnavailable& why);
  template <typename Response, typename Request>
  std::optional<absl::StatusOr<Response>> Run(
      const Request& request,
      ShmOutcome<Response> (SharedMemoryPath::*call)(const Request&));

  const std::string target_;
  const SharedMemory mode_;
  const std::shared_ptr<grpc::Channel> channel_;
  const SharedMemoryPath::Prepare prepare_;
  std::mutex mu_;  // held while deciding, so concurrent first calls wait for it
  bool decided_ = false;
  absl::Status refusal_;  // why calls cannot go (decided_ without path_)
  std::shared_ptr<SharedMemoryPath> path_;
};

}  // namespace attnserve::internal

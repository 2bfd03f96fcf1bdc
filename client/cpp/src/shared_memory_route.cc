#include "client/cpp/src/shared_memory_route.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cpp/src/data_channel_choice.h"
#include "client/cpp/src/data_path.h"
#include "client/cpp/src/this_host.h"

namespace attnserve::internal {
namespace {

// kOn's error for `why`: FAILED_PRECONDITION when no later call can go either, else the code
// the server gave (its region limit, a server out of reach), saying it was shared memory.
absl::Status Insisted(const ShmUnavailable& why) {
  const absl::StatusCode code =
      why.permanent ? absl::StatusCode::kFailedPrecondition : why.status.code();
  return absl::Status(code, absl::StrCat("shared_memory=on: ", why.status.message()));
}

}  // namespace

SharedMemoryRoute::SharedMemoryRoute(const std::string& target, SharedMemory mode,
                                     std::shared_ptr<grpc::Channel> channel,
                                     SharedMemoryPath::Prepare prepare)
    : target_(target),
      mode_(mode),
      channel_(std::move(channel)),
      prepare_(std::move(prepare)),
      decided_(mode == SharedMemory::kOff) {}

absl::StatusOr<std::shared_ptr<SharedMemoryPath>> SharedMemoryRoute::Path() {
  std::lock_guard<std::mutex> lock(mu_);
  if (decided_) {
    if (path_ != nullptr || mode_ != SharedMemory::kOn) return path_;
    return refusal_;
  }
  const std::optional<std::string> host = data_channel::TargetHost(target_);
  // The server maps this memory as it lies, so byte order must be the server's (Linux on
  // x86-64 or arm64: little-endian).
  if (!host || !IsThisHost(*host) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__) {
    decided_ = true;
    refusal_ = Insisted(
        {absl::FailedPreconditionError(absl::StrCat(
             "the target \"", target_, "\" is not this host (shared memory needs a server on "
             "this machine: a loopback address, \"localhost\" or this host's name)")),
         true});
    if (mode_ == SharedMemory::kOn) return refusal_;
    return nullptr;
  }
  auto path = std::make_shared<SharedMemoryPath>(channel_, prepare_);
  ShmOutcome<bool> registered = path->EnsureRegistered();
  if (registered.answer) {
    // A refusal of the caller (UNAUTHENTICATED, PERMISSION_DENIED) is the call's answer too;
    // the next call asks again.
    if (!registered.answer->ok()) return registered.answer->status();
    decided_ = true;
    path_ = std::move(path);
    return path_;
  }
  const ShmUnavailable& why = registered.unavailable;
  if (why.permanent) {
    decided_ = true;
    refusal_ = Insisted(why);
  }
  // Else the next call asks again (the server's region limit, /dev/shm full for now).
  if (mode_ == SharedMemory::kOn) return Insisted(why);
  return nullptr;
}

template <typename Response>
std::optional<absl::StatusOr<Response>> SharedMemoryRoute::Unavailable(const ShmUnavailable& why) {
  if (why.permanent) {
    std::lock_guard<std::mutex> lock(mu_);
    // Calls still running keep the path alive; the last one unregisters its regions.
    path_.reset();
    decided_ = true;
    refusal_ = Insisted(why);
  }
  if (mode_ == SharedMemory::kOn) return Insisted(why);
  return std::nullopt;
}

template <typename Response, typename Request>
std::optional<absl::StatusOr<Response>> SharedMemoryRoute::Run(
    const Request& request, ShmOutcome<Response> (SharedMemoryPath::*call)(const Request&)) {
  absl::StatusOr<std::shared_ptr<SharedMemoryPath>> path = Path();
  if (!path.ok()) return path.status();
  if (*path == nullptr) return std::nullopt;
  ShmOutcome<Response> outcome = ((**path).*call)(request);
  if (outcome.answer) return std::move(*outcome.answer);
  return Unavailable<Response>(outcome.unavailable);
}

std::optional<absl::StatusOr<v1::ForwardResponse>> SharedMemoryRoute::Forward(
    const v1::ForwardRequest& request) {
  // Malformed requests go over gRPC (or the data channel), whose error names the field.
  if (mode_ == SharedMemory::kOff || !FitsDataChannel(request)) return std::nullopt;
  return Run(request, &SharedMemoryPath::Forward);
}

std::optional<absl::StatusOr<v1::BackwardResponse>> SharedMemoryRoute::Backward(
    const v1::BackwardRequest& request) {
  // A backward on a saved context goes where the context is.
  if (mode_ == SharedMemory::kOff || !request.context_id().empty() || !FitsDataChannel(request)) {
    return std::nullopt;
  }
  return Run(request, &SharedMemoryPath::Backward);
}

absl::StatusOr<bool> SharedMemoryRoute::Active() {
  if (mode_ == SharedMemory::kOff) return false;
  absl::StatusOr<std::shared_ptr<SharedMemoryPath>> path = Path();
  if (!path.ok()) return path.status();
  return *path != nullptr;
}

bool SharedMemoryRoute::OffForGood() {
  std::lock_guard<std::mutex> lock(mu_);
  return decided_ && path_ == nullptr;
}

}  // namespace attnserve::internal

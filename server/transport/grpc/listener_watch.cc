#include "server/transport/grpc/listener_watch.h"

#include <grpc/support/log.h>

#include <cstring>
#include <mutex>

// gRPC's own log writer (libgpr exports it; no public header declares it).
void gpr_default_log(gpr_log_func_args* args);

namespace attnserve::transport {
namespace {

std::mutex failure_mu;
std::string* failure = nullptr;  // set once; never freed (gRPC may log until exit)

void LogAndWatch(gpr_log_func_args* args) {
  if (args->message != nullptr && std::strstr(args->message, "Failed accept4") != nullptr) {
    std::lock_guard<std::mutex> lock(failure_mu);
    if (failure == nullptr) {
      failure = new std::string(
          "the gRPC listener stopped accepting connections for good (gRPC 1.51: ");
      failure->append(args->message).append("); restart the process");
    }
  }
  gpr_default_log(args);
}

}  // namespace

void WatchGrpcListener() {
  static std::once_flag once;
  std::call_once(once, [] { gpr_set_log_function(LogAndWatch); });
}

std::string GrpcListenerFailure() {
  std::lock_guard<std::mutex> lock(failure_mu);
  return failure == nullptr ? std::string() : *failure;
}

}  // namespace attnserve::transport

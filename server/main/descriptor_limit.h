// The process's own file descriptor limit, raised at start: each client connection holds one,
// and gRPC 1.51's listener stops accepting for good the first time accept4 fails with EMFILE
// (upstream CVE-2023-4785; transport/grpc/listener_watch.h). Shells and service managers
// often start processes with a soft limit of 1024 under a much higher hard one.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace attnserve {

struct DescriptorLimit {
  long long before = 0;  // the soft limit the process started with
  long long now = 0;     // the soft limit after raising it (the hard limit, if that worked)
};

// Raises the soft RLIMIT_NOFILE to the hard limit.
absl::StatusOr<DescriptorLimit> RaiseDescriptorLimit();

// One line for the startup log.
std::string DescribeDescriptorLimit(const absl::StatusOr<DescriptorLimit>& limit);

}  // namespace attnserve

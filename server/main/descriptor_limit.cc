#include "server/main/descriptor_limit.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace attnserve {

absl::StatusOr<DescriptorLimit> RaiseDescriptorLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return absl::InternalError(absl::StrCat("getrlimit(RLIMIT_NOFILE): ", std::strerror(errno)));
  }
  DescriptorLimit result;
  result.before = result.now = static_cast<long long>(limit.rlim_cur);
  if (limit.rlim_cur == limit.rlim_max) return result;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return absl::InternalError(absl::StrCat("setrlimit(RLIMIT_NOFILE, ", limit.rlim_max,
                                            "): ", std::strerror(errno)));
  }
  result.now = static_cast<long long>(limit.rlim_cur);
  return result;
}

std::string DescribeDescriptorLimit(const absl::StatusOr<DescriptorLimit>& limit) {
  if (!limit.ok()) {
    return absl::StrCat("file descriptor limit not raised: ", limit.status().message());
  }
  std::string line = absl::StrCat("file descriptor limit ", limit->now);
  if (limit->now != limit->before) absl::StrAppend(&line, " (raised from ", limit->before, ")");
  if (limit->now < 4096) {
    absl::StrAppend(&line, "; WARNING: a client can use up this few descriptors and stop the "
                           "gRPC port for good; raise the hard limit (ulimit -Hn)");
  }
  return line;
}

}  // namespace attnserve

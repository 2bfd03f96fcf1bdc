#include "client/cpp/src/this_host.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace attnserve::internal {
namespace {

bool IsLoopbackAddress(const std::string& host) {
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    // ::ffff:127.x.y.z, as Python's ipaddress counts it.
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

std::string NumericAddress(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw = nullptr;
  if (address->sa_family == AF_INET) {
    raw = &reinterpret_cast<const sockaddr_in*>(address)->sin_addr;
  } else {
    raw = &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
  }
  if (inet_ntop(address->sa_family, raw, text, sizeof(text)) == nullptr) return "";
  return absl::AsciiStrToLower(text);
}

}  // namespace

bool IsThisHost(const std::string& target_host) {
  absl::string_view bare = target_host;
  if (absl::StartsWith(bare, "[") && absl::EndsWith(bare, "]")) {
    bare = bare.substr(1, bare.size() - 2);
  }
  const std::string host = absl::AsciiStrToLower(bare);
  if (host.empty()) return false;
  if (host == "localhost" || absl::EndsWith(host, ".localhost")) return true;
  if (IsLoopbackAddress(host)) return true;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return false;
  const std::string own = absl::AsciiStrToLower(name);
  if (host == own) return true;
  // This machine's canonical name and addresses, from its own name (/etc/hosts or the resolver).
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_CANONNAME;
  addrinfo* found = nullptr;
  if (getaddrinfo(own.c_str(), nullptr, &hints, &found) != 0) return false;
  bool match = false;
  for (const addrinfo* entry = found; entry != nullptr && !match; entry = entry->ai_next) {
    if (entry->ai_canonname != nullptr && absl::AsciiStrToLower(entry->ai_canonname) == host) {
      match = true;
    } else if (entry->ai_family == AF_INET || entry->ai_family == AF_INET6) {
      match = NumericAddress(entry->ai_addr) == host;
    }
  }
  freeaddrinfo(found);
  return match;
}

}  // namespace attnserve::internal

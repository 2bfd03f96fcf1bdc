#include "tools/raw_socket_peer.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace attnserve::load {
namespace {

constexpr int kSocketBufferBytes = 4 << 20;  // as DataConnection's
constexpr size_t kBufferBytes = 4 << 20;     // one data channel chunk

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat("raw socket peer: ", what, ": ", std::strerror(errno)));
}

// Closes its descriptor on every path.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

void SetBuffers(int fd) {
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &kSocketBufferBytes, sizeof(kSocketBufferBytes));
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &kSocketBufferBytes, sizeof(kSocketBufferBytes));
}

absl::Status Send(int fd, int64_t bytes, const std::string& buffer) {
  while (bytes > 0) {
    iovec part = {const_cast<char*>(buffer.data()),
                  static_cast<size_t>(std::min<int64_t>(bytes, buffer.size()))};
    msghdr message{};
    message.msg_iov = &part;
    message.msg_iovlen = 1;
    const ssize_t n = sendmsg(fd, &message, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("sendmsg");
    bytes -= n;
  }
  return absl::OkStatus();
}

absl::Status Receive(int fd, int64_t bytes) {
  std::string buffer(kBufferBytes, '\0');
  while (bytes > 0) {
    const ssize_t n = recv(fd, buffer.data(), std::min<int64_t>(bytes, buffer.size()), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("recv");
    if (n == 0) return absl::UnavailableError("raw socket peer: the sender closed early");
    bytes -= n;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<double> MeasureRawSocket(int64_t bytes, int connections) {
  if (bytes < 1 || connections < 1) {
    return absl::InvalidArgumentError("raw socket peer: bytes and connections must be >= 1");
  }
  Fd listener{socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (listener.fd < 0) return Errno("socket");
  SetBuffers(listener.fd);  // accepted sockets inherit it, as the server's do
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (bind(listener.fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(listener.fd, connections) != 0 ||
      getsockname(listener.fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return Errno("listen on loopback");
  }
  std::vector<Fd> senders(connections), receivers(connections);
  for (int i = 0; i < connections; ++i) {
    senders[i].fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (senders[i].fd < 0) return Errno("socket");
    SetBuffers(senders[i].fd);
    if (connect(senders[i].fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      return Errno("connect");
    }
    const int one = 1;
    setsockopt(senders[i].fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    receivers[i].fd = accept(listener.fd, nullptr, nullptr);
    if (receivers[i].fd < 0) return Errno("accept");
  }
  const std::string buffer(kBufferBytes, 'x');
  std::vector<absl::Status> results(2 * connections);
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < connections; ++i) {
    const int64_t share = bytes / connections + (i < bytes % connections ? 1 : 0);
    // A side that fails shuts its socket, so its peer fails too instead of waiting forever.
    threads.emplace_back([&, i, share] {
      results[2 * i] = Send(senders[i].fd, share, buffer);
      if (!results[2 * i].ok()) shutdown(senders[i].fd, SHUT_RDWR);
    });
    threads.emplace_back([&, i, share] {
      results[2 * i + 1] = Receive(receivers[i].fd, share);
      if (!results[2 * i + 1].ok()) shutdown(receivers[i].fd, SHUT_RDWR);
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return bytes / seconds / 1e9;
}

}  // namespace attnserve::load

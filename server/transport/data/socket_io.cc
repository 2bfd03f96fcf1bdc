#include "server/transport/data/socket_io.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace attnserve::transport::data {
namespace {

int PollMillis(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return -1;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(timeout), 1 << 30));
}

absl::Status ErrnoStatus(const char* what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Waits until `fd` is readable; DEADLINE_EXCEEDED after `timeout`.
absl::Status WaitReadable(int fd, absl::Duration timeout) {
  pollfd p{fd, POLLIN, 0};
  while (true) {
    const int ready = poll(&p, 1, PollMillis(timeout));
    if (ready > 0) return absl::OkStatus();
    if (ready == 0) return absl::DeadlineExceededError("the peer sent nothing in time");
    if (errno != EINTR) return ErrnoStatus("poll");
  }
}

}  // namespace

void ConfigureConnectedSocket(int fd, int buffer_bytes, absl::Duration send_timeout) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  const int idle_seconds = 60, interval_seconds = 10, probes = 3;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_seconds, sizeof(idle_seconds));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_seconds, sizeof(interval_seconds));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
  const timeval tv = absl::ToTimeval(send_timeout);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

absl::Status ReadExact(int fd, char* out, size_t size, absl::Duration first_byte_timeout,
                       absl::Duration stall_timeout) {
  size_t got = 0;
  while (got < size) {
    // recv first: under load the bytes are usually there already, and a poll() per read was
    // a third of the reader's system calls for small requests.
    const ssize_t n = recv(fd, out + got, size - got, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n == 0) {
      return absl::UnavailableError(got == 0 ? "the peer closed the connection"
                                             : "the peer closed the connection mid-frame");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status ready = WaitReadable(fd, got == 0 ? first_byte_timeout : stall_timeout);
          !ready.ok()) {
        return ready;
      }
    } else if (errno != EINTR) {
      return ErrnoStatus("recv");
    }
  }
  return absl::OkStatus();
}

absl::Status SendAll(int fd, absl::Span<const iovec> frames) {
  std::vector<iovec> parts(frames.begin(), frames.end());
  size_t next = 0;
  while (next < parts.size()) {
    msghdr message{};
    message.msg_iov = parts.data() + next;
    message.msg_iovlen = std::min<size_t>(parts.size() - next, IOV_MAX);
    const ssize_t n = sendmsg(fd, &message, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return absl::DeadlineExceededError("the peer did not read what was sent in time");
      }
      return ErrnoStatus("sendmsg");
    }
    size_t sent = static_cast<size_t>(n);
    while (next < parts.size() && sent >= parts[next].iov_len) sent -= parts[next++].iov_len;
    if (next < parts.size()) {
      parts[next].iov_base = static_cast<char*>(parts[next].iov_base) + sent;
      parts[next].iov_len -= sent;
    }
  }
  return absl::OkStatus();
}

}  // namespace attnserve::transport::data

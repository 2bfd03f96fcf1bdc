#include "attnserve/data_channel_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "client/cpp/src/data_channel_tls.h"
#include "common/data_channel_wire.h"
#include "common/tls_connection.h"

namespace attnserve {
namespace data_channel {

static_assert(kMagic == data_channel_wire::kMagic && kHeaderBytes == data_channel_wire::kHeaderBytes,
              "the public header's frame constants must be the wire's");

namespace {

constexpr int kSocketBufferBytes = 4 << 20;

int Millis(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return -1;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d), 1 << 30));
}

}  // namespace

std::string EncodeHeader(const FrameHeader& header, uint32_t magic) {
  data_channel_wire::RawHeader raw;
  raw.magic = magic;
  raw.type = header.type;
  raw.flags = header.flags;
  raw.request_id = header.request_id;
  raw.offset = header.offset;
  raw.length = header.length;
  std::string bytes(kHeaderBytes, '\0');
  data_channel_wire::EncodeHeader(raw, bytes.data());
  return bytes;
}

absl::StatusOr<FrameHeader> DecodeHeader(const char* bytes) {
  const data_channel_wire::RawHeader raw = data_channel_wire::DecodeHeader(bytes);
  if (raw.magic != kMagic) {
    return absl::InternalError("the server sent a frame without the ADP1 magic");
  }
  FrameHeader header;
  header.type = raw.type;
  header.flags = raw.flags;
  header.request_id = raw.request_id;
  header.offset = raw.offset;
  header.length = raw.length;
  return header;
}

namespace {

// Connects `fd` to `address` within `timeout`; errno's text otherwise.
std::string ConnectWithin(int fd, const addrinfo& address, absl::Duration timeout) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return std::strerror(errno);
  if (connect(fd, address.ai_addr, address.ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return std::strerror(errno);
    pollfd p{fd, POLLOUT, 0};
    int ready;
    while ((ready = poll(&p, 1, Millis(timeout))) < 0 && errno == EINTR) {
    }
    if (ready == 0) return "timed out";
    int error = 0;
    socklen_t size = sizeof(error);
    if (ready < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) {
      return std::strerror(errno);
    }
    if (error != 0) return std::strerror(error);
  }
  // Plain connections block (sends wait, reads poll first); TLS makes it non-blocking again.
  if (fcntl(fd, F_SETFL, flags) < 0) return std::strerror(errno);
  return "";
}

}  // namespace

DataConnection::DataConnection(int fd) : fd_(fd) {}

absl::StatusOr<std::unique_ptr<DataConnection>> DataConnection::Connect(
    const std::string& host, int port, absl::Duration timeout, const TlsClientContext* tls,
    const std::string& server_name) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("data channel host ", host, ": ", gai_strerror(rc)));
  }
  std::string error = "no address";
  std::unique_ptr<DataConnection> connection;
  for (addrinfo* a = found; a != nullptr && connection == nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &kSocketBufferBytes, sizeof(kSocketBufferBytes));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &kSocketBufferBytes, sizeof(kSocketBufferBytes));
    error = ConnectWithin(fd, *a, timeout);
    if (!error.empty()) {
      close(fd);
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    connection.reset(new DataConnection(fd));
  }
  freeaddrinfo(found);
  if (connection == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("could not connect to the data channel at ", host, ":", port, ": ", error));
  }
  if (tls != nullptr) {
    absl::StatusOr<std::unique_ptr<tls::TlsConnection>> secured =
        tls->Connect(connection->fd_, server_name.empty() ? host : server_name, timeout);
    if (!secured.ok()) {
      return absl::Status(secured.status().code(),
                          absl::StrCat("the data channel at ", host, ":", port, ": ",
                                       secured.status().message()));
    }
    connection->tls_ = *std::move(secured);
  }
  return connection;
}

DataConnection::~DataConnection() {
  tls_.reset();  // the SSL object goes before its socket
  close(fd_);
}

absl::Status DataConnection::SendFrame(const FrameHeader& header,
                                       absl::Span<const iovec> payload) {
  const std::string head = EncodeHeader(header);
  std::vector<iovec> parts = {{const_cast<char*>(head.data()), head.size()}};
  parts.insert(parts.end(), payload.begin(), payload.end());
  return SendParts(std::move(parts));
}

absl::Status DataConnection::SendParts(std::vector<iovec> parts) {
  std::lock_guard<std::mutex> lock(send_mu_);
  // TLS sends wait for the socket as long as a plain blocking send would: without bound.
  if (tls_ != nullptr) return tls_->SendAll(parts, absl::InfiniteDuration());
  size_t next = 0;
  while (next < parts.size()) {
    msghdr message{};
    message.msg_iov = parts.data() + next;
    message.msg_iovlen = std::min<size_t>(parts.size() - next, IOV_MAX);
    const ssize_t n = sendmsg(fd_, &message, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("data channel send: ", std::strerror(errno)));
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

absl::Status DataConnection::SendMessage(uint16_t type, uint64_t request_id,
                                         const google::protobuf::MessageLite& message) {
  const std::string bytes = message.SerializeAsString();
  FrameHeader header;
  header.type = type;
  header.request_id = request_id;
  header.length = bytes.size();
  const iovec part = {const_cast<char*>(bytes.data()), bytes.size()};
  return SendFrame(header, absl::MakeConstSpan(&part, bytes.empty() ? 0 : 1));
}

absl::Status DataConnection::SendRaw(absl::string_view bytes) {
  if (tls_ != nullptr) return SendParts({{const_cast<char*>(bytes.data()), bytes.size()}});
  std::lock_guard<std::mutex> lock(send_mu_);
  if (send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
    return absl::UnavailableError(absl::StrCat("data channel send: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status DataConnection::ReadInto(char* out, size_t size, absl::Duration timeout) {
  if (tls_ != nullptr) return tls_->ReadExact(out, size, timeout, timeout);
  size_t got = 0;
  while (got < size) {
    // recv first, poll only when nothing is there: under load the bytes usually are.
    const ssize_t n = recv(fd_, out + got, size - got, MSG_DONTWAIT);
    if (n == 0) return absl::UnavailableError("the server closed the data channel connection");
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("data channel recv: ", std::strerror(errno)));
    }
    pollfd p{fd_, POLLIN, 0};
    const int ready = poll(&p, 1, Millis(timeout));
    if (ready == 0) return absl::DeadlineExceededError("nothing from the data channel in time");
    if (ready < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<FrameHeader> DataConnection::ReadHeader(absl::Duration timeout) {
  char bytes[kHeaderBytes];
  if (absl::Status s = ReadInto(bytes, kHeaderBytes, timeout); !s.ok()) return s;
  return DecodeHeader(bytes);
}

absl::StatusOr<Frame> DataConnection::ReadFrame(absl::Duration timeout) {
  absl::StatusOr<FrameHeader> header = ReadHeader(timeout);
  if (!header.ok()) return header.status();
  Frame frame;
  frame.header = *header;
  frame.payload.resize(header->length);
  if (absl::Status s = ReadInto(frame.payload.data(), frame.payload.size(), timeout); !s.ok()) {
    return s;
  }
  return frame;
}

void DataConnection::Shutdown() { shutdown(fd_, SHUT_RDWR); }

v1::DataHello MakeHello(const std::string& session_id, const std::string& token) {
  v1::DataHello hello;
  hello.set_protocol_version(1);
  hello.set_session_id(session_id);
  hello.set_token(token);
  return hello;
}

std::string RandomSessionId() {
  std::random_device random;
  std::string id(16, '\0');
  for (char& c : id) c = static_cast<char>(random() & 0xff);
  return id;
}

}  // namespace data_channel
}  // namespace attnserve

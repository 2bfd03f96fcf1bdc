#include "server/transport/data/tls_stream.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"

namespace attnserve::transport::data {
namespace {

// Plaintext bytes written per SSL_write: the reader thread waits for the mutex at most this
// long's encryption (16 records).
constexpr size_t kWriteStep = size_t{256} << 10;
// A frame header is sent in one record with up to this many payload bytes behind it, so small
// frames are one record, not a 32-byte record and another.
constexpr size_t kCoalesceBytes = 16 << 10;

int PollMillis(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return -1;
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(timeout), 0, 1 << 30));
}

// Waits until `fd` is ready for `events`; DEADLINE_EXCEEDED after `timeout`.
absl::Status WaitFor(int fd, short events, absl::Duration timeout, const char* what) {
  pollfd p{fd, events, 0};
  while (true) {
    const int ready = poll(&p, 1, PollMillis(timeout));
    if (ready > 0) return absl::OkStatus();
    if (ready == 0) return absl::DeadlineExceededError(what);
    if (errno != EINTR) return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
  }
}

// Why an SSL call failed with `error` (SSL_get_error's), from this thread's OpenSSL error
// queue or errno, which the call left there.
std::string Failure(int error, int saved_errno) {
  if (error == SSL_ERROR_ZERO_RETURN) return "the peer closed the connection";
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code != 0) {
    const char* reason = ERR_reason_error_string(code);
    if (reason != nullptr) return reason;
    char text[256];
    ERR_error_string_n(code, text, sizeof(text));
    return text;
  }
  if (error == SSL_ERROR_SYSCALL && saved_errno != 0) return std::strerror(saved_errno);
  return "the peer closed the connection";
}

}  // namespace

absl::StatusOr<std::unique_ptr<TlsServerContext>> TlsServerContext::Create(
    const TlsMaterial& material) {
  // OpenSSL's socket BIO writes with write(), not send(MSG_NOSIGNAL): a peer that resets the
  // connection would raise SIGPIPE and end the process.
  static std::once_flag ignore_sigpipe;
  std::call_once(ignore_sigpipe, [] { signal(SIGPIPE, SIG_IGN); });
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) {
    return absl::InternalError(absl::StrCat("data channel TLS: SSL_CTX_new failed: ",
                                            Failure(SSL_ERROR_SSL, 0)));
  }
  std::unique_ptr<TlsServerContext> context(new TlsServerContext(ctx, material.mutual()));
  if (absl::Status s = ConfigureServerSslContext(ctx, material); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("data channel TLS: ", s.message()));
  }
  // Frames carry their own lengths, so a close without close_notify cannot truncate one
  // unnoticed; clients that just close their sockets end as cleanly as over plain TCP.
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
  // Clients open a fresh session per connection and never resume one.
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return context;
}

TlsServerContext::~TlsServerContext() { SSL_CTX_free(ctx_); }

absl::StatusOr<std::unique_ptr<ByteStream>> TlsServerContext::NewStream(
    int fd, absl::Duration send_timeout) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return absl::UnavailableError(absl::StrCat("fcntl: ", std::strerror(errno)));
  }
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    return absl::ResourceExhaustedError(absl::StrCat("data channel TLS: SSL_new failed: ",
                                                     Failure(SSL_ERROR_SSL, 0)));
  }
  return std::make_unique<TlsStream>(fd, ssl, send_timeout);
}

TlsStream::TlsStream(int fd, SSL* ssl, absl::Duration send_timeout)
    : fd_(fd), ssl_(ssl), send_timeout_(send_timeout) {}

TlsStream::~TlsStream() { SSL_free(ssl_); }

absl::Status TlsStream::Open(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int result, error, saved_errno;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ERR_clear_error();
      result = SSL_accept(ssl_);
      saved_errno = errno;
      error = SSL_get_error(ssl_, result);
    }
    if (result == 1) return absl::OkStatus();
    const char* late =
        "the TLS handshake did not finish within the HELLO timeout (a plaintext client?)";
    if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
      if (absl::Status ready = WaitFor(fd_, error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT,
                                       deadline - absl::Now(), late);
          !ready.ok()) {
        return ready;
      }
      continue;
    }
    std::string why = Failure(error, saved_errno);
    if (const long verify = SSL_get_verify_result(ssl_); verify != X509_V_OK) {
      absl::StrAppend(&why, " (client certificate: ", X509_verify_cert_error_string(verify), ")");
    }
    return absl::UnavailableError(absl::StrCat("TLS handshake failed: ", why));
  }
}

absl::Status TlsStream::ReadExact(char* out, size_t size, absl::Duration first_byte_timeout,
                                  absl::Duration stall_timeout) {
  size_t got = 0;
  while (got < size) {
    size_t n = 0;
    int error, saved_errno;
    {
      // SSL_read hands out decrypted bytes it holds (SSL_pending) before it asks for more;
      // WANT_READ means it holds none, so the poll() below cannot sleep on buffered data.
      std::lock_guard<std::mutex> lock(mu_);
      ERR_clear_error();
      const int result = SSL_read_ex(ssl_, out + got, size - got, &n);
      saved_errno = errno;
      error = result == 1 ? SSL_ERROR_NONE : SSL_get_error(ssl_, result);
    }
    if (error == SSL_ERROR_NONE) {
      got += n;
      continue;
    }
    if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
      const absl::Duration timeout = got == 0 ? first_byte_timeout : stall_timeout;
      if (absl::Status ready = WaitFor(fd_, error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT,
                                       timeout, "the peer sent nothing in time");
          !ready.ok()) {
        return ready;
      }
      continue;
    }
    const std::string why = Failure(error, saved_errno);
    return absl::UnavailableError(got == 0 ? why : absl::StrCat(why, " mid-frame"));
  }
  return absl::OkStatus();
}

absl::Status TlsStream::SendAll(absl::Span<const iovec> parts) {
  // Headers and small payloads are gathered into one record; a large payload goes as it is.
  char gathered[kCoalesceBytes];
  size_t used = 0;
  for (const iovec& part : parts) {
    const char* data = static_cast<const char*>(part.iov_base);
    const size_t take = std::min(part.iov_len, sizeof(gathered) - used);
    std::memcpy(gathered + used, data, take);
    used += take;
    if (take == part.iov_len && used < sizeof(gathered)) continue;
    if (absl::Status s = Write(gathered, used); !s.ok()) return s;
    used = 0;
    if (absl::Status s = Write(data + take, part.iov_len - take); !s.ok()) return s;
  }
  return Write(gathered, used);
}

absl::Status TlsStream::Write(const char* data, size_t size) {
  size_t sent = 0;
  while (sent < size) {
    // After WANT_WRITE the same call is repeated with the same bytes, as OpenSSL requires.
    const size_t step = std::min(size - sent, kWriteStep);
    size_t n = 0;
    int error, saved_errno;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ERR_clear_error();
      const int result = SSL_write_ex(ssl_, data + sent, step, &n);
      saved_errno = errno;
      error = result == 1 ? SSL_ERROR_NONE : SSL_get_error(ssl_, result);
    }
    if (error == SSL_ERROR_NONE) {
      sent += n;
      continue;
    }
    if (error == SSL_ERROR_WANT_WRITE || error == SSL_ERROR_WANT_READ) {
      if (absl::Status ready =
              WaitFor(fd_, error == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN, send_timeout_,
                      "the peer did not read what was sent in time");
          !ready.ok()) {
        return ready;
      }
      continue;
    }
    return absl::UnavailableError(absl::StrCat("TLS write: ", Failure(error, saved_errno)));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::transport::data

#include "common/tls_connection.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace attnserve::tls {
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

// Waits until `fd` is ready for `events`; DEADLINE_EXCEEDED with `what` after `timeout`.
absl::Status WaitFor(int fd, short events, absl::Duration timeout, absl::string_view what) {
  pollfd p{fd, events, 0};
  while (true) {
    const int ready = poll(&p, 1, PollMillis(timeout));
    if (ready > 0) return absl::OkStatus();
    if (ready == 0) return absl::DeadlineExceededError(what);
    if (errno != EINTR) return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
  }
}

}  // namespace

void IgnoreSigpipe() {
  static std::once_flag ignore_sigpipe;
  std::call_once(ignore_sigpipe, [] { signal(SIGPIPE, SIG_IGN); });
}

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

absl::StatusOr<std::unique_ptr<TlsConnection>> TlsConnection::Create(int fd, SSL* ssl) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    SSL_free(ssl);
    return absl::UnavailableError(absl::StrCat("fcntl: ", std::strerror(errno)));
  }
  return std::unique_ptr<TlsConnection>(new TlsConnection(fd, ssl));
}

TlsConnection::~TlsConnection() { SSL_free(ssl_); }

absl::Status TlsConnection::Handshake(absl::Duration timeout, absl::string_view late,
                                      absl::string_view peer_certificate) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int result, error, saved_errno;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ERR_clear_error();
      result = SSL_do_handshake(ssl_);
      saved_errno = errno;
      error = SSL_get_error(ssl_, result);
    }
    if (result == 1) return absl::OkStatus();
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
      absl::StrAppend(&why, " (", peer_certificate, ": ", X509_verify_cert_error_string(verify),
                      ")");
    }
    return absl::UnavailableError(absl::StrCat("TLS handshake failed: ", why));
  }
}

absl::Status TlsConnection::ReadExact(char* out, size_t size, absl::Duration first_byte_timeout,
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

absl::Status TlsConnection::SendAll(absl::Span<const iovec> parts, absl::Duration send_timeout) {
  // Headers and small payloads are gathered into one record; a large payload goes as it is.
  char gathered[kCoalesceBytes];
  size_t used = 0;
  for (const iovec& part : parts) {
    const char* data = static_cast<const char*>(part.iov_base);
    const size_t take = std::min(part.iov_len, sizeof(gathered) - used);
    std::memcpy(gathered + used, data, take);
    used += take;
    if (take == part.iov_len && used < sizeof(gathered)) continue;
    if (absl::Status s = Write(gathered, used, send_timeout); !s.ok()) return s;
    used = 0;
    if (absl::Status s = Write(data + take, part.iov_len - take, send_timeout); !s.ok()) return s;
  }
  return Write(gathered, used, send_timeout);
}

absl::Status TlsConnection::Write(const char* data, size_t size, absl::Duration send_timeout) {
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
              WaitFor(fd_, error == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN, send_timeout,
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

}  // namespace attnserve::tls

#include "server/transport/data/connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "attnserve/v1/data_channel.pb.h"
#include "server/transport/data/data_server.h"
#include "server/transport/data/session.h"

namespace attnserve::transport::data {
namespace {

constexpr size_t kSessionIdBytes = 16;
// After an ERROR frame: how long, and how many bytes, the server keeps reading what the peer
// still sends, so closing does not reset the connection before the peer has read the ERROR.
constexpr absl::Duration kErrorLinger = absl::Seconds(1);
constexpr size_t kErrorLingerBytes = size_t{64} << 20;
// Frames the writer sends with one sendmsg at most (two iovecs each, under IOV_MAX).
constexpr size_t kMaxFramesPerSend = 64;

// The token as the Authenticator reads an authorization value: "Bearer <token>"; a token
// sent with its scheme is taken as it is.
std::optional<std::string> Authorization(const std::string& token) {
  if (token.empty()) return std::nullopt;
  if (absl::StartsWithIgnoreCase(absl::StripLeadingAsciiWhitespace(token), "bearer ")) {
    return token;
  }
  return absl::StrCat("Bearer ", token);
}

void LingerAfterError(int fd) {
  shutdown(fd, SHUT_WR);
  const absl::Time end = absl::Now() + kErrorLinger;
  char scratch[64 << 10];
  size_t drained = 0;
  while (drained < kErrorLingerBytes) {
    const absl::Duration left = end - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) <= 0) break;
    const ssize_t n = recv(fd, scratch, sizeof(scratch), 0);
    if (n <= 0) break;
    drained += static_cast<size_t>(n);
  }
}

}  // namespace

Connection::Connection(int fd, std::unique_ptr<ByteStream> stream, DataServer* server,
                       DataContext* context)
    : fd_(fd), stream_(std::move(stream)), server_(server), context_(context) {}

Connection::~Connection() {
  close(fd_);
  server_->ConnectionClosed();
}

void Connection::Start() {
  server_->ThreadStarted();
  try {
    std::thread([self = shared_from_this()]() mutable {
      DataServer* server = self->server_;
      self->ReadLoop();
      self.reset();
      server->ThreadExited();
    }).detach();
  } catch (...) {
    server_->ThreadExited();
    throw;
  }
  server_->ThreadStarted();
  try {
    std::thread([self = shared_from_this()]() mutable {
      DataServer* server = self->server_;
      self->WriteLoop();
      self.reset();
      server->ThreadExited();
    }).detach();
  } catch (...) {
    server_->ThreadExited();
    Shutdown();  // the reader ends too
    throw;
  }
}

void Connection::Push(OutFrame frame) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(frame));
  }
  cv_.notify_one();
}

void Connection::Push(std::vector<OutFrame> frames) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (OutFrame& frame : frames) queue_.push_back(std::move(frame));
  }
  cv_.notify_one();
}

std::vector<OutFrame> Connection::Retire() {
  std::vector<OutFrame> frames;
  std::lock_guard<std::mutex> lock(mu_);
  retired_ = true;
  std::deque<OutFrame> kept;
  for (OutFrame& frame : queue_) {
    (frame.last ? kept.emplace_back(std::move(frame)) : frames.emplace_back(std::move(frame)));
  }
  queue_.swap(kept);
  return frames;
}

void Connection::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  shutdown(fd_, SHUT_RDWR);
}

std::shared_ptr<Session> Connection::session() {
  std::lock_guard<std::mutex> lock(mu_);
  return session_;
}

void Connection::ReadLoop() {
  const absl::Status ending = Serve();
  if (std::shared_ptr<Session> session = this->session(); session != nullptr) {
    if (session->Leave(this)) server_->EndSession(session);
  }
  if (ending.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  } else {
    if (const std::string reason = ViolationReason(ending); reason != "other") {
      context_->data_metrics->RecordProtocolError(reason);
    }
    OutFrame error = ErrorFrame(ending);
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(error));
  }
  cv_.notify_one();
}

void Connection::WriteLoop() {
  std::vector<OutFrame> batch;
  std::vector<iovec> parts;
  while (true) {
    batch.clear();
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return !queue_.empty() || stopping_; });
      if (queue_.empty()) break;
      // Everything queued goes in one sendmsg: a small answer's RESPONSE and CHUNKs, and the
      // answers that queued up meanwhile, cost one system call and one wakeup, not one each.
      while (!queue_.empty() && batch.size() < kMaxFramesPerSend) {
        const bool last = queue_.front().last;
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
        if (last) break;
      }
    }
    parts.clear();
    for (const OutFrame& frame : batch) {
      parts.push_back({const_cast<char*>(frame.header), kFrameHeaderBytes});
      if (frame.payload_size() > 0) {
        parts.push_back({const_cast<char*>(frame.payload()), frame.payload_size()});
      }
    }
    if (const absl::Status sent = stream_->SendAll(parts); !sent.ok()) {
      // The frames go back; once this connection has left its session (the reader notices
      // the shutdown below), the session sends what is queued here on its other connections.
      std::vector<OutFrame> orphans;
      std::shared_ptr<Session> session;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto frame = batch.rbegin(); frame != batch.rend(); ++frame) {
          if (!frame->last) queue_.push_front(std::move(*frame));
        }
        if (retired_) {
          for (OutFrame& f : queue_) {
            if (!f.last) orphans.push_back(std::move(f));
          }
          queue_.clear();
          session = session_;
        }
      }
      shutdown(fd_, SHUT_RDWR);
      if (session != nullptr && !orphans.empty()) session->Send(std::move(orphans));
      break;
    }
    for (const OutFrame& frame : batch) {
      if (frame.response == nullptr) continue;
      if (frame.data != nullptr) context_->data_metrics->AddSentChunk(static_cast<double>(frame.size));
      frame.response->unsent_frames.fetch_sub(1);
    }
    if (!batch.empty() && batch.back().last) {
      LingerAfterError(fd_);
      shutdown(fd_, SHUT_RDWR);
      break;
    }
  }
}

absl::Status Connection::ReadEnding(const absl::Status& read) {
  if (absl::IsDeadlineExceeded(read)) {
    return Violation(absl::StatusCode::kDeadlineExceeded, "timeout",
                     absl::StrCat("a frame stalled for longer than data_transfer_timeout_seconds = ",
                                  absl::ToInt64Seconds(context_->options.transfer_timeout)));
  }
  peer_gone_ = true;
  return absl::OkStatus();
}
absl::Status Connection::Hello() {
  const absl::Duration timeout = context_->options.hello_timeout;
  char bytes[kFrameHeaderBytes];
  if (absl::Status read = stream_->ReadExact(bytes, kFrameHeaderBytes, timeout, timeout);
      !read.ok()) {
    if (absl::IsDeadlineExceeded(read)) {
      return Violation(absl::StatusCode::kDeadlineExceeded, "hello_timeout",
                       absl::StrCat("no HELLO frame within ", absl::FormatDuration(timeout)));
    }
    return ReadEnding(read);
  }
  absl::StatusOr<FrameHeader> header =
      DecodeClientFrameHeader(bytes, static_cast<uint64_t>(context_->options.max_chunk_bytes));
  if (!header.ok()) return header.status();
  if (header->type != v1::FRAME_HELLO) {
    return Violation(absl::StatusCode::kInvalidArgument, "expected_hello",
                     absl::StrCat("the first frame must be HELLO, got ",
                                  v1::FrameType_Name(header->type)));
  }
  std::string payload(header->length, '\0');
  if (absl::Status read = stream_->ReadExact(payload.data(), payload.size(), timeout, timeout);
      !read.ok()) {
    return absl::IsDeadlineExceeded(read) ? Violation(absl::StatusCode::kDeadlineExceeded,
                                                      "hello_timeout", "the HELLO frame stalled")
                                          : ReadEnding(read);
  }
  v1::DataHello hello;
  if (!hello.ParseFromString(payload)) {
    return Violation(absl::StatusCode::kInvalidArgument, "bad_message",
                     "the HELLO payload is not a DataHello message");
  }
  if (hello.protocol_version() != kProtocolVersion) {
    return Violation(absl::StatusCode::kFailedPrecondition, "bad_version",
                     absl::StrCat("protocol_version ", hello.protocol_version(),
                                  " is not supported; this server speaks ", kProtocolVersion));
  }
  if (hello.session_id().size() != kSessionIdBytes) {
    return Violation(absl::StatusCode::kInvalidArgument, "bad_hello",
                     absl::StrCat("session_id must be ", kSessionIdBytes, " bytes, got ",
                                  hello.session_id().size()));
  }
  if (context_->refusing.load()) {
    return absl::UnavailableError("the server is shutting down; use another replica");
  }
  std::string principal;
  if (context_->auth != nullptr) {
    std::optional<std::string> authorization = Authorization(hello.token());
    if (absl::Status auth = context_->auth->Check(authorization); !auth.ok()) return auth;
    principal = context_->auth->Principal(authorization);
  }
  absl::StatusOr<std::shared_ptr<Session>> session =
      server_->JoinSession(hello.session_id(), principal, shared_from_this());
  if (!session.ok()) return session.status();
  {
    std::lock_guard<std::mutex> lock(mu_);
    session_ = *session;
  }
  v1::DataHelloOk ok;
  ok.set_max_chunk_bytes(context_->options.max_chunk_bytes);
  ok.set_max_connections_per_session(context_->options.max_connections_per_session);
  ok.set_max_requests_per_session(context_->options.max_requests_per_session);
  ok.set_max_inline_bytes(kMaxInlineBytes);
  Push(MessageFrame(v1::FRAME_HELLO_OK, 0, ok));
  return absl::OkStatus();
}

absl::Status Connection::Serve() {
  if (absl::Status opened = stream_->Open(context_->options.hello_timeout); !opened.ok()) {
    // No frame can reach a peer that failed the handshake: count it and close, after the
    // linger that keeps a reset (the peer's unread first frame) from discarding TLS's alert.
    context_->data_metrics->RecordProtocolError("tls_handshake");
    server_->HandshakeFailed(opened);
    LingerAfterError(fd_);
    peer_gone_ = true;
    return absl::OkStatus();
  }
  if (absl::Status hello = Hello(); !hello.ok() || peer_gone_) return hello;
  const absl::Duration stall = context_->options.transfer_timeout;
  char bytes[kFrameHeaderBytes];
  while (true) {
    const absl::Status read =
        stream_->ReadExact(bytes, kFrameHeaderBytes, absl::InfiniteDuration(), stall);
    if (!read.ok()) return ReadEnding(read);
    absl::StatusOr<FrameHeader> header =
        DecodeClientFrameHeader(bytes, static_cast<uint64_t>(context_->options.max_chunk_bytes));
    if (!header.ok()) return header.status();
    absl::Status handled;
    switch (header->type) {
      case v1::FRAME_REQUEST:
        handled = HandleRequest(*header);
        break;
      case v1::FRAME_CHUNK:
        handled = HandleChunk(*header);
        break;
      case v1::FRAME_CANCEL:
        session_->Cancel(header->request_id);
        break;
      default:
        handled = Violation(absl::StatusCode::kInvalidArgument, "unexpected_hello",
                            "HELLO may only be a connection's first frame");
    }
    if (!handled.ok() || peer_gone_) return handled;
  }
}

absl::Status Connection::HandleRequest(const FrameHeader& header) {
  const absl::Time start = absl::Now();
  std::string payload(header.length, '\0');
  const absl::Duration stall = context_->options.transfer_timeout;
  if (absl::Status read = stream_->ReadExact(payload.data(), payload.size(), stall, stall);
      !read.ok()) {
    return ReadEnding(read);
  }
  v1::DataRequest request;
  if (!request.ParseFromString(payload)) {
    return Violation(absl::StatusCode::kInvalidArgument, "bad_message",
                     "the REQUEST payload is not a DataRequest message");
  }
  if (absl::Status free = session_->CheckIdFree(header.request_id); !free.ok()) return free;
  const char* rpc = RpcName(request);
  if (absl::Status refusal = Admit(header.request_id, request, rpc, start); !refusal.ok()) {
    if (rpc != nullptr) {
      context_->metrics->RecordRequest(rpc, absl::StatusCodeToString(refusal.code()),
                                       absl::ToDoubleSeconds(absl::Now() - start));
      context_->data_metrics->RecordRequest(rpc, absl::StatusCodeToString(refusal.code()));
    }
    // Its inline chunk, sent without waiting, is dropped when it comes.
    session_->Tombstone(header.request_id);
    Push(StatusResponseFrame(header.request_id, refusal));
  }
  return absl::OkStatus();
}

absl::Status Connection::Admit(uint64_t request_id, const v1::DataRequest& request,
                               const char* rpc, absl::Time start) {
  if (context_->refusing.load()) {
    return absl::UnavailableError("the server is shutting down; use another replica");
  }
  const DataServerOptions& options = context_->options;
  absl::StatusOr<PlannedCall> plan =
      PlanCall(request, context_->engine->limits(), options.max_chunk_bytes);
  if (!plan.ok()) return plan.status();
  if (request.inline_payload() && plan->payload_bytes > kMaxInlineBytes) {
    return absl::InvalidArgumentError(absl::StrCat("payload_bytes: ", plan->payload_bytes,
                                                   " is more than max_inline_bytes = ",
                                                   kMaxInlineBytes, " for an inline_payload"));
  }
  absl::StatusOr<std::unique_ptr<SlotLease>> lease = SlotLease::Acquire(context_);
  if (!lease.ok()) return lease.status();
  if (!context_->budget->TryReserve(plan->payload_bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "payload_bytes: ", plan->payload_bytes, " more bytes would exceed data_max_buffered_bytes = ",
        options.max_buffered_bytes, " of requests buffered at once; retry later"));
  }
  auto call = std::make_shared<DataCall>(context_, request_id, rpc, start);
  absl::StatusOr<std::unique_ptr<engine::HostBuffer>> buffer =
      context_->engine->host_buffers().Allocate(static_cast<size_t>(plan->payload_bytes));
  if (!buffer.ok()) {
    context_->budget->Release(plan->payload_bytes);
    return buffer.status();
  }
  call->plan = *std::move(plan);
  call->buffer = *std::move(buffer);  // from here on the call returns the budget
  call->plan.PointInto(call->buffer->data());
  call->lease = *std::move(lease);
  call->tracker.emplace(call->plan.payload_bytes, call->plan.chunk_bytes);
  call->transfer_deadline = start + options.transfer_timeout;
  if (absl::Status registered = session_->Register(call); !registered.ok()) return registered;
  if (call->plan.payload_bytes == 0) {
    session_->ChunkArrived(call, 0, 0);
  } else if (call->plan.payload_bytes > call->plan.chunk_bytes && !request.inline_payload()) {
    Push(MessageFrame(v1::FRAME_ACCEPTED, request_id, v1::DataAccepted()));
  }
  return absl::OkStatus();
}

absl::Status Connection::HandleChunk(const FrameHeader& header) {
  const absl::Duration stall = context_->options.transfer_timeout;
  absl::StatusOr<std::shared_ptr<DataCall>> claim =
      session_->ClaimChunk(header.request_id, header.offset, header.length);
  if (!claim.ok()) return claim.status();
  if (*claim == nullptr) {
    const absl::Status dropped = Discard(*stream_, header.length, stall);
    return dropped.ok() ? absl::OkStatus() : ReadEnding(dropped);
  }
  const std::shared_ptr<DataCall>& call = *claim;
  const absl::Status read =
      stream_->ReadExact(call->buffer->data() + header.offset, header.length, stall, stall);
  if (!read.ok()) {
    session_->Fail(call, absl::UnavailableError(absl::StrCat(
                             "the connection carrying the CHUNK at offset ", header.offset,
                             " closed or stalled before its bytes arrived")));
    return ReadEnding(read);
  }
  context_->data_metrics->AddReceivedChunk(static_cast<double>(header.length));
  session_->ChunkArrived(call, header.offset, header.length);
  return absl::OkStatus();
}

}  // namespace attnserve::transport::data

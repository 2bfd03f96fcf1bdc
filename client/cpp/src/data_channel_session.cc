// DataChannelClient: a session's connections, its calls striped over them, and the reader
// threads that land each answer's bytes in the caller's buffers by offset.
#include <algorithm>
#include <utility>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "attnserve/data_channel_client.h"
#include "client/cpp/src/chunk_order.h"
#include "client/cpp/src/data_channel_tls.h"

namespace attnserve {

using data_channel::DataConnection;
using data_channel::FrameHeader;

struct DataChannelClient::PendingCall {
  std::mutex mu;
  std::condition_variable cv;
  bool accepted = false;
  bool responded = false;
  v1::DataResponse response;
  absl::Status failure;
  std::vector<absl::Span<char>> answer;
  int64_t answer_bytes = 0;
  int64_t received = 0;

  // The answer is complete, or the call failed (mu held).
  bool Finished() const {
    return !failure.ok() ||
           (responded && (response.code() != 0 || received >= response.payload_bytes()));
  }
};

namespace {

constexpr absl::Duration kHelloTimeout = absl::Seconds(10);

absl::Status FromCode(int code, const std::string& message) {
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

// The pieces of `parts` (laid end to end) that cover [offset, offset + length).
template <typename Part, typename Visit>
void ForRange(const std::vector<Part>& parts, uint64_t offset, uint64_t length, Visit visit) {
  uint64_t start = 0;
  for (const Part& part : parts) {
    const uint64_t end = start + part.size();
    if (end > offset && start < offset + length) {
      const uint64_t from = std::max(offset, start), to = std::min(offset + length, end);
      visit(part.data() + (from - start), static_cast<size_t>(to - from));
    }
    start = end;
  }
}

v1::Tensor Meta(const v1::Tensor& tensor) {
  v1::Tensor meta;
  meta.set_dtype(tensor.dtype());
  *meta.mutable_shape() = tensor.shape();
  return meta;
}

int64_t Elements(const v1::Tensor& t) {
  int64_t n = 1;
  for (int64_t d : t.shape()) n *= d;
  return n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataChannelClient>> DataChannelClient::Open(
    const DataChannelOptions& options) {
  std::unique_ptr<data_channel::TlsClientContext> tls;
  if (options.tls.enabled) {
    absl::StatusOr<std::unique_ptr<data_channel::TlsClientContext>> made =
        data_channel::TlsClientContext::Create(options.tls);
    if (!made.ok()) return made.status();
    tls = *std::move(made);
  }
  std::unique_ptr<DataChannelClient> client(new DataChannelClient(options));
  const std::string session_id = data_channel::RandomSessionId();
  const v1::DataHello hello = data_channel::MakeHello(session_id, options.bearer_token);
  // What went wrong on the way to HELLO_OK, saying where (a refused client certificate shows
  // only here, as the server's TLS alert, after the client's side of the handshake is done).
  auto failed = [&](const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat("the data channel at ", options.host, ":",
                                                    options.port, ": ", status.message()));
  };
  for (int i = 0; i < std::max(1, options.connections); ++i) {
    absl::StatusOr<std::unique_ptr<DataConnection>> connection = DataConnection::Connect(
        options.host, options.port, kHelloTimeout, tls.get(), options.tls.server_name);
    if (!connection.ok()) return connection.status();
    if (absl::Status s = (*connection)->SendMessage(v1::FRAME_HELLO, 0, hello); !s.ok()) {
      return failed(s);
    }
    absl::StatusOr<data_channel::Frame> answer = (*connection)->ReadFrame(kHelloTimeout);
    if (!answer.ok()) return failed(answer.status());
    if (answer->header.type == v1::FRAME_ERROR) {
      v1::DataError error;
      error.ParseFromString(answer->payload);
      return FromCode(error.code(), error.message());
    }
    v1::DataHelloOk ok;
    if (answer->header.type != v1::FRAME_HELLO_OK || !ok.ParseFromString(answer->payload)) {
      return absl::InternalError("the data channel did not answer HELLO with HELLO_OK");
    }
    client->chunk_bytes_ = std::min(options.chunk_bytes, ok.max_chunk_bytes());
    client->inline_bytes_ = ok.max_inline_bytes();
    client->connections_.push_back(*std::move(connection));
  }
  for (const auto& connection : client->connections_) {
    client->readers_.emplace_back([c = client.get(), raw = connection.get()] { c->ReadLoop(raw); });
  }
  return client;
}

DataChannelClient::~DataChannelClient() {
  for (const auto& connection : connections_) connection->Shutdown();
  for (std::thread& reader : readers_) reader.join();
}

absl::Status DataChannelClient::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

std::shared_ptr<DataChannelClient::PendingCall> DataChannelClient::Find(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = calls_.find(id);
  return it == calls_.end() ? nullptr : it->second;
}

void DataChannelClient::FailAll(const absl::Status& status) {
  std::map<uint64_t, std::shared_ptr<PendingCall>> calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.ok()) broken_ = status;
    calls = calls_;
  }
  for (auto& [id, call] : calls) {
    std::lock_guard<std::mutex> lock(call->mu);
    if (call->failure.ok()) call->failure = status;
    call->cv.notify_all();
  }
}

void DataChannelClient::ReadLoop(DataConnection* connection) {
  while (true) {
    absl::StatusOr<FrameHeader> header = connection->ReadHeader(absl::InfiniteDuration());
    if (!header.ok()) return FailAll(header.status());
    std::shared_ptr<PendingCall> call = Find(header->request_id);
    if (header->type == v1::FRAME_CHUNK) {
      std::string scratch;
      absl::Status read;
      if (call == nullptr || header->offset + header->length > static_cast<uint64_t>(call->answer_bytes)) {
        scratch.resize(header->length);  // an answer nobody waits for (a cancelled call)
        read = connection->ReadInto(scratch.data(), scratch.size(), options_.timeout);
      } else {
        ForRange(call->answer, header->offset, header->length, [&](char* data, size_t size) {
          if (read.ok()) read = connection->ReadInto(data, size, options_.timeout);
        });
      }
      if (!read.ok()) return FailAll(read);
      if (call != nullptr) {
        std::lock_guard<std::mutex> lock(call->mu);
        call->received += static_cast<int64_t>(header->length);
        if (call->Finished()) call->cv.notify_all();
      }
      continue;
    }
    std::string payload(header->length, '\0');
    if (absl::Status s = connection->ReadInto(payload.data(), payload.size(), options_.timeout);
        !s.ok()) {
      return FailAll(s);
    }
    if (header->type == v1::FRAME_ERROR) {
      v1::DataError error;
      error.ParseFromString(payload);
      return FailAll(FromCode(error.code(), absl::StrCat("data channel: ", error.message())));
    }
    if (call == nullptr) continue;
    std::lock_guard<std::mutex> lock(call->mu);
    if (header->type == v1::FRAME_ACCEPTED) {
      call->accepted = true;
    } else if (header->type == v1::FRAME_RESPONSE) {
      call->responded = call->response.ParseFromString(payload);
      if (!call->responded) call->failure = absl::InternalError("unreadable RESPONSE message");
    }
    // The caller wakes once, when it can go on: not for a RESPONSE whose CHUNKs still come.
    if (call->accepted || call->Finished()) call->cv.notify_all();
  }
}

absl::StatusOr<v1::DataResponse> DataChannelClient::Call(
    v1::DataRequest request, const std::vector<absl::string_view>& payload,
    const std::vector<absl::Span<char>>& answer) {
  const uint64_t id = next_id_++;
  auto call = std::make_shared<PendingCall>();
  call->answer = answer;
  for (const absl::Span<char>& part : answer) call->answer_bytes += static_cast<int64_t>(part.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) return broken_;
    calls_.emplace(id, call);
  }
  int64_t total = 0;
  for (absl::string_view part : payload) total += static_cast<int64_t>(part.size());
  request.set_payload_bytes(total);
  request.set_chunk_bytes(chunk_bytes_);
  const bool bounded = options_.timeout != absl::InfiniteDuration();
  // 0 asks for the server's cap: a call without a deadline, as on gRPC.
  request.set_timeout_ms(bounded ? std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.timeout))
                                 : 0);
  request.set_priority(options_.priority);
  // A call without deadline waits a century (absl's infinite time is no chrono time).
  const auto deadline =
      absl::ToChronoTime(absl::Now() + (bounded ? options_.timeout : absl::Hours(24 * 365 * 100)));
  // The chunk at `offset` as parts of one frame: its header (kept in `head`) and its bytes.
  auto chunk_parts = [&](uint64_t offset, std::string& head, std::vector<iovec>& parts) {
    FrameHeader header;
    header.type = v1::FRAME_CHUNK;
    header.request_id = id;
    header.offset = offset;
    header.length = std::min<uint64_t>(chunk_bytes_, total - offset);
    head = data_channel::EncodeHeader(header);
    parts.push_back({head.data(), head.size()});
    ForRange(payload, offset, header.length, [&](const char* data, size_t size) {
      parts.push_back({const_cast<char*>(data), size});
    });
  };
  auto finish = [&](absl::StatusOr<v1::DataResponse> result) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.erase(id);
    return result;
  };

  // Calls take turns over the connections: with every REQUEST and its inline payload on the
  // first one, that connection's server reader carried all small calls alone.
  const size_t home = id % connections_.size();
  const uint64_t chunks = (total + chunk_bytes_ - 1) / chunk_bytes_;
  // A payload the server takes without ACCEPTED goes with its REQUEST, in one sendmsg.
  const bool at_once = total <= chunk_bytes_ || total <= inline_bytes_;
  if (total > chunk_bytes_ && at_once) request.set_inline_payload(true);
  const std::string message = request.SerializeAsString();
  FrameHeader request_header;
  request_header.type = v1::FRAME_REQUEST;
  request_header.request_id = id;
  request_header.length = message.size();
  std::vector<std::string> heads(1 + (at_once ? chunks : 0));
  heads[0] = data_channel::EncodeHeader(request_header);
  std::vector<iovec> parts = {{heads[0].data(), heads[0].size()},
                              {const_cast<char*>(message.data()), message.size()}};
  if (at_once) {
    for (uint64_t i = 0; i < chunks; ++i) chunk_parts(i * chunk_bytes_, heads[1 + i], parts);
  }
  absl::Status sent = connections_[home]->SendParts(std::move(parts));
  if (sent.ok() && !at_once) {
    std::unique_lock<std::mutex> lock(call->mu);
    call->cv.wait_until(lock, deadline, [&] {
      return call->accepted || call->responded || !call->failure.ok();
    });
    if (call->accepted) {
      lock.unlock();
      // The i-th chunk in sending order (ChunkOrder: a large forward's group by group) goes on
      // connection (home + i) mod N, each connection's share from its own thread; the caller's
      // thread sends the home connection's.
      const std::vector<uint64_t> order =
          data_channel::ChunkOrder(request, options_.group_chunks);
      const size_t n = connections_.size();
      std::vector<absl::Status> results(n);
      auto send_share = [&](size_t c) {
        for (size_t i = c; i < order.size() && results[c].ok(); i += n) {
          std::string head;
          std::vector<iovec> chunk;
          chunk_parts(order[i], head, chunk);
          results[c] = connections_[(home + c) % n]->SendParts(std::move(chunk));
        }
      };
      std::vector<std::thread> senders;
      for (size_t c = 1; c < std::min(n, order.size()); ++c) senders.emplace_back(send_share, c);
      send_share(0);
      for (std::thread& t : senders) t.join();
      for (const absl::Status& r : results) sent.Update(r);
    }
  }
  if (!sent.ok()) return finish(sent);

  std::unique_lock<std::mutex> lock(call->mu);
  const bool done =
      call->cv.wait_until(lock, deadline, [&] { return call->Finished(); });
  if (!call->failure.ok()) return finish(call->failure);
  if (!done) {
    lock.unlock();
    FrameHeader cancel;
    cancel.type = v1::FRAME_CANCEL;
    cancel.request_id = id;
    (void)connections_[home]->SendFrame(cancel);
    return finish(absl::DeadlineExceededError("the data channel call timed out"));
  }
  if (call->response.code() != 0) {
    return finish(FromCode(call->response.code(), call->response.message()));
  }
  if (call->response.payload_bytes() != call->answer_bytes) {
    return finish(absl::InternalError(absl::StrCat("the answer carries ",
                                                   call->response.payload_bytes(),
                                                   " bytes; ", call->answer_bytes, " were expected")));
  }
  return finish(std::move(call->response));
}

namespace data_channel {

SplitCall SplitForward(const v1::ForwardRequest& request) {
  SplitCall call;
  v1::ForwardRequest* meta = call.request.mutable_forward();
  const std::tuple<const v1::Tensor*, bool, v1::Tensor* (v1::ForwardRequest::*)()> fields[] = {
      {&request.q(), request.has_q(), &v1::ForwardRequest::mutable_q},
      {&request.k(), request.has_k(), &v1::ForwardRequest::mutable_k},
      {&request.v(), request.has_v(), &v1::ForwardRequest::mutable_v}};
  for (const auto& [tensor, has, mutable_field] : fields) {
    if (!has) continue;
    *(meta->*mutable_field)() = Meta(*tensor);
    call.payload.push_back(tensor->data());
  }
  *meta->mutable_cu_seqlens_q() = request.cu_seqlens_q();
  *meta->mutable_cu_seqlens_k() = request.cu_seqlens_k();
  *meta->mutable_options() = request.options();
  meta->set_keep_context(request.keep_context());
  return call;
}

SplitCall SplitBackward(const v1::BackwardRequest& request) {
  SplitCall call;
  v1::BackwardRequest* meta = call.request.mutable_backward();
  const std::tuple<const v1::Tensor*, bool, v1::Tensor* (v1::BackwardRequest::*)()> fields[] = {
      {&request.dout(), request.has_dout(), &v1::BackwardRequest::mutable_dout},
      {&request.q(), request.has_q(), &v1::BackwardRequest::mutable_q},
      {&request.k(), request.has_k(), &v1::BackwardRequest::mutable_k},
      {&request.v(), request.has_v(), &v1::BackwardRequest::mutable_v},
      {&request.out(), request.has_out(), &v1::BackwardRequest::mutable_out},
      {&request.lse(), request.has_lse(), &v1::BackwardRequest::mutable_lse}};
  for (const auto& [tensor, has, mutable_field] : fields) {
    if (!has) continue;
    *(meta->*mutable_field)() = Meta(*tensor);
    call.payload.push_back(tensor->data());
  }
  *meta->mutable_cu_seqlens_q() = request.cu_seqlens_q();
  *meta->mutable_cu_seqlens_k() = request.cu_seqlens_k();
  *meta->mutable_options() = request.options();
  meta->set_deterministic(request.deterministic());
  meta->set_context_id(request.context_id());
  meta->set_keep_context(request.keep_context());
  return call;
}

}  // namespace data_channel

absl::StatusOr<v1::ForwardResponse> DataChannelClient::Forward(const v1::ForwardRequest& request) {
  data_channel::SplitCall split = data_channel::SplitForward(request);
  // out has q's shape and dtype; lse is float32 [num_heads, total_q].
  const int64_t total_q = request.q().shape_size() > 0 ? request.q().shape(0) : 0;
  const int64_t heads = request.q().shape_size() > 1 ? request.q().shape(1) : 0;
  std::string out(request.q().data().size(), '\0');
  std::string lse(static_cast<size_t>(4 * heads * total_q), '\0');
  absl::StatusOr<v1::DataResponse> response =
      Call(std::move(split.request), split.payload, {absl::MakeSpan(out), absl::MakeSpan(lse)});
  if (!response.ok()) return response.status();
  v1::ForwardResponse result = std::move(*response->mutable_forward());
  result.mutable_out()->set_data(std::move(out));
  result.mutable_lse()->set_data(std::move(lse));
  return result;
}

absl::StatusOr<v1::BackwardResponse> DataChannelClient::Backward(
    const v1::BackwardRequest& request) {
  if (!request.has_k() || !request.has_v()) {
    return absl::InvalidArgumentError(
        "Backward needs k and v to size dk and dv; a backward on a saved context goes through "
        "BackwardOnContext with the forward's k shape");
  }
  return BackwardInto(request, Elements(request.k()), Elements(request.v()));
}

absl::StatusOr<v1::BackwardResponse> DataChannelClient::BackwardOnContext(
    const v1::BackwardRequest& request, const std::vector<int64_t>& k_shape) {
  int64_t kv_elements = 1;
  for (int64_t d : k_shape) kv_elements *= d;
  return BackwardInto(request, kv_elements, kv_elements);
}

absl::StatusOr<v1::BackwardResponse> DataChannelClient::BackwardInto(
    const v1::BackwardRequest& request, int64_t dk_elements, int64_t dv_elements) {
  data_channel::SplitCall split = data_channel::SplitBackward(request);
  // dq, dk, dv have the shapes of q (= dout's), k and v, and dout's dtype (= q's).
  const int64_t item = request.dout().dtype() == v1::DTYPE_FLOAT32 ? 4 : 2;
  std::string dq(static_cast<size_t>(item * Elements(request.dout())), '\0');
  std::string dk(static_cast<size_t>(item * dk_elements), '\0');
  std::string dv(static_cast<size_t>(item * dv_elements), '\0');
  absl::StatusOr<v1::DataResponse> response = Call(
      std::move(split.request), split.payload, {absl::MakeSpan(dq), absl::MakeSpan(dk), absl::MakeSpan(dv)});
  if (!response.ok()) return response.status();
  v1::BackwardResponse result = std::move(*response->mutable_backward());
  result.mutable_dq()->set_data(std::move(dq));
  result.mutable_dk()->set_data(std::move(dk));
  result.mutable_dv()->set_data(std::move(dv));
  return result;
}

}  // namespace attnserve

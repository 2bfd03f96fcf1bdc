// The client side of the bulk data path (proto/attnserve/v1/data_channel.proto): a session of
// N TCP connections (TLS when the server wants it) to a server's data port
// (ServerInfo.data_channel), over which a call's tensor bytes are striped chunk by chunk and its
// answer's bytes come back by offset.
//
// attnserve::Client (client.h) uses it by default; most programs need nothing here.
// DataConnection is one connection at the frame level (tests and tools use it to speak the
// protocol directly); DataChannelClient is the session and its calls, which block: the
// Client's asynchronous calls run them on worker threads.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "attnserve/tls_options.h"
#include "attnserve/v1/data_channel.pb.h"

namespace attnserve {

namespace tls {
class TlsConnection;  // common/tls_connection.h
}  // namespace tls

namespace data_channel {

// As in common/data_channel_wire.h (not installed; data_channel_client.cc checks they agree).
inline constexpr uint32_t kMagic = 0x31504441;  // "ADP1"
inline constexpr size_t kHeaderBytes = 32;

struct FrameHeader {
  uint16_t type = 0;
  uint16_t flags = 0;
  uint64_t request_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

std::string EncodeHeader(const FrameHeader& header, uint32_t magic = kMagic);
// The header of `bytes` (kHeaderBytes of them); INTERNAL when the magic is wrong.
absl::StatusOr<FrameHeader> DecodeHeader(const char* bytes);

struct Frame {
  FrameHeader header;
  std::string payload;
};

class TlsClientContext;  // client/cpp/src/data_channel_tls.h

class DataConnection {
 public:
  // Connects within `timeout` (UNAVAILABLE naming host and port otherwise); with `tls`, then
  // completes a TLS handshake that verifies the server's certificate for `server_name`.
  static absl::StatusOr<std::unique_ptr<DataConnection>> Connect(
      const std::string& host, int port, absl::Duration timeout = absl::Seconds(10),
      const TlsClientContext* tls = nullptr, const std::string& server_name = "");
  ~DataConnection();

  // Sends a header and payload pieces with sendmsg (no copy). Thread-safe: frames never
  // interleave.
  absl::Status SendFrame(const FrameHeader& header, absl::Span<const iovec> payload = {});
  // Sends `parts` laid end to end (encoded frames) with sendmsg, as one unit.
  absl::Status SendParts(std::vector<iovec> parts);
  absl::Status SendMessage(uint16_t type, uint64_t request_id,
                           const google::protobuf::MessageLite& message);
  absl::Status SendRaw(absl::string_view bytes);

  // Reading is for one thread at a time. UNAVAILABLE when the server closed the connection.
  absl::StatusOr<FrameHeader> ReadHeader(absl::Duration timeout);
  absl::Status ReadInto(char* out, size_t size, absl::Duration timeout);
  // A whole frame with its payload (message frames; CHUNKs too, for tests).
  absl::StatusOr<Frame> ReadFrame(absl::Duration timeout);

  // Wakes a blocked reader; later calls fail.
  void Shutdown();

 private:
  explicit DataConnection(int fd);
  const int fd_;
  std::unique_ptr<tls::TlsConnection> tls_;  // null: plain TCP
  std::mutex send_mu_;
};

// A call split for the data path: its REQUEST message (tensors with dtype and shape, no
// data) and its payload, views of the request's tensor bytes in the order they travel.
struct SplitCall {
  v1::DataRequest request;
  std::vector<absl::string_view> payload;
};
// The views point into `request`, which must outlive the result.
SplitCall SplitForward(const v1::ForwardRequest& request);
SplitCall SplitBackward(const v1::BackwardRequest& request);

// A HELLO frame's message for `session_id` (16 bytes) and `token` (empty: none).
v1::DataHello MakeHello(const std::string& session_id, const std::string& token);
std::string RandomSessionId();

}  // namespace data_channel

struct DataChannelOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  int connections = 1;
  std::string bearer_token;
  int64_t chunk_bytes = int64_t{4} << 20;  // clamped to the server's max_chunk_bytes
  // Per call; InfiniteDuration: none (the server's own cap applies).
  absl::Duration timeout = absl::Seconds(60);
  std::string priority;  // "high", "normal", "low"; empty: normal
  // Send a large multi-sequence forward's chunks group by group, in the order the server
  // computes its groups of sequences (data_channel.proto, "Groups"), so it starts early;
  // false: payload order.
  bool group_chunks = true;
  // TLS (the server's DataChannelInfo.tls) with these files, as the gRPC channel's: every
  // connection's handshake verifies the server's certificate against root_certificates_file
  // (empty: the system's roots) and server_name (empty: `host`), and presents the client
  // certificate when one is given (mTLS).
  TlsOptions tls;
};

class DataChannelClient {
 public:
  // Connects `options.connections` connections of one new session and says HELLO on each.
  static absl::StatusOr<std::unique_ptr<DataChannelClient>> Open(const DataChannelOptions& options);
  ~DataChannelClient();

  // The tensor bytes travel from the request's own Tensor.data fields and arrive into the
  // response's (as on gRPC); the request is copied once without them for its REQUEST frame.
  // Backward needs k and v (INVALID_ARGUMENT otherwise) to size dk and dv.
  absl::StatusOr<v1::ForwardResponse> Forward(const v1::ForwardRequest& request);
  absl::StatusOr<v1::BackwardResponse> Backward(const v1::BackwardRequest& request);
  // A backward on a saved context (request.context_id, and dout): dk and dv are sized from
  // the forward's k shape [total_k, num_heads_k, head_dim], which the request does not carry.
  absl::StatusOr<v1::BackwardResponse> BackwardOnContext(const v1::BackwardRequest& request,
                                                         const std::vector<int64_t>& k_shape);

  // The general call: `request` without tensor data, its payload as pieces laid end to end,
  // and buffers for the answer's tensor bytes laid end to end (sized from the shapes the
  // caller expects). Returns the RESPONSE message (its status turned into the error).
  absl::StatusOr<v1::DataResponse> Call(v1::DataRequest request,
                                        const std::vector<absl::string_view>& payload,
                                        const std::vector<absl::Span<char>>& answer);

  int connections() const { return static_cast<int>(connections_.size()); }
  // Why the session failed (a connection closed or broke, or the server sent ERROR); OK while
  // it works. Once failed, every call fails with this: open a new session.
  absl::Status broken() const;

 private:
  struct PendingCall;
  explicit DataChannelClient(const DataChannelOptions& options) : options_(options) {}
  void ReadLoop(data_channel::DataConnection* connection);
  void FailAll(const absl::Status& status);
  std::shared_ptr<PendingCall> Find(uint64_t id);
  absl::StatusOr<v1::BackwardResponse> BackwardInto(const v1::BackwardRequest& request,
                                                    int64_t dk_elements, int64_t dv_elements);

  const DataChannelOptions options_;
  int64_t chunk_bytes_ = 0;
  int64_t inline_bytes_ = 0;  // DataHelloOk.max_inline_bytes
  std::vector<std::unique_ptr<data_channel::DataConnection>> connections_;
  std::vector<std::thread> readers_;
  std::atomic<uint64_t> next_id_{1};
  mutable std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<PendingCall>> calls_;
  absl::Status broken_;  // set once the session failed (mu_)
};

}  // namespace attnserve

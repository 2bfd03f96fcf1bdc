// One data channel connection: a reader thread that takes HELLO and then the client's frames
// (payload bytes go straight from the socket into their request's buffer), and a writer
// thread that sends the frames queued for it, so an engine answer thread never blocks on a
// socket.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "server/transport/data/byte_stream.h"
#include "server/transport/data/data_context.h"
#include "server/transport/data/frame.h"
#include "server/transport/data/out_frame.h"

namespace attnserve::transport::data {

class DataServer;
class Session;

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // Takes ownership of the connected socket `fd` and of `stream`, which reads and writes it.
  Connection(int fd, std::unique_ptr<ByteStream> stream, DataServer* server,
             DataContext* context);
  ~Connection();

  // Starts both threads; they keep the connection alive until they end. Throws
  // std::system_error when no thread can be started.
  void Start();
  void Push(OutFrame frame);
  // Queues `frames` together, with one wakeup of the writer.
  void Push(std::vector<OutFrame> frames);
  // The connection leaves its session: no more frames will be pushed by it; returns the
  // queued ones (not its final ERROR) so the session can send them elsewhere.
  std::vector<OutFrame> Retire();
  // Wakes both threads; the connection closes (server stop).
  void Shutdown();

 private:
  void ReadLoop();
  void WriteLoop();
  // Serves frames until the connection ends: OK when the peer left, else the status its ERROR
  // frame carries.
  absl::Status Serve();
  absl::Status Hello();
  absl::Status HandleRequest(const FrameHeader& header);
  absl::Status HandleChunk(const FrameHeader& header);
  // The status a refused REQUEST is answered with; OK when it was admitted.
  absl::Status Admit(uint64_t request_id, const v1::DataRequest& request, const char* rpc,
                     absl::Time start);
  // A failed read as what ends the connection: a timeout violation, or OK with peer_gone_
  // set when the peer left (or the server is stopping).
  absl::Status ReadEnding(const absl::Status& read);
  std::shared_ptr<Session> session();

  const int fd_;
  const std::unique_ptr<ByteStream> stream_;
  bool peer_gone_ = false;  // reader thread only
  DataServer* const server_;
  DataContext* const context_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<OutFrame> queue_;
  std::shared_ptr<Session> session_;
  bool retired_ = false;
  bool stopping_ = false;
};

}  // namespace attnserve::transport::data

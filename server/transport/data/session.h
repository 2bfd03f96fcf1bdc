// A data channel session: the connections that presented one session id, and the requests
// in progress on them. Requests are keyed by the client's request_id; their chunks may come
// on any connection of the session, and their responses are spread over all of them.
// Thread-safe: connection threads and engine answer threads call in.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attnserve/v1/data_channel.pb.h"
#include "server/engine/sequence_groups.h"
#include "server/transport/data/chunk_tracker.h"
#include "server/transport/data/data_context.h"
#include "server/transport/data/group_tracker.h"
#include "server/transport/data/out_frame.h"
#include "server/transport/data/request_plan.h"

namespace attnserve::transport::data {

class Connection;

// One request: from its accepted REQUEST through its payload and the engine's answer.
struct DataCall {
  DataCall(DataContext* context, uint64_t id, const char* rpc, absl::Time start)
      : context(context), id(id), rpc(rpc), start(start) {}
  ~DataCall() { ReleaseBuffer(); }
  // The call's buffers go back (the receive buffer out of the budget) once neither the engine
  // nor the response's frames use them.
  void ReleaseBuffer();

  DataContext* const context;
  const uint64_t id;
  const char* const rpc;
  const absl::Time start;  // when its REQUEST arrived
  PlannedCall plan;
  std::unique_ptr<engine::HostBuffer> buffer;  // plan.payload_bytes, reserved in the budget
  // Where the engine writes the outputs: over the inputs they replace in `buffer` where shapes
  // match, else in `response_buffer`. Both live until the response is sent.
  engine::OutputSpace outputs;
  std::unique_ptr<engine::HostBuffer> response_buffer;
  // A backward on a context: dk's and dv's buffers, which the engine asks for once it knows
  // their size (each of context_k_bytes) while the job is enqueued.
  std::unique_ptr<engine::HostBuffer> context_outputs[2];
  size_t context_k_bytes = 0;
  std::unique_ptr<SlotLease> lease;
  std::optional<ChunkTracker> tracker;
  // A call large enough to run by groups of sequences: which groups are in, and the
  // engine's view of it. The call goes to the engine when its first group is complete.
  std::optional<GroupTracker> group_tracker;
  std::shared_ptr<engine::SequenceGroups> groups;
  // A grouped call's answer once its first group's output rows went out ahead of the RESPONSE
  // (session lock): the response their CHUNKs belong to, and the byte ranges sent. The RESPONSE
  // takes it over (it holds `this` alive: Answer breaks the cycle).
  std::shared_ptr<OutboundResponse> streamed;
  // For attnserve_data_overlap_seconds: the hand-over to the engine (Run), the last payload
  // byte and the first group's output rows queued (session lock).
  absl::Time ran = absl::InfiniteFuture();
  absl::Time arrived = absl::InfinitePast();
  absl::Time first_streamed = absl::InfiniteFuture();
  std::vector<std::pair<uint64_t, uint64_t>> streamed_ranges;
  absl::Time transfer_deadline;
  std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
  bool running = false;  // the engine has it (session lock); its payload may still arrive
};

// The response message and the tensor bytes its CHUNKs carry.
struct ResponseParts {
  v1::DataResponse message;
  std::vector<ResponseTensor> tensors;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  // `principal`: who the session's token names (Authenticator::Principal); it owns the saved
  // contexts the session's calls keep, as on gRPC.
  Session(std::string id, std::string principal, DataContext* context);

  const std::string& principal() const { return principal_; }

  // FAILED_PRECONDITION when the session has ended (the caller starts a new one),
  // RESOURCE_EXHAUSTED when it has max_connections_per_session.
  absl::Status Join(std::shared_ptr<Connection> connection);
  // The connection's unsent frames go to the others; true when it was the last, which ends
  // the session: its requests are cancelled and their buffers freed.
  bool Leave(Connection* connection);
  // Spreads frames over the live connections (dropped when there are none).
  void Send(std::vector<OutFrame> frames);

  // A violation when `id` names a request in progress.
  absl::Status CheckIdFree(uint64_t id);
  // RESOURCE_EXHAUSTED at max_requests_per_session, UNAVAILABLE when the session has ended.
  absl::Status Register(std::shared_ptr<DataCall> call);
  // Chunks still on their way for a refused, cancelled or failed request are dropped.
  void Tombstone(uint64_t id);
  // The call whose buffer the CHUNK fills, null when its bytes are to be dropped, or a
  // violation (unknown request, wrong range or length, repeat).
  absl::StatusOr<std::shared_ptr<DataCall>> ClaimChunk(uint64_t id, uint64_t offset,
                                                       uint64_t length);
  // A claimed chunk's bytes are in; the last one, or for a grouped call the first that
  // completes a group, hands the call to the engine.
  void ChunkArrived(const std::shared_ptr<DataCall>& call, uint64_t offset, uint64_t length);
  // Answers a receiving call with `status` and forgets it.
  void Fail(const std::shared_ptr<DataCall>& call, const absl::Status& status);
  void Cancel(uint64_t id);
  // Fails calls whose payload missed its transfer deadline.
  void ExpireTransfers(absl::Time now);

 private:
  // call_runner.cc: hands a call to the engine, and sends its answer.
  absl::Time Deadline(const DataCall& call) const;
  void Run(const std::shared_ptr<DataCall>& call);
  void Answer(const std::shared_ptr<DataCall>& call, absl::StatusOr<ResponseParts> parts);
  // The engine finished `group` of a grouped forward: its out rows go out as CHUNKs now.
  void SendGroup(const std::shared_ptr<DataCall>& call, int group);
  // Forgets `call` if it is still in progress; whether it was.
  bool Forget(const std::shared_ptr<DataCall>& call, bool tombstone);

  const std::string id_;
  const std::string principal_;
  DataContext* const context_;
  std::mutex mu_;
  std::vector<std::shared_ptr<Connection>> connections_;
  size_t next_connection_ = 0;
  bool ended_ = false;
  std::map<uint64_t, std::shared_ptr<DataCall>> calls_;
  std::set<uint64_t> tombstones_;
  std::deque<uint64_t> tombstone_order_;
};

}  // namespace attnserve::transport::data

// The tools' calls over the data channel with answer buffers the caller keeps and reuses, so a
// load measures the transport and not the allocation (and zeroing) of fresh answers; and the
// backward on a saved context, which DataChannelClient::Backward cannot size (only dout is
// sent, so dk and dv take their shapes from the forward).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "attnserve/data_channel_client.h"
#include "attnserve/v1/attention.pb.h"

namespace attnserve::tools {

// Answer tensors' bytes: out and lse of a forward, or dq, dk and dv of a backward.
struct AnswerBuffers {
  std::string first, second, third;
};

// Request plus answer tensor bytes of a call.
int64_t ForwardPayloadBytes(const v1::ForwardRequest& request);
int64_t BackwardPayloadBytes(const v1::BackwardRequest& request);
// Of a backward on `forward`'s context: dout there, dq, dk and dv back.
int64_t ContextBackwardPayloadBytes(const v1::ForwardRequest& forward, const v1::Tensor& dout);

// A forward (keeping its context when `keep_context`); out and lse land in answer.first and
// answer.second. Returns the RESPONSE (execution, context_id; tensors without data).
absl::StatusOr<v1::DataResponse> DataForward(DataChannelClient& client,
                                             const v1::ForwardRequest& request, bool keep_context,
                                             AnswerBuffers& answer);
// A backward sent in full; dq, dk, dv land in the answer's buffers.
absl::StatusOr<v1::DataResponse> DataBackward(DataChannelClient& client,
                                              const v1::BackwardRequest& request,
                                              AnswerBuffers& answer);
// A backward on the context `context_id` that `forward` left: only dout travels. NOT_FOUND
// when the server no longer holds it (the caller then sends the backward in full).
absl::StatusOr<v1::DataResponse> DataBackwardOnContext(DataChannelClient& client,
                                                       const v1::ForwardRequest& forward,
                                                       const std::string& context_id,
                                                       const v1::Tensor& dout,
                                                       AnswerBuffers& answer);

// The gRPC-shaped answers, their data copied from the buffers (for checks and printing).
v1::ForwardResponse ToForwardResponse(const v1::DataResponse& response,
                                      const AnswerBuffers& answer);
v1::BackwardResponse ToBackwardResponse(const v1::DataResponse& response,
                                        const AnswerBuffers& answer);

}  // namespace attnserve::tools

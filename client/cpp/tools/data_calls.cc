#include "tools/data_calls.h"

#include <vector>

namespace attnserve::tools {
namespace {

int64_t LseBytes(const v1::Tensor& q) {
  // lse is float32 [num_heads, total_q].
  return q.shape_size() > 1 ? 4 * q.shape(0) * q.shape(1) : 0;
}

std::vector<absl::Span<char>> Spans(AnswerBuffers& answer, int64_t first, int64_t second,
                                    int64_t third) {
  // resize keeps a buffer of the same size as it is: a reused buffer costs nothing.
  answer.first.resize(first);
  answer.second.resize(second);
  answer.third.resize(third);
  return {absl::MakeSpan(answer.first), absl::MakeSpan(answer.second),
          absl::MakeSpan(answer.third)};
}

}  // namespace

int64_t ForwardPayloadBytes(const v1::ForwardRequest& r) {
  return r.q().data().size() + r.k().data().size() + r.v().data().size() +
         r.q().data().size() + LseBytes(r.q());
}

int64_t BackwardPayloadBytes(const v1::BackwardRequest& r) {
  const int64_t sent = r.dout().data().size() + r.q().data().size() + r.k().data().size() +
                       r.v().data().size() + r.out().data().size() + r.lse().data().size();
  return sent + r.q().data().size() + r.k().data().size() + r.v().data().size();
}

int64_t ContextBackwardPayloadBytes(const v1::ForwardRequest& f, const v1::Tensor& dout) {
  return dout.data().size() + f.q().data().size() + f.k().data().size() + f.v().data().size();
}

absl::StatusOr<v1::DataResponse> DataForward(DataChannelClient& client,
                                             const v1::ForwardRequest& request, bool keep_context,
                                             AnswerBuffers& answer) {
  data_channel::SplitCall split = data_channel::SplitForward(request);
  split.request.mutable_forward()->set_keep_context(keep_context);
  return client.Call(std::move(split.request), split.payload,
                     Spans(answer, request.q().data().size(), LseBytes(request.q()), 0));
}

absl::StatusOr<v1::DataResponse> DataBackward(DataChannelClient& client,
                                              const v1::BackwardRequest& request,
                                              AnswerBuffers& answer) {
  data_channel::SplitCall split = data_channel::SplitBackward(request);
  return client.Call(std::move(split.request), split.payload,
                     Spans(answer, request.q().data().size(), request.k().data().size(),
                           request.v().data().size()));
}

absl::StatusOr<v1::DataResponse> DataBackwardOnContext(DataChannelClient& client,
                                                       const v1::ForwardRequest& forward,
                                                       const std::string& context_id,
                                                       const v1::Tensor& dout,
                                                       AnswerBuffers& answer) {
  v1::DataRequest request;
  v1::BackwardRequest* backward = request.mutable_backward();
  backward->set_context_id(context_id);
  backward->mutable_dout()->set_dtype(dout.dtype());
  *backward->mutable_dout()->mutable_shape() = dout.shape();
  return client.Call(std::move(request), {dout.data()},
                     Spans(answer, forward.q().data().size(), forward.k().data().size(),
                           forward.v().data().size()));
}

v1::ForwardResponse ToForwardResponse(const v1::DataResponse& response,
                                      const AnswerBuffers& answer) {
  v1::ForwardResponse result = response.forward();
  result.mutable_out()->set_data(answer.first);
  result.mutable_lse()->set_data(answer.second);
  return result;
}

v1::BackwardResponse ToBackwardResponse(const v1::DataResponse& response,
                                        const AnswerBuffers& answer) {
  v1::BackwardResponse result = response.backward();
  result.mutable_dq()->set_data(answer.first);
  result.mutable_dk()->set_data(answer.second);
  result.mutable_dv()->set_data(answer.third);
  return result;
}

}  // namespace attnserve::tools

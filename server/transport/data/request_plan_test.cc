#include "server/transport/data/request_plan.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::transport::data {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMaxChunk = 16 << 20;

void SetTensor(v1::Tensor* t, v1::DType dtype, std::vector<int64_t> shape) {
  t->set_dtype(dtype);
  for (int64_t d : shape) t->add_shape(d);
}

// 10 query and 6 key tokens, 4 heads (2 kv heads) of 8: q 640 bytes, k and v 192 each (fp16).
v1::DataRequest Forward() {
  v1::DataRequest request;
  v1::ForwardRequest* f = request.mutable_forward();
  SetTensor(f->mutable_q(), v1::DTYPE_FLOAT16, {10, 4, 8});
  SetTensor(f->mutable_k(), v1::DTYPE_FLOAT16, {6, 2, 8});
  SetTensor(f->mutable_v(), v1::DTYPE_FLOAT16, {6, 2, 8});
  for (int32_t c : {0, 4, 10}) f->add_cu_seqlens_q(c);
  for (int32_t c : {0, 3, 6}) f->add_cu_seqlens_k(c);
  request.set_payload_bytes(640 + 192 + 192);
  request.set_chunk_bytes(65536);
  return request;
}

TEST(RequestPlanTest, LaysTensorsEndToEndAndPointsViewsIntoThePayload) {
  absl::StatusOr<PlannedCall> plan = PlanCall(Forward(), engine::Limits(), kMaxChunk);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->backward());
  EXPECT_EQ(plan->payload_bytes, 1024);
  ASSERT_EQ(plan->slices.size(), 3u);
  EXPECT_EQ(plan->slices[1].offset, 640);
  EXPECT_EQ(plan->slices[2].offset, 832);
  std::vector<char> payload(1024);
  plan->PointInto(payload.data());
  const auto& inputs = std::get<engine::ForwardInputs>(plan->inputs);
  EXPECT_EQ(inputs.q.data, payload.data());
  EXPECT_EQ(inputs.v.data, payload.data() + 832);
  EXPECT_EQ(inputs.v.size_bytes, 192u);
}

TEST(RequestPlanTest, BackwardCountsEveryTensor) {
  v1::DataRequest request;
  v1::BackwardRequest* b = request.mutable_backward();
  for (v1::Tensor* t : {b->mutable_dout(), b->mutable_q(), b->mutable_out()}) {
    SetTensor(t, v1::DTYPE_FLOAT32, {3, 2, 4});
  }
  SetTensor(b->mutable_k(), v1::DTYPE_FLOAT32, {5, 2, 4});
  SetTensor(b->mutable_v(), v1::DTYPE_FLOAT32, {5, 2, 4});
  SetTensor(b->mutable_lse(), v1::DTYPE_FLOAT32, {2, 3});
  for (int32_t c : {0, 3}) b->add_cu_seqlens_q(c);
  for (int32_t c : {0, 5}) b->add_cu_seqlens_k(c);
  request.set_payload_bytes(3 * 96 + 2 * 160 + 24);
  request.set_chunk_bytes(65536);
  absl::StatusOr<PlannedCall> plan = PlanCall(request, engine::Limits(), kMaxChunk);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->backward());
  EXPECT_EQ(plan->slices.back().offset, 3 * 96 + 2 * 160);
}

struct Refusal {
  const char* what;
  std::function<void(v1::DataRequest&, engine::Limits&)> change;
  absl::StatusCode code;
  const char* message;
};

TEST(RequestPlanTest, RefusesBeforeAnyPayloadNamingTheField) {
  const std::vector<Refusal> cases = {
      {"no call", [](v1::DataRequest& r, engine::Limits&) { r.clear_call(); },
       absl::StatusCode::kInvalidArgument, "set forward or backward"},
      {"data inline",
       [](v1::DataRequest& r, engine::Limits&) { r.mutable_forward()->mutable_k()->set_data("x"); },
       absl::StatusCode::kInvalidArgument, "k.data: must be empty"},
      {"payload mismatch", [](v1::DataRequest& r, engine::Limits&) { r.set_payload_bytes(1023); },
       absl::StatusCode::kInvalidArgument, "payload_bytes: 1023 does not match"},
      {"over max_message_bytes",
       [](v1::DataRequest&, engine::Limits& l) { l.max_message_bytes = 1000; },
       absl::StatusCode::kResourceExhausted, "max_message_bytes = 1000"},
      {"overflowing shape",
       [](v1::DataRequest& r, engine::Limits&) {
         v1::Tensor* q = r.mutable_forward()->mutable_q();
         q->clear_shape();
         for (int64_t d : {int64_t{1} << 40, int64_t{1} << 40, int64_t{4}}) q->add_shape(d);
       },
       absl::StatusCode::kResourceExhausted, "q: shape"},
      {"negative dimension",
       [](v1::DataRequest& r, engine::Limits&) { r.mutable_forward()->mutable_v()->set_shape(0, -6); },
       absl::StatusCode::kInvalidArgument, "v.shape: dimensions must be non-negative"},
      {"chunk too small", [](v1::DataRequest& r, engine::Limits&) { r.set_chunk_bytes(4096); },
       absl::StatusCode::kInvalidArgument, "chunk_bytes: 4096"},
      {"chunk too large", [](v1::DataRequest& r, engine::Limits&) { r.set_chunk_bytes(kMaxChunk + 1); },
       absl::StatusCode::kInvalidArgument, "max_chunk_bytes"},
      {"negative timeout", [](v1::DataRequest& r, engine::Limits&) { r.set_timeout_ms(-1); },
       absl::StatusCode::kInvalidArgument, "timeout_ms"},
      {"priority", [](v1::DataRequest& r, engine::Limits&) { r.set_priority("urgent"); },
       absl::StatusCode::kInvalidArgument, "urgent"},
      {"engine validation",
       [](v1::DataRequest& r, engine::Limits&) { r.mutable_forward()->set_cu_seqlens_q(2, 9); },
       absl::StatusCode::kInvalidArgument, "cu_seqlens_q"},
      {"engine limit", [](v1::DataRequest&, engine::Limits& l) { l.max_head_dim = 4; },
       absl::StatusCode::kResourceExhausted, "max_head_dim"},
  };
  for (const Refusal& c : cases) {
    SCOPED_TRACE(c.what);
    v1::DataRequest request = Forward();
    engine::Limits limits;
    c.change(request, limits);
    absl::StatusOr<PlannedCall> plan = PlanCall(request, limits, kMaxChunk);
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), c.code) << plan.status();
    EXPECT_THAT(std::string(plan.status().message()), HasSubstr(c.message));
  }
}

TEST(RequestPlanTest, TimeoutAndPriorityCarryOver) {
  v1::DataRequest request = Forward();
  request.set_timeout_ms(1500);
  request.set_priority("high");
  absl::StatusOr<PlannedCall> plan = PlanCall(request, engine::Limits(), kMaxChunk);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->timeout, absl::Milliseconds(1500));
  EXPECT_EQ(plan->priority, engine::Priority::kHigh);
}

}  // namespace
}  // namespace attnserve::transport::data

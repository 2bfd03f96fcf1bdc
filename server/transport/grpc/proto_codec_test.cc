#include "server/transport/grpc/proto_codec.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::transport {
namespace {

using ::testing::HasSubstr;

v1::Tensor MakeTensor(v1::DType dtype, std::vector<int64_t> shape, size_t bytes) {
  v1::Tensor t;
  t.set_dtype(dtype);
  t.mutable_shape()->Assign(shape.begin(), shape.end());
  t.set_data(std::string(bytes, '\2'));
  return t;
}

v1::ForwardRequest MakeForward() {
  v1::ForwardRequest r;
  *r.mutable_q() = MakeTensor(v1::DTYPE_FLOAT16, {4, 2, 8}, 128);
  *r.mutable_k() = MakeTensor(v1::DTYPE_FLOAT16, {6, 1, 8}, 96);
  *r.mutable_v() = MakeTensor(v1::DTYPE_FLOAT16, {6, 1, 8}, 96);
  for (int x : {0, 4}) r.add_cu_seqlens_q(x);
  for (int x : {0, 6}) r.add_cu_seqlens_k(x);
  r.mutable_options()->set_causal(true);
  r.mutable_options()->set_window_left(3);
  r.mutable_options()->set_softcap(30);
  return r;
}

TEST(ProtoCodecTest, DecodesViewsIntoTheRequestBytes) {
  const v1::ForwardRequest request = MakeForward();
  absl::StatusOr<engine::ForwardInputs> in = DecodeForward(request);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->q.data, request.q().data().data());  // no copy
  EXPECT_EQ(in->q.size_bytes, 128u);
  EXPECT_EQ(in->q.dtype, engine::DType::kFloat16);
  EXPECT_EQ(in->k.shape, (std::vector<int64_t>{6, 1, 8}));
  EXPECT_EQ(in->cu_seqlens_k, (std::vector<int32_t>{0, 6}));
  EXPECT_TRUE(in->options.causal);
  EXPECT_EQ(in->options.window_left, 3);
  EXPECT_FALSE(in->options.window_right.has_value());  // absent = unbounded
  EXPECT_EQ(in->options.softcap, 30.0f);
  EXPECT_EQ(TensorBytes(request), 320);
}

TEST(ProtoCodecTest, RejectsUnspecifiedAndUnknownDTypes) {
  v1::ForwardRequest request = MakeForward();
  request.mutable_q()->set_dtype(v1::DTYPE_UNSPECIFIED);
  absl::Status s = DecodeForward(request).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("q.dtype"));
  request = MakeForward();
  request.mutable_v()->set_dtype(static_cast<v1::DType>(42));
  s = DecodeForward(request).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("v.dtype"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("42"));
}

TEST(ProtoCodecTest, BackwardNamesItsTensors) {
  v1::BackwardRequest request;
  *request.mutable_dout() = MakeTensor(v1::DTYPE_FLOAT32, {1, 1, 1}, 4);
  *request.mutable_q() = MakeTensor(v1::DTYPE_FLOAT32, {1, 1, 1}, 4);
  *request.mutable_k() = MakeTensor(v1::DTYPE_FLOAT32, {1, 1, 1}, 4);
  *request.mutable_v() = MakeTensor(v1::DTYPE_FLOAT32, {1, 1, 1}, 4);
  *request.mutable_out() = MakeTensor(v1::DTYPE_FLOAT32, {1, 1, 1}, 4);
  request.mutable_lse();  // set, with an UNSPECIFIED dtype
  absl::Status s = DecodeBackward(request).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("lse.dtype"));
  *request.mutable_lse() = MakeTensor(v1::DTYPE_FLOAT32, {1, 1}, 4);
  request.set_deterministic(true);
  absl::StatusOr<engine::BackwardInputs> in = DecodeBackward(request);
  ASSERT_TRUE(in.ok());
  EXPECT_TRUE(in->deterministic);
  EXPECT_FALSE(in->lse.absent());
  EXPECT_TRUE(in->context_id.empty());
}

TEST(ProtoCodecTest, UnsetBackwardTensorsAreAbsentViews) {
  v1::BackwardRequest request;
  *request.mutable_dout() = MakeTensor(v1::DTYPE_FLOAT32, {1, 1, 1}, 4);
  request.set_context_id("abc");
  request.set_keep_context(true);
  absl::StatusOr<engine::BackwardInputs> in = DecodeBackward(request);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_FALSE(in->dout.absent());
  for (const engine::TensorView* t : {&in->q, &in->k, &in->v, &in->out, &in->lse}) {
    EXPECT_TRUE(t->absent());
    EXPECT_EQ(t->data, nullptr);
    EXPECT_TRUE(t->shape.empty());
  }
  EXPECT_EQ(in->context_id, "abc");
  EXPECT_TRUE(in->keep_context);
  // Set but empty (shape [], no bytes) is present, not absent.
  *request.mutable_q() = MakeTensor(v1::DTYPE_FLOAT32, {}, 0);
  in = DecodeBackward(request);
  ASSERT_TRUE(in.ok());
  EXPECT_FALSE(in->q.absent());
}

TEST(ProtoCodecTest, ForwardCarriesKeepContextAndAnswersItsId) {
  v1::ForwardRequest request = MakeForward();
  request.set_keep_context(true);
  absl::StatusOr<engine::ForwardInputs> in = DecodeForward(request);
  ASSERT_TRUE(in.ok());
  EXPECT_TRUE(in->keep_context);
  engine::ForwardResult result;
  result.context_id = "0123abcd";
  v1::ForwardResponse response;
  EncodeForward(std::move(result), &response);
  EXPECT_EQ(response.context_id(), "0123abcd");
}

TEST(ProtoCodecTest, EncodeMovesResultBytes) {
  engine::ForwardResult result;
  result.out = {engine::DType::kBFloat16, {2, 1, 4}, std::string(16, 'x')};
  result.lse = {engine::DType::kFloat32, {1, 2}, std::string(8, 'y')};
  result.execution = {"cpu", "reference", 5, 7, 1};
  v1::ForwardResponse response;
  EXPECT_EQ(EncodeForward(std::move(result), &response), 24);
  EXPECT_EQ(response.out().dtype(), v1::DTYPE_BFLOAT16);
  EXPECT_EQ(response.out().data(), std::string(16, 'x'));
  EXPECT_EQ(response.lse().shape_size(), 2);
  EXPECT_EQ(response.execution().kernel(), "reference");
  EXPECT_EQ(response.execution().compute_us(), 7);
}

}  // namespace
}  // namespace attnserve::transport

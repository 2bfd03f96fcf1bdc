#include "server/engine/request_validation.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::engine {
namespace {

using ::testing::HasSubstr;

// A valid request of the given sizes whose views point into buffers the fixture owns.
class ValidationTest : public ::testing::Test {
 protected:
  TensorView View(std::string& buffer, DType dtype, std::vector<int64_t> shape) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    buffer.assign(count * kernels::DTypeSize(dtype), '\1');
    return {dtype, std::move(shape), buffer.data(), buffer.size()};
  }

  ForwardInputs Forward(int64_t total_q = 10, int64_t total_k = 12, int64_t heads = 4,
                        int64_t heads_k = 2, int64_t dim = 8, DType dtype = DType::kBFloat16) {
    ForwardInputs in;
    in.q = View(q_, dtype, {total_q, heads, dim});
    in.k = View(k_, dtype, {total_k, heads_k, dim});
    in.v = View(v_, dtype, {total_k, heads_k, dim});
    in.cu_seqlens_q = {0, 3, static_cast<int32_t>(total_q)};
    in.cu_seqlens_k = {0, 5, static_cast<int32_t>(total_k)};
    return in;
  }

  BackwardInputs Backward() {
    ForwardInputs f = Forward();
    BackwardInputs in;
    in.q = f.q;
    in.k = f.k;
    in.v = f.v;
    in.cu_seqlens_q = f.cu_seqlens_q;
    in.cu_seqlens_k = f.cu_seqlens_k;
    in.dout = View(dout_, DType::kBFloat16, {10, 4, 8});
    in.out = View(out_, DType::kBFloat16, {10, 4, 8});
    in.lse = View(lse_, DType::kFloat32, {4, 10});
    return in;
  }

  static void ExpectInvalid(const absl::Status& s, const std::string& field) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(field));
  }

  Limits limits_;
  std::string q_, k_, v_, dout_, out_, lse_;
};

TEST_F(ValidationTest, AcceptsValidRequests) {
  EXPECT_TRUE(ValidateForward(Forward(), limits_).ok());
  EXPECT_TRUE(ValidateBackward(Backward(), limits_).ok());
  EXPECT_TRUE(ValidateForward(Forward(10, 12, 4, 1, 8, DType::kFloat32), limits_).ok());  // MQA
}

TEST_F(ValidationTest, AcceptsEmptyBatchAndEmptySequences) {
  ForwardInputs in = Forward(0, 0);
  in.cu_seqlens_q = {0};
  in.cu_seqlens_k = {0};
  EXPECT_TRUE(ValidateForward(in, limits_).ok());
  in = Forward(5, 0);
  in.cu_seqlens_q = {0, 0, 5};
  in.cu_seqlens_k = {0, 0, 0};
  EXPECT_TRUE(ValidateForward(in, limits_).ok());
}

TEST_F(ValidationTest, RejectsWrongRank) {
  ForwardInputs in = Forward();
  in.q.shape = {10, 32};
  ExpectInvalid(ValidateForward(in, limits_), "q.shape");
}

TEST_F(ValidationTest, RejectsNegativeDimension) {
  ForwardInputs in = Forward();
  in.k.shape[0] = -1;
  ExpectInvalid(ValidateForward(in, limits_), "k.shape");
}

TEST_F(ValidationTest, RejectsMismatchedDTypes) {
  ForwardInputs in = Forward();
  in.k.dtype = DType::kFloat16;
  ExpectInvalid(ValidateForward(in, limits_), "k.dtype");
}

TEST_F(ValidationTest, RejectsZeroHeadDimAndHeads) {
  ExpectInvalid(ValidateForward(Forward(10, 12, 4, 2, 0), limits_), "head_dim");
  ExpectInvalid(ValidateForward(Forward(10, 12, 0, 2, 8), limits_), "num_heads");
  ExpectInvalid(ValidateForward(Forward(10, 12, 4, 0, 8), limits_), "num_heads_k");
}

TEST_F(ValidationTest, RejectsHeadRatio) {
  ExpectInvalid(ValidateForward(Forward(10, 12, 6, 4, 8), limits_), "divisible");
}

TEST_F(ValidationTest, RejectsHeadDimMismatchAndVShape) {
  ForwardInputs in = Forward();
  in.k.shape[2] = 16;
  ExpectInvalid(ValidateForward(in, limits_), "k.shape[2]");
  in = Forward();
  in.v.shape[0] = 11;
  ExpectInvalid(ValidateForward(in, limits_), "v.shape");
}

TEST_F(ValidationTest, RejectsByteCountMismatch) {
  ForwardInputs in = Forward();
  in.v.size_bytes -= 1;
  ExpectInvalid(ValidateForward(in, limits_), "v.data");
}

TEST_F(ValidationTest, RejectsBadOffsets) {
  ForwardInputs in = Forward();
  in.cu_seqlens_q = {};
  ExpectInvalid(ValidateForward(in, limits_), "cu_seqlens_q");
  in.cu_seqlens_q = {1, 3, 10};
  ExpectInvalid(ValidateForward(in, limits_), "cu_seqlens_q[0]");
  in.cu_seqlens_q = {0, 7, 3, 10};
  in.cu_seqlens_k = {0, 1, 2, 12};
  ExpectInvalid(ValidateForward(in, limits_), "cu_seqlens_q[2]");
  in = Forward();
  in.cu_seqlens_k = {0, 5, 11};
  ExpectInvalid(ValidateForward(in, limits_), "cu_seqlens_k");
  in = Forward();
  in.cu_seqlens_k = {0, 12};
  ExpectInvalid(ValidateForward(in, limits_), "batch + 1");
}

TEST_F(ValidationTest, RejectsBadOptions) {
  ForwardInputs in = Forward();
  in.options.softcap = -1;
  ExpectInvalid(ValidateForward(in, limits_), "softcap");
  in = Forward();
  in.options.softmax_scale = std::numeric_limits<float>::infinity();
  ExpectInvalid(ValidateForward(in, limits_), "softmax_scale");
  // Finite but so large that float32 scores overflow and every output is NaN.
  for (float scale : {3.4e38f, -3.4e38f, 2 * kMaxSoftmaxScale}) {
    in = Forward();
    in.options.softmax_scale = scale;
    ExpectInvalid(ValidateForward(in, limits_), "options.softmax_scale");
  }
  in = Forward();
  in.options.softmax_scale = -kMaxSoftmaxScale;
  EXPECT_TRUE(ValidateForward(in, limits_).ok());
  in = Forward();
  in.options.window_left = -2;
  ExpectInvalid(ValidateForward(in, limits_), "window_left");
  in = Forward();
  in.options.window_right = -5;
  ExpectInvalid(ValidateForward(in, limits_), "window_right");
  in = Forward();
  in.options.window_left = -1;  // -1 is FlashAttention's "unbounded"
  EXPECT_TRUE(ValidateForward(in, limits_).ok());
}

TEST_F(ValidationTest, LimitsAreResourceExhausted) {
  Limits small;
  small.max_head_dim = 4;
  absl::Status s = ValidateForward(Forward(), small);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_head_dim"));
  small = Limits();
  small.max_total_tokens = 11;
  s = ValidateForward(Forward(), small);  // total_k = 12
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("k.shape[0]"));
  small = Limits();
  small.max_batch = 1;
  EXPECT_EQ(ValidateForward(Forward(), small).code(), absl::StatusCode::kResourceExhausted);
  small = Limits();
  small.max_num_heads = 2;
  EXPECT_EQ(ValidateForward(Forward(), small).code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(ValidationTest, ErrorsQuoteAHugeShapeShortly) {
  ForwardInputs in = Forward();
  in.q.shape.assign(1'000'000, 7);
  const absl::Status s = ValidateForward(in, limits_);
  ExpectInvalid(s, "q.shape");
  EXPECT_THAT(std::string(s.message()), HasSubstr("(1000000 entries)"));
  EXPECT_LT(s.message().size(), 200u);
}

TEST_F(ValidationTest, HugeShapesHitLimitsBeforeByteMath) {
  ForwardInputs in = Forward();
  in.q.shape = {int64_t{1} << 40, int64_t{1} << 20, 8};
  EXPECT_EQ(ValidateForward(in, limits_).code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(ValidationTest, BackwardChecksItsExtraTensors) {
  BackwardInputs in = Backward();
  in.dout.dtype = DType::kFloat16;
  ExpectInvalid(ValidateBackward(in, limits_), "dout.dtype");
  in = Backward();
  in.out.shape = {10, 4, 4};
  ExpectInvalid(ValidateBackward(in, limits_), "out.shape");
  in = Backward();
  in.lse.shape = {10, 4};
  ExpectInvalid(ValidateBackward(in, limits_), "lse.shape");
  in = Backward();
  in.lse.dtype = DType::kBFloat16;
  ExpectInvalid(ValidateBackward(in, limits_), "lse.dtype");
  in = Backward();
  in.lse.size_bytes = 3;
  ExpectInvalid(ValidateBackward(in, limits_), "lse.data");
}

TEST_F(ValidationTest, MissingBackwardTensorsAreNamed) {
  BackwardInputs in = Backward();
  in.k = TensorView{};
  ExpectInvalid(ValidateBackward(in, limits_), "k: missing (send it, or the context_id");
  in = Backward();
  in.dout = TensorView{};
  ExpectInvalid(ValidateBackward(in, limits_), "dout: missing");
}

}  // namespace
}  // namespace attnserve::engine

namespace attnserve::engine {
namespace {

OwnedTensor Slopes(std::vector<int64_t> shape, std::vector<float> values) {
  OwnedTensor t{DType::kFloat32, std::move(shape), ""};
  t.data.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return t;
}

TEST_F(ValidationTest, DropoutPMustBeInZeroToOne) {
  for (float p : {0.0f, 0.5f, 0.999f}) {
    ForwardInputs in = Forward();
    in.options.dropout_p = p;
    EXPECT_TRUE(ValidateForward(in, limits_).ok()) << p;
  }
  for (float p : {1.0f, -0.1f, std::nanf(""), INFINITY}) {
    ForwardInputs in = Forward();
    in.options.dropout_p = p;
    ExpectInvalid(ValidateForward(in, limits_), "options.dropout_p");
  }
}

TEST_F(ValidationTest, AlibiSlopesArePerHeadOrPerSequenceAndFinite) {
  ForwardInputs in = Forward();  // batch 2, 4 heads
  in.options.alibi_slopes = Slopes({4}, {0.1f, 0.2f, 0.3f, 0.4f});
  EXPECT_TRUE(ValidateForward(in, limits_).ok());
  in.options.alibi_slopes = Slopes({2, 4}, std::vector<float>(8, 0.5f));
  EXPECT_TRUE(ValidateForward(in, limits_).ok());
  for (std::vector<int64_t> shape : {std::vector<int64_t>{2}, {3, 4}, {1, 2, 4}, {}}) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    in.options.alibi_slopes = Slopes(shape, std::vector<float>(count, 0.5f));
    ExpectInvalid(ValidateForward(in, limits_), "options.alibi_slopes.shape");
  }
  in.options.alibi_slopes = Slopes({4}, {0.1f, 0.2f, 0.3f});  // 12 bytes for 4 floats
  ExpectInvalid(ValidateForward(in, limits_), "options.alibi_slopes.data");
  in.options.alibi_slopes = Slopes({4}, {0.1f, std::nanf(""), 0.3f, 0.4f});
  ExpectInvalid(ValidateForward(in, limits_), "options.alibi_slopes");
  in.options.alibi_slopes = Slopes({4}, {0.1f, 0.2f, -INFINITY, 0.4f});
  ExpectInvalid(ValidateForward(in, limits_), "options.alibi_slopes");
  in.options.alibi_slopes = Slopes({4}, {0.1f, 0.2f, 0.3f, 0.4f});
  in.options.alibi_slopes->dtype = DType::kFloat16;
  ExpectInvalid(ValidateForward(in, limits_), "options.alibi_slopes.dtype");
}

TEST_F(ValidationTest, DropoutBackwardNeedsTheForwardSeed) {
  BackwardInputs in = Backward();
  in.options.dropout_p = 0.1f;
  ExpectInvalid(ValidateBackward(in, limits_), "dropout_seed");
  in.options.dropout_seed = 42;
  EXPECT_TRUE(ValidateBackward(in, limits_).ok());
}

}  // namespace
}  // namespace attnserve::engine

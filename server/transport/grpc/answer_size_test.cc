#include "server/transport/grpc/answer_size.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::transport {
namespace {

using ::testing::HasSubstr;

engine::TensorView View(const std::string& bytes, std::vector<int64_t> shape) {
  return {engine::DType::kFloat32, std::move(shape), bytes.data(), bytes.size()};
}

TEST(AnswerSizeTest, AForwardWhoseOutAndLseExceedTheLimitIsRefusedBeforeCompute) {
  // 256 tokens x 4 heads x head_dim 1 of float32: 4 KiB each of q, k, v (a 12 KiB request),
  // and an answer of 4 KiB out + 4 KiB lse.
  const std::string bytes(256 * 4 * 4, '\1');
  engine::ForwardInputs in;
  in.q = in.k = in.v = View(bytes, {256, 4, 1});
  const int64_t answer = 2 * 4096 + kAnswerOverheadBytes;
  EXPECT_TRUE(CheckAnswerFits(in, answer).ok());
  const absl::Status refused = CheckAnswerFits(in, answer - 1);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("max_message_bytes"));
}

TEST(AnswerSizeTest, MalformedShapesAreLeftToValidation) {
  const std::string bytes(64, '\1');
  engine::ForwardInputs in;
  in.q = View(bytes, {4, 4, 0});
  EXPECT_TRUE(CheckAnswerFits(in, 1024).ok());
  in.q = View(bytes, {16});
  EXPECT_TRUE(CheckAnswerFits(in, 1024).ok());
}

TEST(AnswerSizeTest, ABackwardByContextCountsDoutForDq) {
  const std::string bytes(8192, '\1');
  engine::BackwardInputs in;
  in.dout = View(bytes, {2048, 1, 1});
  EXPECT_EQ(CheckAnswerFits(in, 8192).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(CheckAnswerFits(in, 8192 + kAnswerOverheadBytes).ok());
}

}  // namespace
}  // namespace attnserve::transport

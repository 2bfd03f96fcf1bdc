#include "server/transport/http/rest_json.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::transport::rest {
namespace {

using ::testing::HasSubstr;

TEST(RestJsonTest, ParsesWithinTheDepthBound) {
  std::string deep(kMaxJsonDepth, '[');
  deep += std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(ParseJson(deep, "body").ok());
  std::string deeper = "[" + deep + "]";
  absl::StatusOr<Json> refused = ParseJson(deeper, "body");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("body: JSON nested deeper than"));
  // Far deeper than any stack would take recursively: refused at the bound, not crashed.
  std::string hostile(1 << 20, '[');
  EXPECT_TRUE(absl::IsInvalidArgument(ParseJson(hostile, "body").status()));
  std::string objects;
  for (int i = 0; i <= kMaxJsonDepth; ++i) objects += "{\"a\":";
  objects += "1" + std::string(kMaxJsonDepth + 1, '}');
  EXPECT_FALSE(ParseJson(objects, "body").ok());
}

TEST(RestJsonTest, InvalidJsonNamesTheBody) {
  for (const char* bad : {"", "{", "{\"a\": }", "[1, 2", "nan", "{\"a\": 1} trailing"}) {
    absl::StatusOr<Json> parsed = ParseJson(bad, "request body");
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr("request body: not valid JSON")) << bad;
  }
}

TEST(RestJsonTest, ParametersKeepTheirKinds) {
  absl::StatusOr<oip::Parameters> parameters =
      DecodeParameters(Json::parse(R"({"causal": true, "window_left": 5, "softmax_scale": 0.5,
                      "region": "r", "big": 9223372036854775807, "neg": -3})"),
                       "parameters");
  ASSERT_TRUE(parameters.ok()) << parameters.status();
  EXPECT_EQ(std::get<bool>(parameters->at("causal")), true);
  EXPECT_EQ(std::get<int64_t>(parameters->at("window_left")), 5);
  EXPECT_EQ(std::get<double>(parameters->at("softmax_scale")), 0.5);
  EXPECT_EQ(std::get<std::string>(parameters->at("region")), "r");
  EXPECT_EQ(std::get<int64_t>(parameters->at("big")), 9223372036854775807);
  EXPECT_EQ(std::get<int64_t>(parameters->at("neg")), -3);
  EXPECT_EQ(EncodeParameters(*parameters)["softmax_scale"], 0.5);
}

TEST(RestJsonTest, ParametersRefuseWhatTheProtocolHasNot) {
  auto error = [](const char* text) {
    return std::string(DecodeParameters(Json::parse(text), "parameters").status().message());
  };
  EXPECT_THAT(error(R"({"a": [1]})"), HasSubstr("parameters.a: must be a boolean"));
  EXPECT_THAT(error(R"({"a": null})"), HasSubstr("parameters.a: must be a boolean"));
  EXPECT_THAT(error(R"({"a": 18446744073709551615})"), HasSubstr("parameters.a: out of the"));
  EXPECT_THAT(error("[]"), HasSubstr("parameters: must be an object"));
}

TEST(RestJsonTest, ErrorBodyIsJsonEvenForInvalidUtf8) {
  const Json body = Json::parse(ErrorBody("inputs[\xff]: unknown"));
  EXPECT_THAT(body["error"].get<std::string>(), HasSubstr("]: unknown"));
}

}  // namespace
}  // namespace attnserve::transport::rest

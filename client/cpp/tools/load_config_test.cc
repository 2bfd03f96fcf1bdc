#include "tools/load_config.h"

#include <cstdio>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::load {
namespace {

using ::testing::HasSubstr;

TEST(ParseShapeSpecTest, Fixed) {
  absl::StatusOr<ShapeSpec> spec = ParseShapeSpec("fixed:batch=4,seqlen=512");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->uniform);
  EXPECT_EQ(spec->batch.min, 4);
  EXPECT_EQ(spec->batch.max, 4);
  EXPECT_EQ(spec->seqlen_q.min, 512);
  EXPECT_EQ(spec->seqlen_k.max, 512);
  EXPECT_FALSE(spec->separate_k);
}

TEST(ParseShapeSpecTest, UniformRangesInAnyOrder) {
  absl::StatusOr<ShapeSpec> spec = ParseShapeSpec("uniform:seqlen=128-2048,batch=1-8");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->uniform);
  EXPECT_EQ(spec->batch.min, 1);
  EXPECT_EQ(spec->batch.max, 8);
  EXPECT_EQ(spec->seqlen_q.min, 128);
  EXPECT_EQ(spec->seqlen_q.max, 2048);
  EXPECT_EQ(spec->seqlen_k.min, 128);
}

TEST(ParseShapeSpecTest, SeparateQueryAndKeyLengths) {
  absl::StatusOr<ShapeSpec> spec = ParseShapeSpec("uniform:seqlen_q=1-16,seqlen_k=512");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->separate_k);
  EXPECT_EQ(spec->batch.max, 1);  // default batch
  EXPECT_EQ(spec->seqlen_q.max, 16);
  EXPECT_EQ(spec->seqlen_k.min, 512);
  EXPECT_EQ(spec->seqlen_k.max, 512);
  spec = ParseShapeSpec("fixed:seqlen=64,seqlen_k=256");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->seqlen_q.min, 64);
  EXPECT_EQ(spec->seqlen_k.min, 256);
  spec = ParseShapeSpec("fixed:seqlen_k=256,seqlen=64");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->seqlen_k.min, 256);
}

TEST(ParseShapeSpecTest, InvalidSpecsNameTheProblem) {
  const std::pair<const char*, const char*> cases[] = {
      {"bogus:seqlen=4", "unknown kind 'bogus'"},
      {"", "unknown kind ''"},
      {"fixed:batch=4", "no seqlen"},
      {"fixed", "no seqlen"},
      {"fixed:seqlen=128-256", "fixed shape takes single values"},
      {"uniform:seqlen=256-128", "is empty"},
      {"uniform:seqlen=0-8", "not a positive integer"},
      {"fixed:seqlen=abc", "'abc' is not a positive integer"},
      {"fixed:seqlen=", "not a positive integer"},
      {"fixed:seqlen=-5", "not a positive integer"},
      {"fixed:seqlen=1=2", "not a positive integer"},
      {"uniform:seqlen=1-2-3", "is not N or MIN-MAX"},
      {"fixed:seqlen=8,seqlen=9", "'seqlen' given twice"},
      {"fixed:heads=8,seqlen=9", "unknown key 'heads'"},
      {"fixed:seqlen=99999999999", "not a positive integer"},
      {"fixed:batch=65536,seqlen=65536", "exceeds 2^31-1 tokens"},
  };
  for (const auto& [text, message] : cases) {
    absl::StatusOr<ShapeSpec> spec = ParseShapeSpec(text);
    ASSERT_FALSE(spec.ok()) << text;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(message)) << text;
  }
}

TEST(ParseSeqlensTextTest, LinesCommentsAndPairs) {
  absl::StatusOr<std::vector<SequenceLengths>> requests =
      ParseSeqlensText("# captured from a training run\n512, 1024 7\n\n  3:9 4 # decode\r\n");
  ASSERT_TRUE(requests.ok()) << requests.status();
  ASSERT_EQ(requests->size(), 2u);
  EXPECT_EQ((*requests)[0].q, (std::vector<int32_t>{512, 1024, 7}));
  EXPECT_EQ((*requests)[0].k, (std::vector<int32_t>{512, 1024, 7}));
  EXPECT_EQ((*requests)[1].q, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ((*requests)[1].k, (std::vector<int32_t>{9, 4}));
}

TEST(ParseSeqlensTextTest, ErrorsNameTheLine) {
  absl::StatusOr<std::vector<SequenceLengths>> requests = ParseSeqlensText("4 5\n6 x\n");
  ASSERT_FALSE(requests.ok());
  EXPECT_THAT(std::string(requests.status().message()), HasSubstr("line 2"));
  requests = ParseSeqlensText("4 0\n");
  EXPECT_FALSE(requests.ok());
  requests = ParseSeqlensText("4:\n");
  EXPECT_FALSE(requests.ok());
  requests = ParseSeqlensText("# nothing\n\n");
  ASSERT_FALSE(requests.ok());
  EXPECT_THAT(std::string(requests.status().message()), HasSubstr("no sequence lengths"));
  requests = ParseSeqlensText("2000000000 2000000000\n");
  ASSERT_FALSE(requests.ok());
  EXPECT_THAT(std::string(requests.status().message()), HasSubstr("2^31-1"));
}

TEST(ReadSeqlensFileTest, ReadsAFileAndNamesAMissingOne) {
  const std::string path = ::testing::TempDir() + "/seqlens.txt";
  std::ofstream(path) << "16 32\n8\n";
  absl::StatusOr<std::vector<SequenceLengths>> requests = ReadSeqlensFile(path);
  ASSERT_TRUE(requests.ok()) << requests.status();
  EXPECT_EQ(requests->size(), 2u);
  std::remove(path.c_str());
  requests = ReadSeqlensFile(path);
  ASSERT_FALSE(requests.ok());
  EXPECT_THAT(std::string(requests.status().message()), HasSubstr(path));
}

TEST(ParseSweepLevelsTest, ValidAndInvalid) {
  absl::StatusOr<std::vector<int>> levels = ParseSweepLevels("1,2, 4,8,16");
  ASSERT_TRUE(levels.ok()) << levels.status();
  EXPECT_EQ(*levels, (std::vector<int>{1, 2, 4, 8, 16}));
  for (const char* bad : {"", "1,,2", "0", "4,-1", "x"}) {
    EXPECT_FALSE(ParseSweepLevels(bad).ok()) << bad;
  }
}

TEST(ParseNamesTest, DTypeRpcArrival) {
  EXPECT_EQ(*ParseDType("fp16"), v1::DTYPE_FLOAT16);
  EXPECT_EQ(*ParseDType("bfloat16"), v1::DTYPE_BFLOAT16);
  EXPECT_FALSE(ParseDType("int8").ok());
  EXPECT_EQ(*ParseRpcMix("mixed"), RpcMix::kMixed);
  EXPECT_FALSE(ParseRpcMix("both").ok());
  EXPECT_EQ(*ParseArrival("poisson"), Arrival::kPoisson);
  EXPECT_THAT(std::string(ParseArrival("bursty").status().message()), HasSubstr("--arrival"));
}

TEST(ValidateConfigTest, DefaultsAreValidAndBadValuesNameTheFlag) {
  EXPECT_TRUE(ValidateConfig(LoadConfig{}).ok());
  const std::pair<void (*)(LoadConfig&), const char*> cases[] = {
      {[](LoadConfig& c) { c.concurrency = 0; }, "--concurrency"},
      {[](LoadConfig& c) { c.connections = 0; }, "--connections"},
      {[](LoadConfig& c) { c.rate = -1; }, "--rate"},
      {[](LoadConfig& c) { c.duration = absl::ZeroDuration(); }, "--duration"},
      {[](LoadConfig& c) { c.warmup = -absl::Seconds(1); }, "--warmup"},
      {[](LoadConfig& c) { c.duration = absl::InfiniteDuration(); }, "--duration"},
      {[](LoadConfig& c) { c.timeout = absl::InfiniteDuration(); }, "--timeout"},
      {[](LoadConfig& c) { c.rate = 1e-9; }, "--rate"},
      {[](LoadConfig& c) { c.heads_k = 3; }, "--heads_k"},
      {[](LoadConfig& c) { c.backward_fraction = 1.5; }, "--backward_fraction"},
      {[](LoadConfig& c) { c.check_every = -1; }, "--check"},
      {[](LoadConfig& c) { c.max_error_rate = 2; }, "--max_error_rate"},
      {[](LoadConfig& c) { c.pool_size = 0; }, "--pool_size"},
      {[](LoadConfig& c) { c.data_connections = 0; }, "--data_connections"},
      {[](LoadConfig& c) { c.keep_context = true; }, "--keep_context"},
      {[](LoadConfig& c) { c.raw_socket_peer_bytes = -1; }, "--raw_socket_peer_bytes"},
      {[](LoadConfig& c) {
         c.sweep = {1, 2};
         c.rate = 10;
       },
       "--sweep"},
  };
  for (const auto& [mutate, flag] : cases) {
    LoadConfig config;
    mutate(config);
    const absl::Status status = ValidateConfig(config);
    EXPECT_FALSE(status.ok()) << flag;
    EXPECT_THAT(std::string(status.message()), HasSubstr(flag));
  }
  LoadConfig by_count;
  by_count.duration = absl::ZeroDuration();
  by_count.requests = 100;
  EXPECT_TRUE(ValidateConfig(by_count).ok());
  LoadConfig steps;
  steps.rpc = RpcMix::kBackward;
  steps.keep_context = true;
  EXPECT_TRUE(ValidateConfig(steps).ok());
}

}  // namespace
}  // namespace attnserve::load

#include "tools/load_report.h"

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tools/sweep_plot.h"

namespace attnserve::load {
namespace {

using ::testing::HasSubstr;

RunResult SampleRun(int concurrency) {
  RunResult run;
  run.concurrency = concurrency;
  run.elapsed_s = 2;
  run.requests = 100;
  run.errors = 2;
  run.tokens = 6400;
  run.flops = 4e12;
  run.transport = "data";
  run.payload_bytes = int64_t{98} * 50'000'000;  // 50 MB per successful request
  run.errors_by_code["RESOURCE_EXHAUSTED"] = 2;
  run.first_error["RESOURCE_EXHAUSTED"] = "total \"tokens\" over\nlimit";
  for (int i = 1; i <= 98; ++i) run.latency.Record(absl::Microseconds(100 * i));
  return run;
}

TEST(LoadReportTest, JsonParsesAndCarriesTheNumbers) {
  LoadConfig config;
  config.target = "host:8001";
  RawSocketResult raw{1 << 30, 4, 4.9, 9.8};
  const std::string json = RunsToJson(config, {SampleRun(1), SampleRun(4)}, raw);
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) << json;
  EXPECT_EQ(parsed.fields().at("target").string_value(), "host:8001");
  const auto& runs = parsed.fields().at("runs").list_value();
  ASSERT_EQ(runs.values_size(), 2);
  const auto& run = runs.values(1).struct_value().fields();
  EXPECT_EQ(run.at("concurrency").number_value(), 4);
  EXPECT_EQ(run.at("requests").number_value(), 100);
  EXPECT_EQ(run.at("ok").number_value(), 98);
  EXPECT_DOUBLE_EQ(run.at("throughput_rps").number_value(), 50);
  EXPECT_DOUBLE_EQ(run.at("tflops").number_value(), 2);
  EXPECT_EQ(run.at("transport").string_value(), "data");
  EXPECT_DOUBLE_EQ(run.at("payload_gbps").number_value(), 2.45);
  const auto& raw_json = parsed.fields().at("raw_socket").struct_value().fields();
  EXPECT_DOUBLE_EQ(raw_json.at("gbps").number_value(), 9.8);
  EXPECT_EQ(
      run.at("errors_by_code").struct_value().fields().at("RESOURCE_EXHAUSTED").number_value(), 2);
  EXPECT_EQ(run.at("first_error").struct_value().fields().at("RESOURCE_EXHAUSTED").string_value(),
            "total \"tokens\" over\nlimit");
  const auto& latency = run.at("latency_ms").struct_value().fields();
  EXPECT_NEAR(latency.at("p50").number_value(), 4.9, 0.01);
  EXPECT_DOUBLE_EQ(latency.at("max").number_value(), 9.8);
}

TEST(LoadReportTest, CsvAndMarkdownHaveOneRowPerRun) {
  const std::vector<RunResult> runs = {SampleRun(1), SampleRun(2), SampleRun(8)};
  const std::vector<std::string> lines = absl::StrSplit(RunsToCsv(runs), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_THAT(lines[0], HasSubstr("p99_ms"));
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(lines[0], ',')).size(),
            std::vector<std::string>(absl::StrSplit(lines[3], ',')).size());
  EXPECT_THAT(lines[3], ::testing::StartsWith("8,0,"));
  const std::string table = RunsToMarkdown(runs);
  EXPECT_THAT(table, HasSubstr("| concurrency | req/s"));
  EXPECT_THAT(table, HasSubstr("| 8 | 50.0 | 3200 |"));
}

TEST(LoadReportTest, TextReportNamesErrors) {
  const std::string text = FormatRun(SampleRun(3));
  EXPECT_THAT(text, HasSubstr("closed loop, concurrency 3: 100 requests"));
  EXPECT_THAT(text, HasSubstr("RESOURCE_EXHAUSTED x2"));
  EXPECT_THAT(text, HasSubstr("p99.9"));
  EXPECT_THAT(text, HasSubstr("payload     2.45 GB/s over data (50 MB"));
  const std::string raw = FormatRawSocket({1 << 30, 4, 4.9, 9.8}, {SampleRun(3)});
  EXPECT_THAT(raw, HasSubstr("4.9 GB/s on 1 connection, 9.8 GB/s on 4"));
  EXPECT_THAT(raw, HasSubstr("payload 2.45 GB/s = 0.50x raw socket (1 connection), 0.25x"));
}

TEST(SweepPlotTest, ScriptHoldsTheDataAndQuotesThePath) {
  const std::string script = GnuplotScript({SampleRun(1), SampleRun(2)}, "out/it's.png");
  EXPECT_THAT(script, HasSubstr("set output 'out/it''s.png'"));
  EXPECT_THAT(script, HasSubstr("set terminal pngcairo"));
  EXPECT_THAT(script, HasSubstr("\n2 50 4.9"));
}

TEST(SweepPlotTest, MissingGnuplotIsAClearError) {
  const std::string prefix = ::testing::TempDir() + "/plot";
  const absl::Status status =
      DrawSweepPlot({SampleRun(1)}, "/nonexistent/gnuplot", prefix + ".gp", prefix + ".png");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("gnuplot-nox"));
}

}  // namespace
}  // namespace attnserve::load

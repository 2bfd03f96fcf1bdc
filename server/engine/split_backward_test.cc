#include "server/engine/split_backward.h"

#include <cmath>
#include <cstring>
#include <future>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "kernels/reference/tensor_io.h"
#include "server/engine/cpu_worker.h"
#include "server/engine/local_engine.h"
#include "server/engine/work_estimate.h"
#include "server/metrics/server_metrics.h"

namespace attnserve::engine {
namespace {

// A slice no 768-row block fits: every long sequence runs one block per kRowBlockAlignment rows.
constexpr double kTinySlice = 1e-9;

struct Case {
  DType dtype;
  bool causal;
  int window_left, window_right;  // -1: unbounded
  int heads, heads_k;
  std::vector<int32_t> lengths_q, lengths_k;

  std::string Name() const {
    return testing::PrintToString(std::vector<int>{static_cast<int>(dtype), causal, window_left,
                                                   window_right, heads, heads_k}) +
           testing::PrintToString(lengths_q) + testing::PrintToString(lengths_k);
  }
  RequestOptions Options() const {
    RequestOptions o;
    o.causal = causal;
    if (window_left >= 0) o.window_left = window_left;
    if (window_right >= 0) o.window_right = window_right;
    return o;
  }
};

constexpr int kHeadDim = 16;

std::vector<int32_t> Offsets(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu = {0};
  for (int32_t n : lengths) cu.push_back(cu.back() + n);
  return cu;
}

// Random normal values, stored in `dtype`.
std::string RandomTensor(DType dtype, int64_t elements, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> values(elements);
  for (float& v : values) v = normal(rng);
  std::string bytes(elements * kernels::DTypeSize(dtype), '\0');
  StoreAccumulated(dtype, values.data(), elements, bytes.data());
  return bytes;
}

std::vector<float> AsFloats(const OwnedTensor& t) {
  const int64_t elements = static_cast<int64_t>(t.data.size()) / kernels::DTypeSize(t.dtype);
  std::vector<float> values(elements, 0.0f);
  AccumulatePartial(t.dtype, t.data.data(), elements, values.data());
  return values;
}

// ‖a − b‖ / ‖b‖.
double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

std::unique_ptr<LocalEngine> CpuEngine(double max_launch_seconds,
                                       metrics::ServerMetrics* metrics) {
  devices::DeviceDescription cpu;
  cpu.name = "cpu";
  EngineOptions options;
  options.max_launch_seconds = max_launch_seconds;
  auto engine = LocalEngine::Create({cpu}, options, metrics);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return *std::move(engine);
}

// A forward's inputs and its answer, and a dout: what a backward of it reads.
struct Problem {
  Case c;
  std::vector<int32_t> cu_q, cu_k;
  std::string q, k, v, dout;
  ForwardResult forward;

  BackwardInputs Backward() const {
    const int64_t total_q = cu_q.back(), total_k = cu_k.back();
    const int size = kernels::DTypeSize(c.dtype);
    const std::vector<int64_t> q_shape = {total_q, c.heads, kHeadDim};
    const std::vector<int64_t> k_shape = {total_k, c.heads_k, kHeadDim};
    BackwardInputs in;
    in.dout = {c.dtype, q_shape, dout.data(), dout.size()};
    in.q = {c.dtype, q_shape, q.data(), q.size()};
    in.k = {c.dtype, k_shape, k.data(), k.size()};
    in.v = {c.dtype, k_shape, v.data(), v.size()};
    in.out = {c.dtype, q_shape, forward.out.data.data(), forward.out.data.size()};
    in.lse = {DType::kFloat32, {c.heads, total_q}, forward.lse.data.data(),
              forward.lse.data.size()};
    EXPECT_EQ(in.q.size_bytes, static_cast<size_t>(total_q * c.heads * kHeadDim * size));
    in.cu_seqlens_q = cu_q;
    in.cu_seqlens_k = cu_k;
    in.options = c.Options();
    return in;
  }
};

Problem MakeProblem(const Case& c, LocalEngine& engine, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p{c, Offsets(c.lengths_q), Offsets(c.lengths_k), {}, {}, {}, {}, {}};
  const int64_t total_q = p.cu_q.back(), total_k = p.cu_k.back();
  p.q = RandomTensor(c.dtype, total_q * c.heads * kHeadDim, rng);
  p.k = RandomTensor(c.dtype, total_k * c.heads_k * kHeadDim, rng);
  p.v = RandomTensor(c.dtype, total_k * c.heads_k * kHeadDim, rng);
  p.dout = RandomTensor(c.dtype, total_q * c.heads * kHeadDim, rng);
  ForwardInputs in;
  in.q = {c.dtype, {total_q, c.heads, kHeadDim}, p.q.data(), p.q.size()};
  in.k = {c.dtype, {total_k, c.heads_k, kHeadDim}, p.k.data(), p.k.size()};
  in.v = {c.dtype, {total_k, c.heads_k, kHeadDim}, p.v.data(), p.v.size()};
  in.cu_seqlens_q = p.cu_q;
  in.cu_seqlens_k = p.cu_k;
  in.options = c.Options();
  std::promise<absl::StatusOr<ForwardResult>> answer;
  EXPECT_TRUE(engine.Enqueue(ForwardJob{in, [&](auto r) { answer.set_value(std::move(r)); }})
                  .ok());
  absl::StatusOr<ForwardResult> result = answer.get_future().get();
  EXPECT_TRUE(result.ok()) << result.status();
  if (result.ok()) p.forward = *std::move(result);
  return p;
}

absl::StatusOr<BackwardResult> RunOn(LocalEngine& engine, const BackwardInputs& in) {
  std::promise<absl::StatusOr<BackwardResult>> answer;
  if (absl::Status s = engine.Enqueue(BackwardJob{in, [&](auto r) {
                                                    answer.set_value(std::move(r));
                                                  }});
      !s.ok()) {
    return s;
  }
  return answer.get_future().get();
}

// The plan the CPU worker makes of `in` under `slice` (as CpuWorker does).
std::vector<LaunchRange> CpuPlan(const BackwardInputs& in, double slice) {
  return PlanLaunchSplit(
      SplitRequestOf(Direction::kBackward, in.q, in.cu_seqlens_q, in.cu_seqlens_k, in.options,
                     FamilyThroughput(kReferenceFamily.name, 0, EngineOptions{}.cpu_threads)),
      slice);
}

// Tolerances of split against unsplit, ‖split − whole‖ / ‖whole‖: fp32 sums the same products
// in another order (measured ≤ 1.3e-6); bf16 also rounds each block's partial dk and dv to
// bf16 once before the float32 sum (measured ≤ 2.8e-3, about bf16's own rounding).
double Tolerance(DType dtype) { return dtype == DType::kFloat32 ? 1e-5 : 1e-2; }

TEST(SplitBackwardTest, RowBlocksOnTheCpuDeviceMatchTheWholeBackward) {
  metrics::ServerMetrics metrics("test");
  auto whole_engine = CpuEngine(0, nullptr);
  auto split_engine = CpuEngine(kTinySlice, &metrics);
  std::vector<Case> cases;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    // Non-causal, causal GQA (more keys than queries), a sliding window reaching right (four
    // query heads per kv head), causal GQA beside short sequences, and multi-head attention with
    // fewer keys than queries. Short and with few heads: each case needs three 768-row blocks
    // (1537 rows or more), and under ASan+UBSan the reference kernels run ~70x slower than in a
    // release build (at 1700-2300 rows and 4 heads this was the hardening stage's longest test,
    // 236 s).
    cases.push_back({dtype, false, -1, -1, 1, 1, {1600}, {1600}});
    cases.push_back({dtype, true, -1, -1, 2, 1, {1600}, {1900}});
    cases.push_back({dtype, false, 300, 40, 4, 1, {1600}, {1600}});
    cases.push_back({dtype, true, -1, -1, 2, 1, {50, 1600, 70}, {60, 1600, 70}});
    cases.push_back({dtype, false, -1, -1, 2, 2, {1600}, {900}});
  }
  uint32_t seed = 1;
  size_t split_requests = 0;
  for (const Case& c : cases) {
    const Problem p = MakeProblem(c, *whole_engine, seed++);
    const BackwardInputs in = p.Backward();
    const std::vector<LaunchRange> plan = CpuPlan(in, kTinySlice);
    size_t blocks = 0;
    for (const LaunchRange& r : plan) blocks += r.row_block;
    ASSERT_GE(blocks, 3u) << c.Name();
    ++split_requests;
    absl::StatusOr<BackwardResult> whole = RunOn(*whole_engine, in);
    absl::StatusOr<BackwardResult> split = RunOn(*split_engine, in);
    ASSERT_TRUE(whole.ok()) << c.Name() << whole.status();
    ASSERT_TRUE(split.ok()) << c.Name() << split.status();
    const std::pair<const OwnedTensor*, const OwnedTensor*> outputs[] = {
        {&split->dq, &whole->dq}, {&split->dk, &whole->dk}, {&split->dv, &whole->dv}};
    const char* names[] = {"dq", "dk", "dv"};
    // dq of a row is computed whole in its block, over the same keys in the same tiles.
    EXPECT_EQ(split->dq.data, whole->dq.data) << c.Name();
    for (int i = 0; i < 3; ++i) {
      const std::vector<float> a = AsFloats(*outputs[i].first), b = AsFloats(*outputs[i].second);
      ASSERT_EQ(a.size(), b.size()) << c.Name() << names[i];
      EXPECT_LE(RelativeError(a, b), Tolerance(c.dtype)) << c.Name() << " " << names[i];
    }
  }
  // Every one of them ran split on the CPU device.
  const std::string text = metrics.Serialize();
  EXPECT_NE(text.find("attnserve_split_requests_total{device=\"cpu\"} " +
                      std::to_string(split_requests)),
            std::string::npos)
      << text;
}

// Blocks run in the plan's order and sum dk and dv the same way every time.
TEST(SplitBackwardTest, ADeterministicSplitBackwardIsBitwiseReproducible) {
  auto engine = CpuEngine(0, nullptr);
  const Problem p =
      MakeProblem({DType::kBFloat16, true, -1, -1, 2, 1, {1600}, {1600}}, *engine, 7);
  BackwardInputs in = p.Backward();
  in.deterministic = true;
  const std::vector<LaunchRange> plan = CpuPlan(in, kTinySlice);
  ASSERT_GE(plan.size(), 3u);
  kernels::ExecutionContext ctx;
  absl::StatusOr<BackwardResult> first =
      RunBackwardInLaunches(kReferenceFamily, in, plan, ctx, nullptr);
  ctx.num_threads = 1;
  absl::StatusOr<BackwardResult> second =
      RunBackwardInLaunches(kReferenceFamily, in, plan, ctx, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->dq.data, second->dq.data);
  EXPECT_EQ(first->dk.data, second->dk.data);
  EXPECT_EQ(first->dv.data, second->dv.data);
}

// A stop between blocks ends the request there, with the stop's status.
TEST(SplitBackwardTest, StopsBetweenBlocks) {
  auto engine = CpuEngine(0, nullptr);
  const Problem p =
      MakeProblem({DType::kFloat32, false, -1, -1, 1, 1, {2400}, {2400}}, *engine, 9);
  const BackwardInputs in = p.Backward();
  const std::vector<LaunchRange> plan = CpuPlan(in, kTinySlice);
  ASSERT_GE(plan.size(), 4u);
  int launches = 0;
  absl::StatusOr<BackwardResult> result = RunBackwardInLaunches(
      kReferenceFamily, in, plan, kernels::ExecutionContext{}, [&launches]() -> absl::Status {
        if (++launches == 3) return absl::CancelledError("stopped");
        return absl::OkStatus();
      });
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(launches, 3);
}

TEST(SplitBackwardTest, AccumulatesAndStoresEveryDtype) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const std::vector<float> values = {1.5f, -2.25f, 0.125f, 3.0f};
    std::string bytes(values.size() * kernels::DTypeSize(dtype), '\0');
    StoreAccumulated(dtype, values.data(), 4, bytes.data());
    std::vector<float> sum(4, 1.0f);
    AccumulatePartial(dtype, bytes.data(), 4, sum.data());
    AccumulatePartial(dtype, bytes.data(), 4, sum.data());
    for (int i = 0; i < 4; ++i) EXPECT_EQ(sum[i], 1.0f + 2 * values[i]);
  }
}

}  // namespace
}  // namespace attnserve::engine

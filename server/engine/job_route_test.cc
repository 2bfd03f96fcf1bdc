// The route is chosen once and travels with the job: placement decides it, the worker runs it
// (and never routes again), one launch never mixes routes, and Execution reports the code path.
#include <future>
#include <vector>

#include "gtest/gtest.h"
#include "server/engine/batching.h"
#include "server/engine/cpu_worker.h"
#include "server/engine/local_engine.h"

namespace attnserve::engine {
namespace {

// Two sequences of two tokens, one head of dimension 4, float32.
struct SmallRequest {
  std::vector<float> q = std::vector<float>(16, 0.5f);
  std::vector<int32_t> cu = {0, 2, 4};

  ForwardInputs Inputs() const {
    ForwardInputs in;
    const TensorView view{DType::kFloat32, {4, 1, 4}, reinterpret_cast<const char*>(q.data()),
                          q.size() * sizeof(float)};
    in.q = in.k = in.v = view;
    in.cu_seqlens_q = in.cu_seqlens_k = cu;
    in.options.softmax_scale = 0.5f;
    return in;
  }
};

devices::DeviceDescription Cpu() {
  devices::DeviceDescription cpu;
  cpu.name = "cpu";
  return cpu;
}

absl::StatusOr<ForwardResult> RunOn(DeviceWorker& worker, ForwardInputs inputs) {
  std::promise<absl::StatusOr<ForwardResult>> answer;
  ForwardJob job;
  job.inputs = std::move(inputs);
  job.done = [&answer](absl::StatusOr<ForwardResult> r) { answer.set_value(std::move(r)); };
  worker.Submit(std::move(job), JobCost{});
  return answer.get_future().get();
}

TEST(JobRouteTest, TheWorkerRunsTheRouteTheJobCarries) {
  CpuWorker worker(Cpu(), EngineOptions{}, nullptr);
  const SmallRequest request;
  // A route the CPU cannot run: the worker refuses it rather than choosing its own.
  ForwardInputs misrouted = request.Inputs();
  misrouted.route = {"flash", "sm80", "planned elsewhere"};
  absl::StatusOr<ForwardResult> refused = RunOn(worker, misrouted);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("routed to flash/sm80"), std::string::npos)
      << refused.status();

  ForwardInputs routed = request.Inputs();
  routed.route = {"reference", "cpu", "planned"};
  absl::StatusOr<ForwardResult> ran = RunOn(worker, routed);
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_EQ(ran->execution.kernel, "reference");
  EXPECT_EQ(ran->execution.code_path, "reference/cpu");
}

TEST(JobRouteTest, AJobSubmittedWithoutARouteIsRoutedOnceOnItsDevice) {
  CpuWorker worker(Cpu(), EngineOptions{}, nullptr);
  const SmallRequest request;
  absl::StatusOr<ForwardResult> ran = RunOn(worker, request.Inputs());
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_EQ(ran->execution.code_path, "reference/cpu");
}

TEST(JobRouteTest, PlacementRoutesTheJobAndExecutionReportsIt) {
  auto engine = LocalEngine::Create({Cpu()}, EngineOptions{}, nullptr);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const SmallRequest request;
  ForwardInputs inputs = request.Inputs();
  // Whatever a caller puts there, placement decides the route.
  inputs.route = {"flash", "sm90", "not placement's"};
  std::promise<absl::StatusOr<ForwardResult>> answer;
  ASSERT_TRUE((*engine)
                  ->Enqueue(ForwardJob{std::move(inputs),
                                       [&](auto r) { answer.set_value(std::move(r)); }})
                  .ok());
  absl::StatusOr<ForwardResult> result = answer.get_future().get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->execution.code_path, "reference/cpu");
}

TEST(JobRouteTest, ALaunchNeverMixesRoutes) {
  const SmallRequest request;
  ForwardInputs a = request.Inputs(), b = request.Inputs();
  a.route = b.route = {"flash", "sm90", ""};
  EXPECT_TRUE(Compatible(a, b));
  b.route.code_path = "sm80";
  EXPECT_FALSE(Compatible(a, b));
}

}  // namespace
}  // namespace attnserve::engine

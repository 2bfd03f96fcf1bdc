#include "server/engine/local_engine.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "gtest/gtest.h"

namespace attnserve::engine {
namespace {

// One query row per sequence attending exactly one key: out must equal that key's v row and
// lse must equal scale * q.k, an answer that needs no reference implementation.
struct SingleKeyProblem {
  explicit SingleKeyProblem(int batch, float seed) : batch(batch) {
    for (int i = 0; i < batch * kDim; ++i) {
      q.push_back(std::sin(seed + i));
      k.push_back(std::cos(seed + 2 * i));
      v.push_back(seed + 0.25f * i);
    }
    for (int b = 0; b <= batch; ++b) cu.push_back(b);
  }

  ForwardInputs Inputs() const {
    ForwardInputs in;
    const std::vector<int64_t> shape = {batch, 1, kDim};
    in.q = {DType::kFloat32, shape, reinterpret_cast<const char*>(q.data()), q.size() * 4};
    in.k = {DType::kFloat32, shape, reinterpret_cast<const char*>(k.data()), k.size() * 4};
    in.v = {DType::kFloat32, shape, reinterpret_cast<const char*>(v.data()), v.size() * 4};
    in.cu_seqlens_q = cu;
    in.cu_seqlens_k = cu;
    in.options.softmax_scale = 0.5f;
    return in;
  }

  void Check(const ForwardResult& r) const {
    ASSERT_EQ(r.out.data.size(), v.size() * 4);
    std::vector<float> out(v.size());
    std::memcpy(out.data(), r.out.data.data(), r.out.data.size());
    for (size_t i = 0; i < v.size(); ++i) EXPECT_FLOAT_EQ(out[i], v[i]) << i;
    std::vector<float> lse(batch);
    std::memcpy(lse.data(), r.lse.data.data(), r.lse.data.size());
    for (int b = 0; b < batch; ++b) {
      float dot = 0;
      for (int d = 0; d < kDim; ++d) dot += q[b * kDim + d] * k[b * kDim + d];
      EXPECT_NEAR(lse[b], 0.5f * dot, 1e-5) << b;
    }
    EXPECT_EQ(r.execution.device, "cpu");
    EXPECT_EQ(r.execution.kernel, "reference");
    EXPECT_EQ(r.execution.code_path, "reference/cpu");
    EXPECT_GE(r.execution.batched_requests, 1);
  }

  static constexpr int kDim = 8;
  int64_t batch;
  std::vector<float> q, k, v;
  std::vector<int32_t> cu;
};

std::unique_ptr<LocalEngine> MakeEngine() {
  devices::DeviceDescription cpu;
  cpu.name = "cpu";
  auto engine = LocalEngine::Create({cpu}, EngineOptions{}, nullptr);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return *std::move(engine);
}

TEST(LocalEngineTest, AnswersAForwardJob) {
  auto engine = MakeEngine();
  SingleKeyProblem problem(3, 1.0f);
  std::promise<absl::StatusOr<ForwardResult>> answer;
  ASSERT_TRUE(engine->Enqueue(ForwardJob{problem.Inputs(), [&](auto r) {
                                           answer.set_value(std::move(r));
                                         }})
                  .ok());
  absl::StatusOr<ForwardResult> result = answer.get_future().get();
  ASSERT_TRUE(result.ok()) << result.status();
  problem.Check(*result);
}

TEST(LocalEngineTest, InvalidJobIsRejectedAndNeverAnswered) {
  auto engine = MakeEngine();
  SingleKeyProblem problem(2, 0.0f);
  ForwardInputs in = problem.Inputs();
  in.cu_seqlens_q = {0, 2, 1};
  bool called = false;
  absl::Status s = engine->Enqueue(ForwardJob{in, [&](auto) { called = true; }});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  engine->Stop();
  EXPECT_FALSE(called);
  EXPECT_EQ(engine->InflightCount(), 0);
}

TEST(LocalEngineTest, TensorsInDeviceMemoryNeedThatCudaDeviceServed) {
  auto engine = MakeEngine();
  SingleKeyProblem problem(2, 0.5f);
  ForwardInputs in = problem.Inputs();
  in.q.device = in.k.device = in.v.device = 0;  // as a CUDA shared memory region's
  bool called = false;
  const absl::Status s = engine->Enqueue(ForwardJob{in, [&](auto) { called = true; }});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "the request's tensors are in the memory of CUDA device 0, which this server does "
            "not serve");
  in.k.device = -1;
  EXPECT_EQ(engine->Enqueue(ForwardJob{in, [&](auto) { called = true; }}).code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::shared_ptr<ForeignDeviceMemory>> opened =
      engine->OpenForeignDeviceMemory(0, std::string(64, 'x'), 4096);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  engine->Stop();
  EXPECT_FALSE(called);
}

TEST(LocalEngineTest, ConcurrentJobsEachGetTheirOwnAnswerOnce) {
  auto engine = MakeEngine();
  constexpr int kThreads = 8, kJobsPerThread = 20;
  std::vector<SingleKeyProblem> problems;
  for (int i = 0; i < kThreads * kJobsPerThread; ++i) problems.emplace_back(1 + i % 5, i);
  std::vector<std::atomic<int>> answered(problems.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int j = 0; j < kJobsPerThread; ++j) {
        const int id = t * kJobsPerThread + j;
        ASSERT_TRUE(engine->Enqueue(ForwardJob{problems[id].Inputs(), [&, id](auto r) {
                                                 ASSERT_TRUE(r.ok());
                                                 problems[id].Check(*r);
                                                 answered[id]++;
                                               }})
                        .ok());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  engine->Stop();  // drains every accepted job
  for (size_t i = 0; i < answered.size(); ++i) EXPECT_EQ(answered[i].load(), 1) << i;
  EXPECT_EQ(engine->InflightCount(), 0);
}

TEST(LocalEngineTest, RequestLargerThanTheDeviceIsRefusedWithTheNumbers) {
  devices::DeviceDescription tiny;
  tiny.name = "cpu";
  tiny.memory_total_bytes = 100;
  auto engine = LocalEngine::Create({tiny}, EngineOptions{}, nullptr);
  ASSERT_TRUE(engine.ok());
  SingleKeyProblem problem(4, 0.0f);  // 4 rows of 8 floats in each of q, k, v, out: > 100 bytes
  absl::Status s = (*engine)->Enqueue(ForwardJob{problem.Inputs(), [](auto) {}});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("device memory"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("100 in all"), absl::string_view::npos) << s;
}

TEST(LocalEngineTest, RefusesWorkAfterStop) {
  auto engine = MakeEngine();
  engine->Stop();
  SingleKeyProblem problem(1, 0.0f);
  absl::Status s = engine->Enqueue(ForwardJob{problem.Inputs(), [](auto) {}});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
}

TEST(LocalEngineTest, DrainRefusesNewWorkAndWaitsForAcceptedWork) {
  auto engine = MakeEngine();
  std::vector<SingleKeyProblem> problems;
  for (int i = 0; i < 20; ++i) problems.emplace_back(4, i);
  std::atomic<int> answered{0};
  for (auto& problem : problems) {
    ASSERT_TRUE(engine->Enqueue(ForwardJob{problem.Inputs(), [&](auto) { answered++; }}).ok());
  }
  EXPECT_TRUE(engine->Drain(absl::Seconds(30)));
  EXPECT_EQ(answered.load(), 20);
  EXPECT_EQ(engine->InflightCount(), 0);
  absl::Status s = engine->Enqueue(ForwardJob{problems[0].Inputs(), [](auto) {}});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
}

TEST(LocalEngineTest, RejectsDevicesItCannotRunOn) {
  devices::DeviceDescription gpu;
  gpu.kind = devices::DeviceKind::kCuda;
  gpu.name = "cuda:0";
  // Without CUDA support, or on a machine without that GPU, creating its worker fails cleanly.
  auto engine = LocalEngine::Create({gpu}, EngineOptions{}, nullptr);
  EXPECT_FALSE(engine.ok());
  EXPECT_EQ(LocalEngine::Create({}, EngineOptions{}, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LocalEngineTest, ReportsDevicesAndFamilies) {
  auto engine = MakeEngine();
  ASSERT_EQ(engine->Devices().size(), 1u);
  EXPECT_EQ(engine->Devices()[0].name, "cpu");
  EXPECT_EQ(engine->KernelFamilies(), std::vector<std::string>{"reference"});
}


// Two host "devices" with their own memory budgets, for placement through the engine.
std::unique_ptr<LocalEngine> MakeTwoDeviceEngine(int64_t small_budget) {
  devices::DeviceDescription small, large;
  small.name = "cpu-small";
  small.memory_total_bytes = small_budget;
  large.name = "cpu-large";
  auto engine = LocalEngine::Create({small, large}, EngineOptions{}, nullptr);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return *std::move(engine);
}

TEST(LocalEngineTest, ARequestGoesToTheDeviceThatCanHoldIt) {
  auto engine = MakeTwoDeviceEngine(/*small_budget=*/100);
  SingleKeyProblem problem(4, 2.0f);  // more than 100 bytes of tensors
  std::promise<absl::StatusOr<ForwardResult>> answer;
  ASSERT_TRUE(engine->Enqueue(ForwardJob{problem.Inputs(), [&](auto r) {
                                           answer.set_value(std::move(r));
                                         }})
                  .ok());
  absl::StatusOr<ForwardResult> result = answer.get_future().get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->execution.device, "cpu-large");
}

TEST(LocalEngineTest, ConcurrentLoadIsSpreadOverEqualDevices) {
  auto engine = MakeTwoDeviceEngine(/*small_budget=*/0);
  std::vector<SingleKeyProblem> problems;
  for (int i = 0; i < 64; ++i) problems.emplace_back(64, i);
  std::mutex mu;
  std::map<std::string, int> by_device;
  for (auto& problem : problems) {
    ASSERT_TRUE(engine->Enqueue(ForwardJob{problem.Inputs(), [&](auto r) {
                                             ASSERT_TRUE(r.ok());
                                             std::lock_guard<std::mutex> lock(mu);
                                             by_device[r->execution.device]++;
                                           }})
                    .ok());
  }
  engine->Stop();
  EXPECT_EQ(by_device["cpu-small"] + by_device["cpu-large"], 64);
  EXPECT_GT(by_device["cpu-small"], 0);
  EXPECT_GT(by_device["cpu-large"], 0);
}

TEST(LocalEngineTest, RefusesARequestOverTheComputeLimitBeforeAnyWork) {
  // One 65,536-token sequence at head_dim 1 (786 KB on the wire): 4.3e9 scores, over a minute
  // of two host threads, though its FLOPs are a second's worth.
  constexpr int64_t kTokens = 65536;
  const std::vector<float> data(kTokens, 1.0f);
  const TensorView tensor{DType::kFloat32, {kTokens, 1, 1},
                          reinterpret_cast<const char*>(data.data()), data.size() * 4};
  ForwardInputs in;
  in.q = in.k = in.v = tensor;
  in.cu_seqlens_q = in.cu_seqlens_k = {0, kTokens};
  devices::DeviceDescription cpu;
  cpu.name = "cpu";
  EngineOptions options;
  options.cpu_threads = 2;
  auto engine = LocalEngine::Create({cpu}, options, nullptr);
  ASSERT_TRUE(engine.ok()) << engine.status();
  bool answered = false;
  absl::Status status = (*engine)->Enqueue(ForwardJob{in, [&](auto) { answered = true; }});
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(),
            "the request's estimated compute time, 72.7 s on cpu (4.29e+09 attention scores, "
            "1.72e+10 FLOPs), exceeds the server's limit max_request_compute_seconds = 30; send "
            "fewer or shorter sequences per request");
  EXPECT_FALSE(answered);
  // Causal with a 16-key window it is 1e6 scores, milliseconds: admitted.
  in.options.causal = true;
  in.options.window_left = 15;
  std::promise<absl::StatusOr<ForwardResult>> answer;
  ASSERT_TRUE((*engine)->Enqueue(ForwardJob{in, [&](auto r) { answer.set_value(std::move(r)); }})
                  .ok());
  EXPECT_TRUE(answer.get_future().get().ok());
}

}  // namespace
}  // namespace attnserve::engine

// Saved contexts through the engine on the CPU device: keep, use, expire, evict, release,
// unknown ids, fields that disagree, memory accounting, and batching beside them.
#include <cmath>
#include <future>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/local_engine.h"

namespace attnserve::engine {
namespace {

using ::testing::HasSubstr;

// A float32 problem of two sequences with fresh non-trivial values; its backward inputs
// (dout, and out/lse from the engine's own forward) are kept alongside.
struct Problem {
  explicit Problem(float seed, int heads = 2) : heads(heads) {
    auto fill = [seed](std::vector<float>& v, size_t n, float step) {
      for (size_t i = 0; i < n; ++i) v.push_back(std::sin(seed + step * static_cast<float>(i)));
    };
    fill(q, kTotalQ * heads * kDim, 0.37f);
    fill(k, kTotalK * kDim, 0.61f);
    fill(v, kTotalK * kDim, 0.23f);
    fill(dout, kTotalQ * heads * kDim, 0.19f);
  }

  static TensorView View(const std::vector<float>& data, std::vector<int64_t> shape) {
    return {DType::kFloat32, std::move(shape), reinterpret_cast<const char*>(data.data()),
            data.size() * sizeof(float)};
  }
  static TensorView View(const std::string& data, std::vector<int64_t> shape) {
    return {DType::kFloat32, std::move(shape), data.data(), data.size()};
  }

  ForwardInputs Forward(bool keep) const {
    ForwardInputs in;
    in.q = View(q, {kTotalQ, heads, kDim});
    in.k = View(k, {kTotalK, 1, kDim});
    in.v = View(v, {kTotalK, 1, kDim});
    in.cu_seqlens_q = {0, 3, kTotalQ};
    in.cu_seqlens_k = {0, 4, kTotalK};
    in.options.causal = true;
    in.keep_context = keep;
    return in;
  }

  // The full backward, on the forward's answer.
  BackwardInputs FullBackward(const ForwardResult& forward) const {
    const ForwardInputs f = Forward(false);
    BackwardInputs in;
    in.dout = View(dout, {kTotalQ, heads, kDim});
    in.q = f.q;
    in.k = f.k;
    in.v = f.v;
    in.out = View(forward.out.data, {kTotalQ, heads, kDim});
    in.lse = View(forward.lse.data, {heads, kTotalQ});
    in.cu_seqlens_q = f.cu_seqlens_q;
    in.cu_seqlens_k = f.cu_seqlens_k;
    in.options = f.options;
    return in;
  }

  // Only dout and the id.
  BackwardInputs ByContext(const std::string& id, bool keep = false) const {
    BackwardInputs in;
    in.dout = View(dout, {kTotalQ, heads, kDim});
    in.context_id = id;
    in.keep_context = keep;
    return in;
  }

  static constexpr int64_t kTotalQ = 7, kTotalK = 9, kDim = 8;
  int64_t heads;
  std::vector<float> q, k, v, dout;
};

// The bytes a CPU context of Problem holds: q, k, v, out, lse and both offsets.
int64_t ContextBytes(const Problem& p) {
  return static_cast<int64_t>((2 * p.q.size() + p.k.size() + p.v.size()) * sizeof(float) +
                              p.heads * Problem::kTotalQ * sizeof(float) + 6 * sizeof(int32_t));
}

devices::DeviceDescription Cpu(const std::string& name = "cpu",
                               int64_t memory = int64_t{1} << 30) {
  devices::DeviceDescription cpu;
  cpu.name = name;
  cpu.memory_total_bytes = memory;
  return cpu;
}

std::unique_ptr<LocalEngine> MakeEngine(const EngineOptions& options = {},
                                        std::vector<devices::DeviceDescription> devices = {Cpu()},
                                        metrics::ServerMetrics* metrics = nullptr) {
  auto engine = LocalEngine::Create(devices, options, metrics);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return *std::move(engine);
}

absl::StatusOr<ForwardResult> RunForward(Engine& engine, ForwardInputs in,
                                         const std::string& principal = "") {
  std::promise<absl::StatusOr<ForwardResult>> answer;
  ForwardJob job{std::move(in), [&](auto r) { answer.set_value(std::move(r)); }};
  job.control.principal = principal;
  if (absl::Status s = engine.Enqueue(std::move(job)); !s.ok()) return s;
  return answer.get_future().get();
}

absl::StatusOr<BackwardResult> RunBackward(Engine& engine, BackwardInputs in,
                                           const std::string& principal = "") {
  std::promise<absl::StatusOr<BackwardResult>> answer;
  BackwardJob job{std::move(in), [&](auto r) { answer.set_value(std::move(r)); }};
  job.control.principal = principal;
  if (absl::Status s = engine.Enqueue(std::move(job)); !s.ok()) return s;
  return answer.get_future().get();
}

void ExpectNotFound(const absl::Status& s, const std::string& id) {
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(id));
}

TEST(EngineContextTest, ABackwardByContextEqualsTheFullBackwardBitwiseAndReleasesIt) {
  metrics::ServerMetrics metrics("test");
  auto engine = MakeEngine({}, {Cpu()}, &metrics);
  const Problem problem(0.5f);
  absl::StatusOr<ForwardResult> forward = RunForward(*engine, problem.Forward(true));
  ASSERT_TRUE(forward.ok()) << forward.status();
  ASSERT_EQ(forward->context_id.size(), 32u);
  EXPECT_THAT(metrics.Serialize(), HasSubstr("attnserve_contexts{device=\"cpu\"} 1"));

  absl::StatusOr<BackwardResult> full = RunBackward(*engine, problem.FullBackward(*forward));
  ASSERT_TRUE(full.ok()) << full.status();
  absl::StatusOr<BackwardResult> by_context =
      RunBackward(*engine, problem.ByContext(forward->context_id));
  ASSERT_TRUE(by_context.ok()) << by_context.status();
  EXPECT_EQ(by_context->dq.data, full->dq.data);
  EXPECT_EQ(by_context->dk.data, full->dk.data);
  EXPECT_EQ(by_context->dv.data, full->dv.data);
  EXPECT_EQ(by_context->dq.shape, full->dq.shape);
  EXPECT_EQ(by_context->dk.shape, full->dk.shape);
  EXPECT_EQ(by_context->execution.device, "cpu");

  // Released by its backward.
  ExpectNotFound(RunBackward(*engine, problem.ByContext(forward->context_id)).status(),
                 forward->context_id);
  EXPECT_FALSE(engine->ReleaseContext(forward->context_id, ""));
  EXPECT_THAT(metrics.Serialize(), HasSubstr("attnserve_contexts{device=\"cpu\"} 0"));
  EXPECT_THAT(metrics.Serialize(), HasSubstr("attnserve_context_releases_total 1"));
}

TEST(EngineContextTest, DkAndDvGoWhereTheOutputSpaceAllocatesThemOnceTheContextIsKnown) {
  auto engine = MakeEngine({}, {Cpu()});
  const Problem problem(0.25f);
  absl::StatusOr<ForwardResult> forward = RunForward(*engine, problem.Forward(true));
  ASSERT_TRUE(forward.ok()) << forward.status();
  absl::StatusOr<BackwardResult> full = RunBackward(*engine, problem.FullBackward(*forward));
  ASSERT_TRUE(full.ok()) << full.status();

  std::string buffers[3];
  std::vector<std::pair<size_t, size_t>> asked;  // (output, bytes)
  BackwardInputs in = problem.ByContext(forward->context_id);
  in.output_space.allocate = [&](size_t output, size_t bytes) {
    asked.emplace_back(output, bytes);
    buffers[output].assign(bytes, '\0');
    return buffers[output].data();
  };
  absl::StatusOr<BackwardResult> by_context = RunBackward(*engine, std::move(in));
  ASSERT_TRUE(by_context.ok()) << by_context.status();
  const size_t k_bytes = problem.k.size() * sizeof(float);
  EXPECT_EQ(asked, (std::vector<std::pair<size_t, size_t>>{{1, k_bytes}, {2, k_bytes}}));
  EXPECT_TRUE(by_context->dk.data.empty());
  EXPECT_TRUE(by_context->dv.data.empty());
  EXPECT_EQ(buffers[1], full->dk.data);
  EXPECT_EQ(buffers[2], full->dv.data);
  EXPECT_EQ(by_context->dq.data, full->dq.data);  // no destination given: the result owns it
}

TEST(EngineContextTest, ABackwardIsCheckedAgainstTheComputeLimitAsTwoAndAHalfForwards) {
  EngineOptions options;
  options.cpu_threads = 1;
  // Problem's causal forward is 46 scores and 1024 FLOPs: ~1.7 µs on one host thread; its
  // backward ~4.2 µs. A limit between the two admits the forward only.
  options.limits.max_request_compute_seconds = 3e-6;
  auto engine = MakeEngine(options);
  const Problem problem(0.5f);
  absl::StatusOr<ForwardResult> forward = RunForward(*engine, problem.Forward(true));
  ASSERT_TRUE(forward.ok()) << forward.status();
  const std::string refusal =
      "the request's estimated compute time, 4.15e-06 s on cpu (115 attention scores, 2.56e+03 "
      "FLOPs), exceeds the server's limit max_request_compute_seconds = 3e-06; send fewer or "
      "shorter sequences per request";
  absl::StatusOr<BackwardResult> by_context =
      RunBackward(*engine, problem.ByContext(forward->context_id));
  EXPECT_EQ(by_context.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(by_context.status().message(), refusal);
  absl::StatusOr<BackwardResult> full = RunBackward(*engine, problem.FullBackward(*forward));
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(full.status().message(), refusal);
}

TEST(EngineContextTest, AForwardWithoutKeepContextKeepsNothing) {
  auto engine = MakeEngine();
  absl::StatusOr<ForwardResult> forward = RunForward(*engine, Problem(1).Forward(false));
  ASSERT_TRUE(forward.ok());
  EXPECT_TRUE(forward->context_id.empty());
}

TEST(EngineContextTest, KeepContextOnTheBackwardAndReleaseContext) {
  auto engine = MakeEngine();
  const Problem problem(1.5f);
  const std::string id = RunForward(*engine, problem.Forward(true))->context_id;
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(RunBackward(*engine, problem.ByContext(id, /*keep=*/true)).ok());
  ASSERT_TRUE(RunBackward(*engine, problem.ByContext(id, /*keep=*/true)).ok());
  EXPECT_TRUE(engine->ReleaseContext(id, ""));
  EXPECT_FALSE(engine->ReleaseContext(id, ""));
  ExpectNotFound(RunBackward(*engine, problem.ByContext(id)).status(), id);
}

TEST(EngineContextTest, UnknownIdsAndOtherPrincipalsGetNotFound) {
  auto engine = MakeEngine();
  const Problem problem(2);
  ExpectNotFound(RunBackward(*engine, problem.ByContext("0123456789abcdef")).status(),
                 "0123456789abcdef");
  const std::string id = RunForward(*engine, problem.Forward(true), "alice")->context_id;
  ASSERT_FALSE(id.empty());
  ExpectNotFound(RunBackward(*engine, problem.ByContext(id), "mallory").status(), id);
  EXPECT_FALSE(engine->ReleaseContext(id, "mallory"));
  EXPECT_TRUE(RunBackward(*engine, problem.ByContext(id), "alice").ok());
}

TEST(EngineContextTest, FieldsThatDisagreeWithTheContextAreNamed) {
  auto engine = MakeEngine();
  const Problem problem(3);
  absl::StatusOr<ForwardResult> forward = RunForward(*engine, problem.Forward(true));
  const std::string id = forward->context_id;
  ASSERT_FALSE(id.empty());
  auto expect_invalid = [&](BackwardInputs in, const std::string& field) {
    const absl::Status s = RunBackward(*engine, std::move(in)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(field));
  };
  const std::vector<float> short_q(Problem::kTotalQ * problem.heads * 4, 1.0f);
  BackwardInputs in = problem.ByContext(id);
  in.q = Problem::View(short_q, {Problem::kTotalQ, problem.heads, 4});
  expect_invalid(in, "q.shape");
  in = problem.ByContext(id);
  in.k = Problem::View(problem.k, {Problem::kTotalK, 1, Problem::kDim});
  in.k.dtype = DType::kBFloat16;
  expect_invalid(in, "k.dtype");
  in = problem.ByContext(id);
  in.lse = Problem::View(forward->lse.data, {Problem::kTotalQ, problem.heads});
  expect_invalid(in, "lse.shape");
  in = problem.ByContext(id);
  in.cu_seqlens_q = {0, 4, Problem::kTotalQ};
  expect_invalid(in, "cu_seqlens_q");
  in = problem.ByContext(id);
  in.options.causal = false;
  in.options.softcap = 3;
  expect_invalid(in, "options");
  in = problem.ByContext(id);
  in.dout.shape = {Problem::kTotalQ, problem.heads, Problem::kDim / 2};
  expect_invalid(in, "dout.shape");

  // What agrees may be sent; the failures left the context in place.
  in = problem.FullBackward(*forward);
  in.context_id = id;
  EXPECT_TRUE(RunBackward(*engine, in).ok());
}

TEST(EngineContextTest, ContextsExpireAfterTheTtl) {
  EngineOptions options;
  options.contexts.ttl = absl::Milliseconds(200);
  auto engine = MakeEngine(options);
  const Problem problem(4);
  const std::string id = RunForward(*engine, problem.Forward(true))->context_id;
  ASSERT_FALSE(id.empty());
  absl::SleepFor(absl::Milliseconds(400));
  ExpectNotFound(RunBackward(*engine, problem.ByContext(id)).status(), id);
}

TEST(EngineContextTest, TheLeastRecentlyUsedIsEvictedAndTooLargeIsNotKept) {
  const Problem problem(5);
  EngineOptions options;
  options.contexts.memory_bytes = ContextBytes(problem) * 2;
  auto engine = MakeEngine(options);
  const std::string a = RunForward(*engine, problem.Forward(true))->context_id;
  const std::string b = RunForward(*engine, problem.Forward(true))->context_id;
  ASSERT_TRUE(RunBackward(*engine, problem.ByContext(a, /*keep=*/true)).ok());  // b is older now
  const std::string c = RunForward(*engine, problem.Forward(true))->context_id;
  ASSERT_FALSE(c.empty());
  ExpectNotFound(RunBackward(*engine, problem.ByContext(b)).status(), b);
  EXPECT_TRUE(RunBackward(*engine, problem.ByContext(a)).ok());
  EXPECT_TRUE(RunBackward(*engine, problem.ByContext(c)).ok());

  // A larger problem cannot fit even alone: answered, with no context.
  const Problem larger(6, /*heads=*/8);
  absl::StatusOr<ForwardResult> forward = RunForward(*engine, larger.Forward(true));
  ASSERT_TRUE(forward.ok()) << forward.status();
  EXPECT_TRUE(forward->context_id.empty());
  EXPECT_FALSE(forward->out.data.empty());
}

TEST(EngineContextTest, ContextsCountAgainstTheirDevicesMemory) {
  // Two equal host devices whose budget holds one request beside nothing else: once one keeps
  // a context, new requests go to the other.
  const Problem problem(7);
  const int64_t budget = ContextBytes(problem) * 3 / 2;
  EngineOptions options;
  options.device_memory_bytes = budget;
  options.contexts.memory_bytes = budget;
  auto engine = MakeEngine(options, {Cpu("cpu:a", budget), Cpu("cpu:b", budget)});
  absl::StatusOr<ForwardResult> kept = RunForward(*engine, problem.Forward(true));
  ASSERT_FALSE(kept->context_id.empty());
  const std::string holder = kept->execution.device;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<ForwardResult> other = RunForward(*engine, problem.Forward(false));
    ASSERT_TRUE(other.ok());
    EXPECT_NE(other->execution.device, holder);
  }
  // The backward goes where its context is.
  absl::StatusOr<BackwardResult> backward =
      RunBackward(*engine, problem.ByContext(kept->context_id));
  ASSERT_TRUE(backward.ok()) << backward.status();
  EXPECT_EQ(backward->execution.device, holder);
}

TEST(EngineContextTest, ContextJobsRunAloneAndTheRestStillBatch) {
  EngineOptions options;
  options.batching.enabled = true;
  options.batching.max_queue_delay = absl::Milliseconds(300);
  auto engine = MakeEngine(options);
  const Problem problem(8);
  std::promise<absl::StatusOr<ForwardResult>> answers[3];
  const bool keep[3] = {false, true, false};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(engine
                    ->Enqueue(ForwardJob{problem.Forward(keep[i]),
                                         [&, i](auto r) { answers[i].set_value(std::move(r)); }})
                    .ok());
  }
  absl::StatusOr<ForwardResult> results[3];
  for (int i = 0; i < 3; ++i) {
    results[i] = answers[i].get_future().get();
    ASSERT_TRUE(results[i].ok()) << results[i].status();
  }
  EXPECT_EQ(results[1]->execution.batched_requests, 1);
  EXPECT_FALSE(results[1]->context_id.empty());
  EXPECT_EQ(results[0]->execution.batched_requests, 2);
  EXPECT_EQ(results[2]->execution.batched_requests, 2);
  EXPECT_TRUE(results[0]->context_id.empty());
  EXPECT_EQ(results[0]->out.data, results[1]->out.data);
}

TEST(EngineContextTest, ReportsItsLimits) {
  EngineOptions options;
  options.contexts.ttl = absl::Seconds(42);
  auto engine = MakeEngine(options, {Cpu("cpu", 1000)});
  EXPECT_EQ(engine->context_limits().memory_bytes, 250);  // a quarter by default
  EXPECT_EQ(engine->context_limits().ttl, absl::Seconds(42));
}

}  // namespace
}  // namespace attnserve::engine

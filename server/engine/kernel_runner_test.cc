#include "server/engine/kernel_runner.h"

#include <random>
#include <string>

#include "gtest/gtest.h"
#include "server/engine/cpu_worker.h"
#include "server/engine/sequence_groups.h"

namespace attnserve::engine {
namespace {

constexpr int64_t kHeads = 4, kDim = 16;

std::string RandomBytes(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string bytes(count, '\0');
  for (char& c : bytes) c = static_cast<char>(rng() % 64);  // finite, varied bf16 values
  return bytes;
}

TensorView View(const std::string& bytes, int64_t rows) {
  return {DType::kBFloat16, {rows, kHeads, kDim}, bytes.data(), bytes.size()};
}

struct Request {
  std::vector<int32_t> cu = {0, 7, 7, 40, 41};
  int64_t rows = 41;
  std::string q = RandomBytes(rows * kHeads * kDim * 2, 1);
  std::string k = RandomBytes(rows * kHeads * kDim * 2, 2);
  std::string v = RandomBytes(rows * kHeads * kDim * 2, 3);
  std::string dout = RandomBytes(rows * kHeads * kDim * 2, 4);

  ForwardInputs Forward() const {
    ForwardInputs in;
    in.q = View(q, rows);
    in.k = View(k, rows);
    in.v = View(v, rows);
    in.cu_seqlens_q = in.cu_seqlens_k = cu;
    in.options.causal = true;
    return in;
  }

  // The backward of Forward(), whose results `forward` holds.
  BackwardInputs Backward(const ForwardResult& forward) const {
    BackwardInputs in;
    const ForwardInputs f = Forward();
    in.q = f.q;
    in.k = f.k;
    in.v = f.v;
    in.dout = View(dout, rows);
    in.out = {DType::kBFloat16, forward.out.shape, forward.out.data.data(),
              forward.out.data.size()};
    in.lse = {DType::kFloat32, forward.lse.shape, forward.lse.data.data(),
              forward.lse.data.size()};
    in.cu_seqlens_q = in.cu_seqlens_k = cu;
    in.options = f.options;
    return in;
  }
};

TEST(KernelRunnerTest, ForwardWritesOutOverQAndLseIntoTheOutputSpace) {
  Request request;
  absl::StatusOr<ForwardResult> owned = RunForward(kReferenceFamily, request.Forward(), {});
  ASSERT_TRUE(owned.ok()) << owned.status();

  // The transport's receive buffer: out is written over q, which the run reads first.
  std::string received_q = request.q;
  std::string lse(owned->lse.data.size(), '\0');
  ForwardInputs in = request.Forward();
  in.q.data = received_q.data();
  in.output_space.destinations = {received_q.data(), lse.data()};
  absl::StatusOr<ForwardResult> placed = RunForward(kReferenceFamily, in, {});
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_TRUE(placed->out.data.empty());
  EXPECT_TRUE(placed->lse.data.empty());
  EXPECT_EQ(placed->out.shape, owned->out.shape);
  EXPECT_EQ(placed->out.size_bytes(), owned->out.data.size());
  EXPECT_EQ(received_q, owned->out.data);
  EXPECT_EQ(lse, owned->lse.data);
}

TEST(KernelRunnerTest, ForwardByArrivingGroupsEqualsTheWholeRunBitForBit) {
  Request request;
  absl::StatusOr<ForwardResult> whole = RunForward(kReferenceFamily, request.Forward(), {});
  ASSERT_TRUE(whole.ok()) << whole.status();

  std::string received_q = request.q;
  std::string lse(whole->lse.data.size(), '\0');
  std::vector<int> finished;
  ForwardInputs in = request.Forward();
  in.q.data = received_q.data();
  in.output_space.destinations = {received_q.data(), lse.data()};
  // Groups of sequences {0}, {1, 2} (an empty sequence inside), {3}.
  in.groups = std::make_shared<SequenceGroups>(std::vector<int32_t>{1, 3, 4},
                                               absl::InfiniteFuture(), nullptr,
                                               [&](int g) { finished.push_back(g); });
  for (int g = 0; g < 3; ++g) in.groups->MarkArrived(g);
  absl::StatusOr<ForwardResult> grouped = RunForward(kReferenceFamily, in, {});
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  EXPECT_EQ(finished, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(grouped->lse.shape, whole->lse.shape);
  EXPECT_EQ(received_q, whole->out.data);
  EXPECT_EQ(lse, whole->lse.data);
}

TEST(KernelRunnerTest, BackwardIgnoresOverlaysButFillsOtherDestinations) {
  Request request;
  absl::StatusOr<ForwardResult> forward = RunForward(kReferenceFamily, request.Forward(), {});
  ASSERT_TRUE(forward.ok());
  BackwardInputs in = request.Backward(*forward);
  absl::StatusOr<BackwardResult> owned = RunBackward(kReferenceFamily, in, {});
  ASSERT_TRUE(owned.ok()) << owned.status();

  // dq over dout and dk over k are overlays the reference cannot honour; dv has its own space.
  std::string dout = request.dout, k = request.k, dv(request.v.size(), '\0');
  in.dout.data = dout.data();
  in.k.data = k.data();
  in.output_space.destinations = {dout.data(), k.data(), dv.data()};
  absl::StatusOr<BackwardResult> placed = RunBackward(kReferenceFamily, in, {});
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->dq.data, owned->dq.data);
  EXPECT_EQ(placed->dk.data, owned->dk.data);
  EXPECT_TRUE(placed->dv.data.empty());
  EXPECT_EQ(dv, owned->dv.data);
  EXPECT_EQ(dout, request.dout);  // untouched
}

TEST(KernelRunnerTest, BackwardByArrivingGroupsEqualsTheWholeRunAndWritesOverlaysPerGroup) {
  Request request;
  absl::StatusOr<ForwardResult> forward = RunForward(kReferenceFamily, request.Forward(), {});
  ASSERT_TRUE(forward.ok());
  BackwardInputs in = request.Backward(*forward);
  absl::StatusOr<BackwardResult> whole = RunBackward(kReferenceFamily, in, {});
  ASSERT_TRUE(whole.ok()) << whole.status();

  // The data channel's receive buffer: dq over dout, dk over k, dv over v, each group's rows
  // written once that group has read its own.
  std::string dout = request.dout, k = request.k, v = request.v;
  in.dout.data = dout.data();
  in.k.data = k.data();
  in.v.data = v.data();
  in.output_space.destinations = {dout.data(), k.data(), v.data()};
  std::vector<int> finished;
  in.groups = std::make_shared<SequenceGroups>(std::vector<int32_t>{1, 3, 4},
                                               absl::InfiniteFuture(), nullptr,
                                               [&](int g) { finished.push_back(g); });
  for (int g = 0; g < 3; ++g) in.groups->MarkArrived(g);
  absl::StatusOr<BackwardResult> grouped = RunBackward(kReferenceFamily, in, {});
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  EXPECT_EQ(finished, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(grouped->dq.data.empty());
  EXPECT_EQ(grouped->dk.shape, whole->dk.shape);
  EXPECT_EQ(dout, whole->dq.data);
  EXPECT_EQ(k, whole->dk.data);
  EXPECT_EQ(v, whole->dv.data);
}

TEST(KernelRunnerTest, ABackwardWaitingForAGroupStopsAtItsDeadline) {
  Request request;
  absl::StatusOr<ForwardResult> forward = RunForward(kReferenceFamily, request.Forward(), {});
  ASSERT_TRUE(forward.ok());
  BackwardInputs in = request.Backward(*forward);
  std::vector<int> finished;
  in.groups = std::make_shared<SequenceGroups>(std::vector<int32_t>{1, 4},
                                               absl::Now() + absl::Milliseconds(50), nullptr,
                                               [&](int g) { finished.push_back(g); });
  in.groups->MarkArrived(0);  // group 1 never arrives
  absl::StatusOr<BackwardResult> result = RunBackward(kReferenceFamily, in, {});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(finished, (std::vector<int>{0}));
}

}  // namespace
}  // namespace attnserve::engine

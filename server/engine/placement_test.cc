#include "server/engine/placement.h"

#include "gtest/gtest.h"
#include "server/engine/work_estimate.h"

namespace attnserve::engine {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
const KernelCatalog kGpuFamilies{{"flash", "fallback", "cublas", "reference"}};

DeviceState Gpu(const std::string& name, int compute_capability, int64_t memory) {
  DeviceState device;
  device.name = name;
  device.compute_capability = compute_capability;
  device.catalog = kGpuFamilies;
  device.memory_budget = memory;
  return device;
}

DeviceState HostCpu() {
  DeviceState device;
  device.name = "cpu";
  device.catalog = KernelCatalog{{"reference"}};
  device.memory_budget = 64 * kGiB;
  return device;
}

// One bf16 sequence of `tokens` tokens, 16 heads of 128: the training hosts' usual request.
RequestProfile Bf16Forward(double tokens) {
  RequestProfile request;
  request.direction = Direction::kForward;
  request.dtype = DType::kBFloat16;
  request.head_dim = 128;
  request.flops = 4.0 * tokens * tokens * 128 * 16;
  request.scores = tokens * tokens * 16;
  request.device_bytes = static_cast<int64_t>(tokens * 16 * 128 * 2 * 4);
  return request;
}

// A Turing, a Hopper and the host CPU: the mixed host of the fallback issue.
std::vector<DeviceState> MixedHost() {
  return {Gpu("cuda:0", 75, 16 * kGiB), Gpu("cuda:1", 90, 80 * kGiB), HostCpu()};
}

TEST(PlacementTest, TheDeviceWithTheFastestFamilyWins) {
  const RequestProfile request = Bf16Forward(8192);
  std::optional<Placement> placement = Place(request, MixedHost(), 100);
  ASSERT_TRUE(placement);
  EXPECT_EQ(placement->device, 1u);
  EXPECT_EQ(placement->family, "flash");
  EXPECT_TRUE(placement->fits_now);
  EXPECT_DOUBLE_EQ(placement->seconds, EstimatedSeconds(request, "flash", MixedHost()[1]));
  // Without the Hopper, the Turing's GPU family still beats the host CPU by far.
  std::vector<DeviceState> no_hopper = {MixedHost()[0], MixedHost()[2]};
  placement = Place(request, no_hopper, 100);
  ASSERT_TRUE(placement);
  EXPECT_EQ(placement->device, 0u);
  EXPECT_NE(placement->family, "reference");
}

TEST(PlacementTest, ABusyFastDeviceLosesToAnIdleSlowerOne) {
  const RequestProfile request = Bf16Forward(4096);
  std::vector<DeviceState> devices = MixedHost();
  const double on_turing = Place(request, {devices[0]}, 100)->seconds;
  // The Hopper has more queued work than the whole request takes on the Turing.
  devices[1].queued_seconds = 2 * on_turing;
  devices[1].queue_depth = 40;
  std::optional<Placement> placement = Place(request, devices, 100);
  ASSERT_TRUE(placement);
  EXPECT_EQ(placement->device, 0u);
  // With a little queued work the Hopper still finishes first.
  devices[1].queued_seconds = on_turing / 10;
  placement = Place(request, devices, 100);
  ASSERT_TRUE(placement);
  EXPECT_EQ(placement->device, 1u);
}

TEST(PlacementTest, NoRoomNowSendsTheRequestToAnotherDevice) {
  const RequestProfile request = Bf16Forward(16384);
  std::vector<DeviceState> devices = {Gpu("cuda:0", 90, 80 * kGiB), Gpu("cuda:1", 90, 80 * kGiB)};
  // An idle queue, but running work holds all but half of what the request needs.
  devices[0].reserved_bytes = 80 * kGiB - request.device_bytes / 2;
  devices[1].queued_seconds = 0.5;
  std::optional<Placement> placement = Place(request, devices, 100);
  ASSERT_TRUE(placement);
  EXPECT_EQ(placement->device, 1u);
  EXPECT_TRUE(placement->fits_now);
  EXPECT_EQ(placement->device_bytes, request.device_bytes);
}

TEST(PlacementTest, AGpuReservesTheFamilysWorkspaceBesideTheTensors) {
  RequestProfile request = Bf16Forward(16384);
  request.direction = Direction::kBackward;
  // The flash backward's float32 dQ accumulator: twice q's bf16 bytes.
  const int64_t accumulator = 16384 * 16 * 128 * 4;
  request.workspaces = {{"flash", accumulator}, {"cublas", 1 << 20}};
  std::optional<Placement> placement = Place(request, {Gpu("cuda:0", 90, 80 * kGiB)}, 100);
  ASSERT_TRUE(placement);
  EXPECT_EQ(placement->family, "flash");
  EXPECT_EQ(placement->device_bytes, request.device_bytes + accumulator);
  // Room for the tensors but not the workspace beside what runs: it waits.
  DeviceState busy = Gpu("cuda:0", 90, 80 * kGiB);
  busy.reserved_bytes = 80 * kGiB - request.device_bytes - accumulator / 2;
  placement = Place(request, {busy}, 100);
  ASSERT_TRUE(placement);
  EXPECT_FALSE(placement->fits_now);
  // A budget that holds the tensors alone can never hold the request.
  const absl::Status status =
      CheckPlaceable(request, {Gpu("cuda:0", 90, request.device_bytes + accumulator / 2)});
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find(std::to_string(request.device_bytes + accumulator)),
            std::string::npos)
      << status.message();
  // The host CPU device's families allocate no device workspace.
  placement = Place(request, {HostCpu()}, 100);
  ASSERT_TRUE(placement);
  EXPECT_EQ(placement->device_bytes, request.device_bytes);
}

TEST(PlacementTest, WithoutRoomAnywhereItWaitsOnTheDeviceThatFinishesFirst) {
  const RequestProfile request = Bf16Forward(16384);
  std::vector<DeviceState> devices = {Gpu("cuda:0", 90, 80 * kGiB), Gpu("cuda:1", 90, 80 * kGiB)};
  devices[0].reserved_bytes = devices[1].reserved_bytes = 80 * kGiB - request.device_bytes / 2;
  devices[0].queued_seconds = 3;
  devices[1].queued_seconds = 1;
  std::optional<Placement> placement = Place(request, devices, 100);
  ASSERT_TRUE(placement);
  EXPECT_EQ(placement->device, 1u);
  EXPECT_FALSE(placement->fits_now);
}

TEST(PlacementTest, NearTiesGoToTheShorterQueue) {
  const RequestProfile request = Bf16Forward(512);
  std::vector<DeviceState> devices = {Gpu("cuda:0", 90, 80 * kGiB), Gpu("cuda:1", 90, 80 * kGiB)};
  devices[0].queue_depth = 3;
  devices[1].queue_depth = 1;
  devices[1].queued_seconds = 1e-9;  // a rounding difference, not a real one
  std::optional<Placement> placement = Place(request, devices, 100);
  ASSERT_TRUE(placement);
  EXPECT_EQ(placement->device, 1u);
}

TEST(PlacementTest, FullQueuesAreSkippedAndAllFullIsNoPlacement) {
  const RequestProfile request = Bf16Forward(512);
  std::vector<DeviceState> devices = {Gpu("cuda:0", 90, 80 * kGiB), Gpu("cuda:1", 90, 80 * kGiB)};
  devices[0].queue_depth = 8;
  devices[1].queue_depth = 7;
  devices[1].queued_seconds = 100;
  std::optional<Placement> placement = Place(request, devices, 8);
  ASSERT_TRUE(placement);
  EXPECT_EQ(placement->device, 1u);
  devices[1].queue_depth = 8;
  EXPECT_FALSE(Place(request, devices, 8));
}

TEST(PlacementTest, ARequestNoDeviceCanEverHoldIsRefusedWithTheNumbers) {
  RequestProfile request = Bf16Forward(1 << 20);
  request.device_bytes = 100 * kGiB;
  std::vector<DeviceState> devices = {Gpu("cuda:0", 75, 16 * kGiB), Gpu("cuda:1", 90, 80 * kGiB)};
  absl::Status status = CheckPlaceable(request, devices);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("107374182400 bytes"), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("cuda:1, has 85899345920 in all"), absl::string_view::npos)
      << status;
  EXPECT_FALSE(Place(request, devices, 100));
  request.device_bytes = 20 * kGiB;  // only the Hopper can hold it
  EXPECT_TRUE(CheckPlaceable(request, devices).ok());
  ASSERT_TRUE(Place(request, devices, 100));
  EXPECT_EQ(Place(request, devices, 100)->device, 1u);
}

TEST(PlacementTest, ReferenceOnAGpuRunsOnTheHostAndHoldsNoDeviceMemory) {
  RequestProfile request = Bf16Forward(1024);
  request.dtype = DType::kFloat32;
  DeviceState gpu = Gpu("cuda:0", 90, 1024);  // far too small for the request's tensors
  gpu.catalog = KernelCatalog{{"flash", "reference"}};  // flash has no fp32
  ASSERT_TRUE(CheckPlaceable(request, {gpu}).ok());
  std::optional<Placement> placement = Place(request, {gpu}, 100);
  ASSERT_TRUE(placement);
  EXPECT_EQ(placement->family, "reference");
  EXPECT_EQ(placement->device_bytes, 0);
  const Throughput host = FamilyThroughput("reference", 0, gpu.host_threads);
  EXPECT_DOUBLE_EQ(placement->seconds, request.flops / host.flops + request.scores / host.scores);
  // On the host CPU device the same tensors are that device's memory.
  DeviceState cpu = HostCpu();
  cpu.memory_budget = 1024;
  EXPECT_EQ(CheckPlaceable(request, {cpu}).code(), absl::StatusCode::kResourceExhausted);
}

TEST(PlacementTest, NoFamilyForTheRequestIsAFailedPrecondition) {
  RequestProfile request = Bf16Forward(1024);
  request.dtype = DType::kFloat32;
  DeviceState gpu = Gpu("cuda:0", 90, 80 * kGiB);
  gpu.catalog = KernelCatalog::Only("flash");
  EXPECT_EQ(CheckPlaceable(request, {gpu}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(Place(request, {gpu}, 100));
}

// One sequence of 65,536 tokens at head_dim 1 in float32 (786 KB on the wire): 4.3e9 scores, a
// few seconds of FLOPs' worth but minutes of the host CPU.
RequestProfile PathologicalForward() {
  RequestProfile request;
  request.dtype = DType::kFloat32;
  request.head_dim = 1;
  request.scores = 65536.0 * 65536;
  request.flops = 4 * request.scores;
  request.device_bytes = 65536 * 4 * 4;
  return request;
}

TEST(PlacementTest, ARequestOverTheComputeLimitEverywhereIsRefusedNamingTheFlag) {
  DeviceState cpu = HostCpu();
  cpu.host_threads = 2;
  const RequestProfile request = PathologicalForward();
  // 4.29e9 scores / 60e6 per second + 1.72e10 FLOPs / 16e9 per second.
  const double seconds = EstimatedSeconds(request, "reference", cpu);
  EXPECT_NEAR(seconds, 4294967296.0 / 60e6 + 17179869184.0 / 16e9, 1e-9);
  absl::Status status = CheckPlaceable(request, {cpu}, 30);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(),
            "the request's estimated compute time, 72.7 s on cpu (4.29e+09 attention scores, "
            "1.72e+10 FLOPs), exceeds the server's limit max_request_compute_seconds = 30; send "
            "fewer or shorter sequences per request");
  EXPECT_FALSE(Place(request, {cpu}, 100, 30));
  // Under a looser limit, or none, it runs.
  EXPECT_TRUE(CheckPlaceable(request, {cpu}, 80).ok());
  EXPECT_TRUE(CheckPlaceable(request, {cpu}, 0).ok());
  ASSERT_TRUE(Place(request, {cpu}, 100, 80));
  // More host threads make it fit.
  cpu.host_threads = 8;
  EXPECT_TRUE(CheckPlaceable(request, {cpu}, 30).ok());
}

TEST(PlacementTest, TheComputeLimitIsCheckedOnTheDeviceTheRequestWouldRunOn) {
  RequestProfile request = Bf16Forward(16384);  // the GPU benchmark's request: milliseconds
  std::vector<DeviceState> devices = {Gpu("cuda:0", 90, 80 * kGiB), HostCpu()};
  EXPECT_TRUE(CheckPlaceable(request, devices, 30).ok());
  // The busy GPU is still the only device that may take it: the CPU would run for minutes.
  devices[0].queued_seconds = 1000;
  std::optional<Placement> placement = Place(request, devices, 100, 30);
  ASSERT_TRUE(placement);
  EXPECT_EQ(placement->device, 0u);
  EXPECT_LT(placement->seconds, 1.0);
  // Without the GPU it is refused, naming the CPU's estimate.
  absl::Status status = CheckPlaceable(request, {devices[1]}, 30);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("max_request_compute_seconds = 30"), absl::string_view::npos)
      << status;
  // With two devices too slow, the message names the fastest.
  DeviceState ampere = Gpu("cuda:1", 80, 80 * kGiB);
  ampere.catalog = KernelCatalog::Only("fallback");
  status = CheckPlaceable(request, {HostCpu(), ampere}, 0.01);
  EXPECT_NE(status.message().find("on the fastest device that can hold it, cuda:1 ("),
            absl::string_view::npos)
      << status;
}

}  // namespace
}  // namespace attnserve::engine

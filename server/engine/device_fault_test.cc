// Device faults in the queue worker (device_health.h): a launch that faults takes the device out
// of service, hands its queue to the eviction handler, refuses new jobs retryably, and serves
// again only after a reset succeeds. Faults come from --inject_device_fault's option.
#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/engine/device_fault.h"
#include "server/engine/device_health.h"
#include "server/engine/fault_injection.h"
#include "server/engine/queue_worker.h"

namespace attnserve::engine {
namespace {

constexpr auto kPatience = std::chrono::seconds(20);

// A worker whose launches echo q, optionally held at a gate, and whose resets fail until the
// test allows them.
class FaultyWorker : public QueueWorker {
 public:
  explicit FaultyWorker(const EngineOptions& options, metrics::ServerMetrics* metrics = nullptr)
      : QueueWorker(Device(), options, metrics) {
    StartLanes(1);
  }
  ~FaultyWorker() override {
    Open();
    Stop();
  }
  static devices::DeviceDescription Device() {
    devices::DeviceDescription device;
    device.name = "cpu";
    return device;
  }

  void Close() { SetOpen(false); }
  void Open() { SetOpen(true); }
  void AllowResets() { resets_allowed_ = true; }
  int reset_attempts() const { return reset_attempts_; }
  bool busy() const { return busy_; }

  std::vector<std::string> kernel_families() const override { return {"echo"}; }
  std::vector<CoverageRow> coverage() const override { return {}; }
  KernelCatalog catalog() const override { return KernelCatalog::Only("echo"); }

 private:
  void SetOpen(bool open) {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = open;
    cv_.notify_all();
  }
  absl::StatusOr<ForwardResult> Execute(const ForwardInputs& in, int /*lane*/) override {
    busy_ = true;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return open_; });
    }
    busy_ = false;
    ForwardResult result;
    result.out = {in.q.dtype, in.q.shape, std::string(in.q.data, in.q.size_bytes)};
    result.lse = {DType::kFloat32, {1, in.q.shape[0]}, std::string(4 * in.q.shape[0], '\0')};
    return result;
  }
  absl::StatusOr<BackwardResult> Execute(const BackwardInputs&, int) override {
    return absl::UnimplementedError("not used");
  }
  absl::Status ResetDevice() override {
    ++reset_attempts_;
    return resets_allowed_ ? absl::OkStatus() : absl::InternalError("reset refused by the test");
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  std::atomic<bool> busy_{false};
  std::atomic<bool> resets_allowed_{false};
  std::atomic<int> reset_attempts_{0};
};

struct Request {
  std::vector<float> q = std::vector<float>(8, 1.0f);
  std::vector<int32_t> cu = {0, 2};
  std::promise<absl::StatusOr<ForwardResult>> answer;

  ForwardJob Job() {
    ForwardJob job;
    const TensorView view{DType::kFloat32, {2, 1, 4}, reinterpret_cast<const char*>(q.data()),
                          q.size() * sizeof(float)};
    job.inputs.q = job.inputs.k = job.inputs.v = view;
    job.inputs.cu_seqlens_q = job.inputs.cu_seqlens_k = cu;
    job.done = [this](absl::StatusOr<ForwardResult> r) { answer.set_value(std::move(r)); };
    return job;
  }
  absl::StatusOr<ForwardResult> Get() {
    auto future = answer.get_future();
    if (future.wait_for(kPatience) != std::future_status::ready) {
      return absl::DeadlineExceededError("no answer");
    }
    return future.get();
  }
};

EngineOptions FaultOnLaunch(int64_t launch) {
  EngineOptions options;
  options.injected_faults["cpu"] = InjectedFault{launch, 0};
  options.device_reset_interval = absl::Milliseconds(1);
  return options;
}

template <typename Predicate>
bool Eventually(Predicate predicate) {
  const auto until = std::chrono::steady_clock::now() + kPatience;
  while (!predicate()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(FaultInjectionTest, ParsesDevicesLaunchesAndFailedResets) {
  auto faults = ParseInjectedFaults("cpu@3, cuda:0@5/2");
  ASSERT_TRUE(faults.ok()) << faults.status();
  EXPECT_EQ((*faults)["cpu"].launch, 3);
  EXPECT_EQ((*faults)["cpu"].failed_resets, 0);
  EXPECT_EQ((*faults)["cuda:0"].launch, 5);
  EXPECT_EQ((*faults)["cuda:0"].failed_resets, 2);
  EXPECT_EQ((*faults)["cpu"].every, 0);
  EXPECT_TRUE(ParseInjectedFaults("")->empty());
  auto repeated = ParseInjectedFaults("cuda:0@50+400/1");
  ASSERT_TRUE(repeated.ok()) << repeated.status();
  EXPECT_EQ((*repeated)["cuda:0"].launch, 50);
  EXPECT_EQ((*repeated)["cuda:0"].every, 400);
  EXPECT_EQ((*repeated)["cuda:0"].failed_resets, 1);
  for (const char* bad : {"cpu", "cpu@0", "@3", "cpu@x", "cpu@3/-1", "cpu@3/1/2", "cpu@3+0",
                          "cpu@3+x", "cpu@3+1+2", "cpu@+3"}) {
    auto parsed = ParseInjectedFaults(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find("DEVICE@LAUNCH"), std::string::npos) << bad;
  }
}

TEST(FaultInjectionTest, RepeatedFaultHitsEveryNthLaunchAfterTheFirst) {
  DeviceHealth health("cpu", InjectedFault{3, 5, 0}, nullptr);
  std::vector<int> faulted;
  for (int launch = 1; launch <= 14; ++launch) {
    if (health.CountLaunchIsInjectedFault()) faulted.push_back(launch);
  }
  EXPECT_EQ(faulted, (std::vector<int>{3, 8, 13}));
  DeviceHealth once("cpu", InjectedFault{2, 0, 0}, nullptr);
  faulted.clear();
  for (int launch = 1; launch <= 6; ++launch) {
    if (once.CountLaunchIsInjectedFault()) faulted.push_back(launch);
  }
  EXPECT_EQ(faulted, (std::vector<int>{2}));
}

TEST(DeviceFaultTest, MarkedStatusIsUnavailable) {
  const absl::Status fault = DeviceFaultError("illegal address");
  EXPECT_EQ(fault.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(IsDeviceFault(fault));
  EXPECT_FALSE(IsDeviceFault(absl::UnavailableError("illegal address")));
  EXPECT_FALSE(IsDeviceFault(absl::OkStatus()));
}

TEST(DeviceFaultTest, FaultTakesTheDeviceOutAndHandsItsQueueOn) {
  FaultyWorker worker(FaultOnLaunch(2));
  std::mutex evicted_mu;
  std::vector<EvictedJob> evicted;
  worker.SetEvictionHandler([&](EvictedJob job) {
    std::lock_guard<std::mutex> lock(evicted_mu);
    evicted.push_back(std::move(job));
  });
  Request first, faulting, queued, late;
  worker.Close();
  worker.Submit(first.Job(), {});
  ASSERT_TRUE(Eventually([&] { return worker.busy(); }));  // launch 1 holds the lane
  worker.Submit(faulting.Job(), {});
  worker.Submit(queued.Job(), {});
  worker.Open();

  EXPECT_TRUE(first.Get().ok());
  const absl::StatusOr<ForwardResult> faulted = faulting.Get();  // launch 2: the fault
  EXPECT_EQ(faulted.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(IsDeviceFault(faulted.status()));
  EXPECT_FALSE(worker.Health().healthy);
  EXPECT_NE(worker.Health().fault.find("injected device fault"), std::string::npos);
  {
    std::lock_guard<std::mutex> lock(evicted_mu);
    ASSERT_EQ(evicted.size(), 1u);  // the queued job went to the engine to place elsewhere
    std::get<ForwardJob>(evicted[0]).done(absl::AbortedError("placed elsewhere"));
  }
  EXPECT_EQ(queued.Get().status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(worker.Load().queue_depth, 0u);

  // Placed just before the fault was seen: refused at once, retryably, never run.
  worker.Submit(late.Job(), {});
  const absl::StatusOr<ForwardResult> refused = late.Get();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("retry"), std::string::npos);
  EXPECT_FALSE(worker.Health().healthy);  // resets keep failing
}

TEST(DeviceFaultTest, DeviceServesAgainOnlyAfterAResetSucceeds) {
  metrics::ServerMetrics metrics("test");
  FaultyWorker worker(FaultOnLaunch(1), &metrics);
  Request faulting;
  worker.Submit(faulting.Job(), {});
  EXPECT_TRUE(IsDeviceFault(faulting.Get().status()));
  ASSERT_TRUE(Eventually([&] { return worker.reset_attempts() >= 3; }));
  EXPECT_FALSE(worker.Health().healthy);  // three failed resets: still out

  worker.AllowResets();
  ASSERT_TRUE(Eventually([&] { return worker.Health().healthy; }));
  EXPECT_TRUE(worker.Health().fault.empty());
  Request after;
  worker.Submit(after.Job(), {});
  EXPECT_TRUE(after.Get().ok());  // launch 2 runs: the fault was injected once

  const std::string text = metrics.Serialize();
  EXPECT_NE(text.find("attnserve_device_healthy{device=\"cpu\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("attnserve_device_faults_total{device=\"cpu\"} 1"), std::string::npos);
  EXPECT_NE(text.find("attnserve_device_resets_total{device=\"cpu\",result=\"ok\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("attnserve_device_resets_total{device=\"cpu\",result=\"failed\"}"),
            std::string::npos);
}

TEST(DeviceFaultTest, InjectedResetFailuresKeepTheDeviceOut) {
  EngineOptions options = FaultOnLaunch(1);
  options.injected_faults["cpu"].failed_resets = 2;
  metrics::ServerMetrics metrics("test");
  FaultyWorker worker(options, &metrics);
  worker.AllowResets();
  Request faulting;
  worker.Submit(faulting.Job(), {});
  EXPECT_TRUE(IsDeviceFault(faulting.Get().status()));
  ASSERT_TRUE(Eventually([&] { return worker.Health().healthy; }));
  EXPECT_EQ(worker.reset_attempts(), 3);
  EXPECT_NE(metrics.Serialize().find(
                "attnserve_device_resets_total{device=\"cpu\",result=\"failed\"} 2"),
            std::string::npos);
}

}  // namespace
}  // namespace attnserve::engine

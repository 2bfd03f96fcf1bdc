#include "server/engine/local_engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/devices/capability_emulation.h"
#include "server/engine/cpu_worker.h"
#ifdef ATTN_WITH_CUDA
#include "server/engine/cuda_worker.h"
#endif
#include "server/engine/request_cost.h"
#include "server/engine/request_validation.h"

namespace attnserve::engine {
namespace {

absl::StatusOr<std::unique_ptr<DeviceWorker>> CreateWorker(
    const devices::DeviceDescription& device, const EngineOptions& options,
    metrics::ServerMetrics* metrics) {
  if (device.kind == devices::DeviceKind::kCpu) {
    return std::make_unique<CpuWorker>(device, options, metrics);
  }
#ifdef ATTN_WITH_CUDA
  absl::StatusOr<std::unique_ptr<CudaWorker>> worker = CudaWorker::Create(device, options, metrics);
  if (!worker.ok()) return worker.status();
  return std::unique_ptr<DeviceWorker>(*std::move(worker));
#else
  return absl::UnimplementedError(absl::StrCat(device.name, ": built without CUDA support"));
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Create(
    const std::vector<devices::DeviceDescription>& devices, const EngineOptions& options,
    metrics::ServerMetrics* metrics) {
  if (devices.empty()) return absl::InvalidArgumentError("no devices to run on");
  std::vector<std::unique_ptr<DeviceWorker>> workers;
  for (const devices::DeviceDescription& device : devices) {
    absl::StatusOr<std::unique_ptr<DeviceWorker>> worker = CreateWorker(device, options, metrics);
    if (!worker.ok()) return worker.status();
    workers.push_back(*std::move(worker));
    if (metrics != nullptr) {
      metrics->SetDeviceInfo(device.name, device.model, device.compute_capability);
      metrics->SetDeviceMemoryUsed(device.name, static_cast<double>(device.memory_total_bytes -
                                                                    device.memory_free_bytes));
      metrics->SetDeviceMemoryTotal(device.name, static_cast<double>(device.memory_total_bytes));
      metrics->SetQueueDepth(device.name, 0);
    }
  }
  return std::unique_ptr<LocalEngine>(new LocalEngine(std::move(workers), options, metrics));
}

LocalEngine::LocalEngine(std::vector<std::unique_ptr<DeviceWorker>> workers,
                         const EngineOptions& options, metrics::ServerMetrics* metrics)
    : workers_(std::move(workers)),
      limits_(options.limits),
      max_queue_size_(options.max_queue_size),
      metrics_(metrics) {}

LocalEngine::~LocalEngine() { Stop(); }

absl::Status LocalEngine::Enqueue(ForwardJob job) {
  if (absl::Status s = ValidateForward(job.inputs, limits_); !s.ok()) {
    return Reject(s, s.code() == absl::StatusCode::kResourceExhausted ? "limit" : "invalid");
  }
  return Admit(std::move(job));
}

absl::Status LocalEngine::Enqueue(BackwardJob job) {
  if (absl::Status s = ValidateBackward(job.inputs, limits_); !s.ok()) {
    return Reject(s, s.code() == absl::StatusCode::kResourceExhausted ? "limit" : "invalid");
  }
  return Admit(std::move(job));
}

absl::Status LocalEngine::Reject(absl::Status status, const char* reason) {
  if (metrics_ != nullptr) metrics_->RecordRejection(reason);
  return status;
}

template <typename Job>
absl::Status LocalEngine::Admit(Job job) {
  if (absl::Now() >= job.control.deadline) {
    return Reject(absl::DeadlineExceededError("the request's deadline passed before it was queued"),
                  "deadline");
  }
  const RequestProfile profile = ProfileOf(job.inputs);
  std::lock_guard<std::mutex> lock(admit_mu_);
  if (stopping_) return Reject(absl::UnavailableError("server is shutting down"), "shutting_down");
  const std::vector<DeviceState> states = DeviceStates();
  // A request that could not fit even on an idle device is refused now, with the numbers,
  // instead of failing later with an out-of-memory error.
  if (absl::Status s = CheckPlaceable(profile, states); !s.ok()) {
    return Reject(s, s.code() == absl::StatusCode::kResourceExhausted ? "memory" : "no_kernel");
  }
  const std::optional<Placement> placement = Place(profile, states, max_queue_size_);
  if (!placement) {
    return Reject(absl::ResourceExhaustedError(absl::StrCat(
                      "every device queue is full (", max_queue_size_,
                      " requests waiting on each device that can run it); retry later")),
                  "queue_full");
  }
  DeviceWorker& worker = *workers_[placement->device];
  if (metrics_ != nullptr) metrics_->RecordPlacement(worker.device().name, placement->family);
  AddInflight(1);
  // The in-flight count drops only after the answer has been handed to the transport.
  job.done = [this, done = std::move(job.done)](auto result) {
    if (metrics_ != nullptr && !result.ok()) {
      if (result.status().code() == absl::StatusCode::kDeadlineExceeded) {
        metrics_->RecordRejection("deadline");
      } else if (result.status().code() == absl::StatusCode::kCancelled) {
        metrics_->RecordRejection("cancelled");
      }
    }
    done(std::move(result));
    AddInflight(-1);
  };
  worker.Submit(std::move(job), JobCost{placement->device_bytes, placement->seconds});
  return absl::OkStatus();
}

std::vector<DeviceState> LocalEngine::DeviceStates() const {
  std::vector<DeviceState> states;
  for (const auto& worker : workers_) {
    const devices::DeviceDescription& device = worker->device();
    const WorkerLoad load = worker->Load();
    DeviceState state;
    state.name = device.name;
    state.compute_capability =
        device.kind == devices::DeviceKind::kCpu
            ? 0
            : std::max(0, devices::ParseComputeCapability(device.compute_capability));
    state.shared_memory_per_block = device.shared_memory_per_block;
    state.catalog = worker->catalog();
    state.memory_budget = worker->memory_budget();
    state.reserved_bytes = load.reserved_bytes;
    state.queued_seconds = load.queued_seconds;
    state.queue_depth = load.queue_depth;
    states.push_back(std::move(state));
  }
  return states;
}

void LocalEngine::AddInflight(int64_t delta) {
  if (metrics_ != nullptr) metrics_->AddInflight(static_cast<double>(delta));
  if (inflight_.fetch_add(delta) + delta == 0) {
    std::lock_guard<std::mutex> lock(admit_mu_);
    idle_cv_.notify_all();
  }
}

bool LocalEngine::Drain(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(admit_mu_);
  stopping_ = true;
  return idle_cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                           [this] { return inflight_.load() == 0; });
}

void LocalEngine::Stop() {
  {
    std::lock_guard<std::mutex> lock(admit_mu_);
    stopping_ = true;
  }
  for (const auto& worker : workers_) worker->Stop();
}

std::vector<devices::DeviceDescription> LocalEngine::Devices() const {
  std::vector<devices::DeviceDescription> out;
  for (const auto& worker : workers_) out.push_back(worker->device());
  return out;
}

std::vector<std::string> LocalEngine::DeviceKernelFamilies(const std::string& device) const {
  for (const auto& worker : workers_) {
    if (worker->device().name == device) return worker->kernel_families();
  }
  return {};
}

std::vector<CoverageRow> LocalEngine::DeviceCoverage(const std::string& device) const {
  for (const auto& worker : workers_) {
    if (worker->device().name == device) return worker->coverage();
  }
  return {};
}

std::vector<std::string> LocalEngine::KernelFamilies() const {
  std::vector<std::string> out;
  for (const auto& worker : workers_) {
    for (const std::string& family : worker->kernel_families()) {
      if (std::find(out.begin(), out.end(), family) == out.end()) out.push_back(family);
    }
  }
  return out;
}

}  // namespace attnserve::engine

#include "server/engine/local_engine.h"

#include <algorithm>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/engine/cpu_worker.h"
#ifdef ATTN_WITH_CUDA
#include "server/engine/cuda_worker.h"
#include "server/engine/pinned_host_buffers.h"
#endif
#include "server/engine/error_text.h"
#include "server/engine/request_cost.h"
#include "server/engine/request_validation.h"
#include "server/engine/resident_device.h"

namespace attnserve::engine {
namespace {

absl::StatusOr<std::unique_ptr<DeviceWorker>> CreateWorker(
    const devices::DeviceDescription& device, const EngineOptions& options,
    metrics::ServerMetrics* metrics, ContextStore* contexts) {
  if (device.kind == devices::DeviceKind::kCpu) {
    return std::make_unique<CpuWorker>(device, options, metrics, contexts);
  }
#ifdef ATTN_WITH_CUDA
  absl::StatusOr<std::unique_ptr<CudaWorker>> worker =
      CudaWorker::Create(device, options, metrics, contexts);
  if (!worker.ok()) return worker.status();
  return std::unique_ptr<DeviceWorker>(*std::move(worker));
#else
  return absl::UnimplementedError(absl::StrCat(device.name, ": built without CUDA support"));
#endif
}

// Page-locked receive buffers when a GPU serves requests, else pageable ones.
std::unique_ptr<HostBuffers> HostBuffersFor(const std::vector<devices::DeviceDescription>& devices,
                                            const EngineOptions& options) {
#ifdef ATTN_WITH_CUDA
  for (const devices::DeviceDescription& device : devices) {
    if (device.kind != devices::DeviceKind::kCpu) {
      return std::make_unique<PinnedHostBuffers>(options.pinned_host_cache_bytes);
    }
  }
#endif
  (void)devices;
  (void)options;
  return std::make_unique<PageableHostBuffers>();
}

// ContextOptions::memory_bytes says why a quarter.
int64_t ContextBudget(const ContextOptions& options, int64_t device_budget) {
  if (options.memory_bytes > 0) {
    return device_budget > 0 ? std::min(options.memory_bytes, device_budget) : options.memory_bytes;
  }
  return device_budget / 4;
}

// The rejection metric's reason for a status ChooseLocked returned.
const char* RejectionReason(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
      return "device_fault";
    case absl::StatusCode::kFailedPrecondition:
      return "no_kernel";
    default:
      if (absl::StrContains(status.message(), "queue is full")) return "queue_full";
      if (absl::StrContains(status.message(), "max_request_compute_seconds")) return "compute";
      return "memory";
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Create(
    const std::vector<devices::DeviceDescription>& devices, const EngineOptions& options,
    metrics::ServerMetrics* metrics) {
  if (devices.empty()) return absl::InvalidArgumentError("no devices to run on");
  std::unique_ptr<metrics::ContextMetrics> context_metrics;
  if (metrics != nullptr) {
    context_metrics = std::make_unique<metrics::ContextMetrics>(*metrics->registry());
  }
  ContextStoreOptions store_options;
  store_options.ttl = options.contexts.ttl;
  auto contexts = std::make_unique<ContextStore>(store_options, context_metrics.get());
  std::vector<std::unique_ptr<DeviceWorker>> workers;
  for (const devices::DeviceDescription& device : devices) {
    absl::StatusOr<std::unique_ptr<DeviceWorker>> worker =
        CreateWorker(device, options, metrics, contexts.get());
    if (!worker.ok()) return worker.status();
    contexts->SetBudget(device.name, ContextBudget(options.contexts, (*worker)->memory_budget()));
    workers.push_back(*std::move(worker));
    if (metrics != nullptr) {
      metrics->SetDeviceInfo(device.name, device.model, device.compute_capability);
      metrics->SetDeviceMemoryUsed(device.name, static_cast<double>(device.memory_total_bytes -
                                                                    device.memory_free_bytes));
      metrics->SetDeviceMemoryTotal(device.name, static_cast<double>(device.memory_total_bytes));
      metrics->SetQueueDepth(device.name, 0);
    }
  }
  return std::unique_ptr<LocalEngine>(new LocalEngine(
      std::move(context_metrics), std::move(contexts), std::move(workers),
      HostBuffersFor(devices, options), options, metrics));
}

LocalEngine::LocalEngine(std::unique_ptr<metrics::ContextMetrics> context_metrics,
                         std::unique_ptr<ContextStore> contexts,
                         std::vector<std::unique_ptr<DeviceWorker>> workers,
                         std::unique_ptr<HostBuffers> host_buffers, const EngineOptions& options,
                         metrics::ServerMetrics* metrics)
    : context_metrics_(std::move(context_metrics)),
      contexts_(std::move(contexts)),
      workers_(std::move(workers)),
      host_buffers_(std::move(host_buffers)),
      limits_(options.limits),
      max_queue_size_(options.max_queue_size),
      host_threads_(options.cpu_threads > 0
                        ? options.cpu_threads
                        : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))),
      metrics_(metrics) {
  for (const auto& worker : workers_) {
    worker->SetEvictionHandler([this](EvictedJob job) { Reroute(std::move(job)); });
  }
}

LocalEngine::~LocalEngine() { Stop(); }

absl::Status LocalEngine::Enqueue(ForwardJob job) {
  if (absl::Status s = ValidateForward(job.inputs, limits_); !s.ok()) {
    return Reject(s, s.code() == absl::StatusCode::kResourceExhausted ? "limit" : "invalid");
  }
  ResolveDropoutSeed(job);
  absl::StatusOr<std::optional<size_t>> resident = ResidentWorker(ResidentDevice(job.inputs));
  if (!resident.ok()) return Reject(resident.status(), "invalid");
  const RequestProfile profile = ProfileOf(job.inputs);
  return Admit(std::move(job), profile, *resident);
}

void LocalEngine::ResolveDropoutSeed(ForwardJob& job) {
  RequestOptions& options = job.inputs.options;
  if (!options.has_dropout()) {
    options.dropout_seed = 0;  // no mask drawn: none to report or keep
    return;
  }
  if (options.dropout_seed == 0) {
    // Per-thread generators seeded from the OS: no lock, and seeds unpredictable across
    // requests. 0 means "pick one" on the wire, so it is never picked.
    thread_local std::mt19937_64 generator(std::random_device{}());
    while (options.dropout_seed == 0) options.dropout_seed = generator();
  }
  // The answer reports the seed so the client's backward draws the same mask.
  job.done = [seed = options.dropout_seed,
              done = std::move(job.done)](absl::StatusOr<ForwardResult> result) {
    if (result.ok()) result->dropout_seed = seed;
    done(std::move(result));
  };
}

absl::StatusOr<std::optional<size_t>> LocalEngine::ResidentWorker(
    const absl::StatusOr<int>& device) const {
  if (!device.ok()) return device.status();
  if (*device < 0) return std::optional<size_t>();
  for (size_t i = 0; i < workers_.size(); ++i) {
    const devices::DeviceDescription& d = workers_[i]->device();
    if (d.kind == devices::DeviceKind::kCuda && d.ordinal == *device) return {i};
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the request's tensors are in the memory of CUDA device ", *device,
      ", which this server does not serve"));
}

absl::StatusOr<std::shared_ptr<ForeignDeviceMemory>> LocalEngine::OpenForeignDeviceMemory(
    int device, const std::string& ipc_handle, uint64_t byte_size) {
  absl::StatusOr<std::optional<size_t>> worker = ResidentWorker(device);
  if (!worker.ok()) {
    std::vector<std::string> served;
    for (const auto& w : workers_) served.push_back(w->device().name);
    return absl::FailedPreconditionError(
        absl::StrCat("device_id: this server serves no CUDA device ", device, " (it serves ",
                     absl::StrJoin(served, ", "), ")"));
  }
  return workers_[**worker]->OpenForeignMemory(ipc_handle, byte_size);
}

absl::Status LocalEngine::Enqueue(BackwardJob job) {
  if (!job.inputs.context_id.empty()) {
    if (absl::Status s = ResolveContext(job); !s.ok()) {
      return Reject(s, s.code() == absl::StatusCode::kNotFound ? "context_not_found" : "invalid");
    }
  }
  if (absl::Status s = ValidateBackward(job.inputs, limits_); !s.ok()) {
    return Reject(s, s.code() == absl::StatusCode::kResourceExhausted ? "limit" : "invalid");
  }
  absl::StatusOr<std::optional<size_t>> resident = ResidentWorker(ResidentDevice(job.inputs));
  if (!resident.ok()) return Reject(resident.status(), "invalid");
  RequestProfile profile = ProfileOf(job.inputs);
  if (job.context == nullptr) return Admit(std::move(job), profile, *resident);
  // The context's tensors are already counted where they lie.
  profile.device_bytes = ContextBackwardDeviceBytes(job.inputs);
  std::optional<size_t> device;
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i]->device().name == job.context->device) device = i;
  }
  if (!device) return absl::InternalError("the context's device is not served");
  if (!job.inputs.keep_context) {
    job.done = [this, id = job.inputs.context_id, principal = job.control.principal,
                done = std::move(job.done)](absl::StatusOr<BackwardResult> result) {
      // A failed backward leaves the context to its TTL, so the client may retry on it.
      if (result.ok()) contexts_->Release(id, principal);
      done(std::move(result));
    };
  }
  return Admit(std::move(job), profile, device);
}

absl::Status LocalEngine::ResolveContext(BackwardJob& job) {
  absl::StatusOr<std::shared_ptr<const SavedContext>> context =
      contexts_->Lookup(job.inputs.context_id, job.control.principal);
  if (!context.ok()) return context.status();
  if (absl::Status s = CheckAgreesWithContext(job.inputs, (*context)->spec); !s.ok()) return s;
  FillFromContext(**context, job.inputs);
  AllocateContextOutputs(job.inputs);
  job.context = *std::move(context);
  return absl::OkStatus();
}

bool LocalEngine::ReleaseContext(const std::string& context_id, const std::string& principal) {
  return contexts_->Release(context_id, principal);
}

ContextLimits LocalEngine::context_limits() const {
  ContextLimits limits;
  limits.ttl = contexts_->ttl();
  for (size_t i = 0; i < workers_.size(); ++i) {
    const int64_t budget = contexts_->Budget(workers_[i]->device().name);
    if (i == 0 || budget < limits.memory_bytes) limits.memory_bytes = budget;
  }
  return limits;
}

absl::Status LocalEngine::Reject(absl::Status status, const char* reason) {
  if (metrics_ != nullptr) metrics_->RecordRejection(reason);
  return status;
}

absl::StatusOr<LocalEngine::Choice> LocalEngine::ChooseLocked(
    const RequestProfile& profile, std::optional<size_t> only_device) {
  std::vector<DeviceState> all = DeviceStates();
  std::vector<DeviceState> states;
  std::vector<size_t> worker_of;
  std::string faults;
  for (size_t i = 0; i < all.size(); ++i) {
    if (only_device && i != *only_device) continue;
    // A device out of service after a fault takes nothing until a reset of it succeeds.
    if (const DeviceHealthReport health = workers_[i]->Health(); !health.healthy) {
      absl::StrAppend(&faults, faults.empty() ? "" : "; ", all[i].name, ": ", health.fault);
      continue;
    }
    states.push_back(std::move(all[i]));
    worker_of.push_back(i);
  }
  if (states.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "no device that could run the request is in service (", faults, "); retry later"));
  }
  // A request that could not fit even on an idle device is refused now, with the numbers,
  // instead of failing later with an out-of-memory error.
  // So is one that would hold every device that could run it longer than the compute limit.
  const double max_seconds = limits_.max_request_compute_seconds;
  if (absl::Status s = CheckPlaceable(profile, states, max_seconds); !s.ok()) return s;
  const std::optional<Placement> placement = Place(profile, states, max_queue_size_, max_seconds);
  if (!placement) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "every device queue is full (", max_queue_size_,
        " requests waiting on each device that can run it); retry later"));
  }
  return Choice{workers_[worker_of[placement->device]].get(), *placement};
}

template <typename Job>
absl::Status LocalEngine::Admit(Job job, const RequestProfile& profile,
                                std::optional<size_t> only_device) {
  if (absl::Now() >= job.control.deadline) {
    return Reject(absl::DeadlineExceededError("the request's deadline passed before it was queued"),
                  "deadline");
  }
  std::lock_guard<std::mutex> lock(admit_mu_);
  if (stopping_) return Reject(absl::UnavailableError("server is shutting down"), "shutting_down");
  absl::StatusOr<Choice> choice = ChooseLocked(profile, only_device);
  if (!choice.ok()) return Reject(choice.status(), RejectionReason(choice.status()));
  DeviceWorker& worker = *choice->worker;
  job.inputs.route = choice->placement.route;  // chosen once: the worker runs it
  if (metrics_ != nullptr) metrics_->RecordPlacement(worker.device().name, choice->placement.family);
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
  worker.Submit(std::move(job),
                JobCost{choice->placement.device_bytes, choice->placement.seconds});
  return absl::OkStatus();
}

void LocalEngine::Reroute(EvictedJob evicted) {
  std::visit([this](auto& job) { Resubmit(std::move(job)); }, evicted);
}

template <typename Job>
void LocalEngine::Resubmit(Job job) {
  absl::Status status;
  if constexpr (std::is_same_v<Job, BackwardJob>) {
    if (job.context != nullptr) {
      status = absl::NotFoundError(absl::StrCat(
          "context ", QuoteString(job.inputs.context_id), " was lost: its device, ",
          job.context->device, ", faulted; send the backward in full"));
    }
  }
  if (status.ok()) {
    const RequestProfile profile = ProfileOf(job.inputs);
    std::unique_lock<std::mutex> lock(admit_mu_);
    absl::StatusOr<Choice> choice =
        stopping_ ? absl::UnavailableError("server is shutting down") : ChooseLocked(profile, {});
    if (choice.ok()) {
      if (metrics_ != nullptr) {
        metrics_->RecordPlacement(choice->worker->device().name, choice->placement.family);
      }
      // Its `done` already counts it in flight (Admit). Routed again for its new device.
      job.inputs.route = choice->placement.route;
      choice->worker->Submit(std::move(job), JobCost{choice->placement.device_bytes,
                                                     choice->placement.seconds});
      return;
    }
    status = choice.status();
  }
  // Outside the admission lock: `done` takes it when the last job in flight is answered.
  if (metrics_ != nullptr) metrics_->RecordRejection("device_fault");
  job.done(status);
}

std::vector<DeviceState> LocalEngine::DeviceStates() const {
  std::vector<DeviceState> states;
  for (const auto& worker : workers_) {
    const devices::DeviceDescription& device = worker->device();
    const WorkerLoad load = worker->Load();
    DeviceState state = RoutingStateOf(device, worker->catalog());
    state.host_threads = host_threads_;
    state.memory_budget = worker->memory_budget();
    // Saved contexts hold their device's memory as running jobs do.
    state.reserved_bytes = load.reserved_bytes + contexts_->BytesOn(device.name);
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

DeviceHealthReport LocalEngine::DeviceHealth(const std::string& device) const {
  for (const auto& worker : workers_) {
    if (worker->device().name == device) return worker->Health();
  }
  return {};
}

bool LocalEngine::AnyDeviceHealthy() const {
  for (const auto& worker : workers_) {
    if (worker->Health().healthy) return true;
  }
  return false;
}

std::string LocalEngine::NeedsRestart() const {
  std::vector<std::string> lost;
  for (const auto& worker : workers_) {
    const DeviceHealthReport health = worker->Health();
    if (health.healthy || health.failed_resets < kFailedResetsBeforeRestart) return "";
    lost.push_back(absl::StrCat(worker->device().name, ": ", health.fault, "; ",
                                health.failed_resets, " resets failed, the last with ",
                                health.reset_error));
  }
  if (lost.empty()) return "";
  return absl::StrCat("no device can serve and none could be reset (", absl::StrJoin(lost, "; "),
                      "): restart the process");
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

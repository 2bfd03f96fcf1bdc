#include "tools/load_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"

namespace attnserve::load {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kProgressInterval = std::chrono::seconds(1);

Clock::duration ToClock(absl::Duration d) {
  return std::chrono::duration_cast<Clock::duration>(absl::ToChronoNanoseconds(d));
}

// A fixed pseudo-random number in [0, 1) per call sequence number: decides forward or backward
// in a mixed run without a lock shared by the completion threads.
double UnitInterval(uint64_t seq, uint64_t seed) {
  uint64_t z = seq + seed * 0x9e3779b97f4a7c15ULL + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

// One run's state. Completions arrive on gRPC's callback threads; everything they share with
// the scheduling and progress threads is under `mu_` or atomic.
class LoadRun {
 public:
  LoadRun(const LoadConfig& config, LoadTransport& transport, const std::vector<WorkItem>& pool,
          int concurrency)
      : config_(config), transport_(transport), pool_(pool), concurrency_(concurrency) {}

  RunResult Execute();

 private:
  enum class Admission { kWarmup, kMeasured, kStop };

  Admission Admit(Clock::time_point at);
  bool UseBackward(uint64_t seq) const;
  void ClosedLoopNext();
  void OpenLoop();
  void Send(Clock::time_point start, bool measured, bool closed_loop);
  void Finish(const WorkItem& item, bool backward, Clock::time_point start, bool measured,
              bool closed_loop, const absl::Status& status, int64_t payload_bytes,
              const std::function<absl::Status()>& verify);
  void ReportProgress();

  const LoadConfig& config_;
  LoadTransport& transport_;
  const std::vector<WorkItem>& pool_;
  const int concurrency_;

  Clock::time_point start_, measure_start_, measure_end_;
  std::atomic<uint64_t> next_seq_{0};
  std::atomic<int64_t> measured_issued_{0};
  std::atomic<bool> stopped_{false};
  // Calls sent and not yet answered, for progress lines; inflight_ below also covers the
  // bookkeeping after an answer, so it can briefly read one more per closed-loop worker.
  std::atomic<int64_t> outstanding_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  int64_t inflight_ = 0;
  int active_workers_ = 0;
  bool issuing_done_ = false;
  bool finished_ = false;
  int64_t ok_since_check_ = 0;
  Clock::time_point last_completion_;
  RunResult result_;
};

LoadRun::Admission LoadRun::Admit(Clock::time_point at) {
  if (stopped_) return Admission::kStop;
  if (at < measure_start_) return Admission::kWarmup;
  if (config_.requests > 0) {
    if (measured_issued_.fetch_add(1) < config_.requests) return Admission::kMeasured;
  } else if (at < measure_end_) {
    return Admission::kMeasured;
  }
  stopped_ = true;
  return Admission::kStop;
}

bool LoadRun::UseBackward(uint64_t seq) const {
  switch (config_.rpc) {
    case RpcMix::kForward:
      return false;
    case RpcMix::kBackward:
      return true;
    case RpcMix::kMixed:
      return UnitInterval(seq, config_.seed) < config_.backward_fraction;
  }
  return false;
}

void LoadRun::ClosedLoopNext() {
  const Clock::time_point now = Clock::now();
  const Admission admission = Admit(now);
  if (admission == Admission::kStop) {
    std::lock_guard<std::mutex> lock(mu_);
    if (--active_workers_ == 0) issuing_done_ = true;
    cv_.notify_all();
    return;
  }
  Send(now, admission == Admission::kMeasured, /*closed_loop=*/true);
}

void LoadRun::OpenLoop() {
  std::mt19937_64 rng(config_.seed);
  std::exponential_distribution<double> poisson_gap(config_.rate);
  Clock::time_point next = start_;
  for (;;) {
    const Admission admission = Admit(next);
    if (admission == Admission::kStop) break;
    std::this_thread::sleep_until(next);
    {
      // Past the cap, sending waits; latency still counts from the scheduled time, so the
      // wait shows in the percentiles instead of hiding (no coordinated omission).
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return inflight_ < config_.max_inflight; });
    }
    Send(next, admission == Admission::kMeasured, /*closed_loop=*/false);
    const double gap_s =
        config_.arrival == Arrival::kPoisson ? poisson_gap(rng) : 1.0 / config_.rate;
    next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap_s));
  }
  std::lock_guard<std::mutex> lock(mu_);
  issuing_done_ = true;
  cv_.notify_all();
}

void LoadRun::Send(Clock::time_point start, bool measured, bool closed_loop) {
  const uint64_t seq = next_seq_.fetch_add(1);
  const WorkItem& item = pool_[seq % pool_.size()];
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++inflight_;
  }
  ++outstanding_;
  const bool backward = UseBackward(seq);
  LoadTransport::Done done = [this, &item, backward, start, measured, closed_loop](
                                 const absl::Status& status, int64_t payload_bytes,
                                 const std::function<absl::Status()>& verify) {
    Finish(item, backward, start, measured, closed_loop, status, payload_bytes, verify);
  };
  if (backward) {
    transport_.Backward(item, std::move(done));
  } else {
    transport_.Forward(item, std::move(done));
  }
}

void LoadRun::Finish(const WorkItem& item, bool backward, Clock::time_point start, bool measured,
                     bool closed_loop, const absl::Status& status, int64_t payload_bytes,
                     const std::function<absl::Status()>& verify) {
  const Clock::time_point end = Clock::now();
  --outstanding_;
  bool check = false;
  if (measured) {
    std::lock_guard<std::mutex> lock(mu_);
    RunResult& r = result_;
    ++r.requests;
    ++(backward ? r.backward : r.forward);
    last_completion_ = std::max(last_completion_, end);
    if (status.ok()) {
      r.latency.Record(absl::FromChrono(end - start));
      r.tokens += item.tokens;
      r.payload_bytes += payload_bytes;
      // A step on a context ran its forward too.
      const double factor =
          backward ? kBackwardFlopFactor + (config_.keep_context ? 1.0 : 0.0) : 1.0;
      r.flops += item.forward_flops * factor;
      check = config_.check_every > 0 && ++ok_since_check_ % config_.check_every == 0;
    } else {
      const std::string code = absl::StatusCodeToString(status.code());
      ++r.errors;
      ++r.errors_by_code[code];
      r.first_error.emplace(code, std::string(status.message()));
    }
  }
  // The next call goes out before the check, so checking never delays the load.
  if (closed_loop) ClosedLoopNext();
  const absl::Status verified = check ? verify() : absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  if (check) {
    ++result_.checked;
    if (!verified.ok()) {
      ++result_.mismatches;
      ++result_.errors;
      ++result_.errors_by_code["MISMATCH"];
      result_.first_error.emplace("MISMATCH", std::string(verified.message()));
    }
  }
  --inflight_;
  cv_.notify_all();
}

void LoadRun::ReportProgress() {
  int64_t last_requests = 0;
  Clock::time_point last_tick = start_;
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, kProgressInterval, [this] { return finished_; })) {
    const Clock::time_point now = Clock::now();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const long long inflight = outstanding_;
    const long long requests = result_.requests;
    const long long errors = result_.errors;
    const double p50 = absl::ToDoubleMilliseconds(result_.latency.Percentile(50));
    const double p99 = absl::ToDoubleMilliseconds(result_.latency.Percentile(99));
    const double interval =
        std::chrono::duration<double>(now - std::max(last_tick, measure_start_)).count();
    const double rate = interval > 0 ? (requests - last_requests) / interval : 0;
    last_requests = requests;
    last_tick = now;
    lock.unlock();
    if (now < measure_start_) {
      std::fprintf(stderr, "[%6.1fs] warmup, %lld calls in flight\n", elapsed, inflight);
    } else {
      std::fprintf(stderr,
                   "[%6.1fs] %lld requests, %.1f req/s, %lld errors, p50 %.3f ms, "
                   "p99 %.3f ms, %lld in flight\n",
                   elapsed, requests, rate, errors, p50, p99, inflight);
    }
    lock.lock();
  }
}

RunResult LoadRun::Execute() {
  start_ = Clock::now();
  measure_start_ = start_ + ToClock(config_.warmup);
  measure_end_ = measure_start_ + ToClock(config_.duration);
  last_completion_ = measure_start_;
  std::thread progress;
  if (config_.progress) progress = std::thread([this] { ReportProgress(); });

  if (config_.rate > 0) {
    OpenLoop();
  } else {
    {
      std::lock_guard<std::mutex> lock(mu_);
      active_workers_ = concurrency_;
    }
    for (int i = 0; i < concurrency_; ++i) ClosedLoopNext();
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return issuing_done_ && inflight_ == 0; });
  finished_ = true;
  cv_.notify_all();
  lock.unlock();
  if (progress.joinable()) progress.join();

  RunResult result = std::move(result_);
  result.transport = transport_.Name();
  result.concurrency = config_.rate > 0 ? 0 : concurrency_;
  result.target_rate = config_.rate;
  result.arrival = config_.rate > 0 ? std::string(ArrivalName(config_.arrival)) : "";
  result.elapsed_s = std::chrono::duration<double>(last_completion_ - measure_start_).count();
  return result;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LoadRunner>> LoadRunner::Create(const LoadConfig& config) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  std::unique_ptr<LoadRunner> runner(new LoadRunner(config));
  ClientOptions options;
  options.tls = config.tls;
  options.bearer_token = config.bearer_token;
  options.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
      absl::ToChronoNanoseconds(config.timeout));
  // These clients are the gRPC transport (and build the pool); the data transport is a
  // DataChannelClient of its own (load_transport.h), so --transport alone decides, unless
  // --shared_memory lets the clients take shared memory.
  options.transport = Transport::kGrpc;
  options.shared_memory = config.shared_memory;
  for (int i = 0; i < config.connections; ++i) {
    options.connection_id = i + 1;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(config.target, options);
    if (!client.ok()) return client.status();
    // Connects each channel now, so connection setup is not measured and a wrong target
    // fails here with a clear message.
    absl::StatusOr<v1::ServerInfo> info = (*client)->GetServerInfo();
    if (!info.ok()) {
      return absl::UnavailableError(absl::StrCat("cannot reach attnserve at ", config.target, ": ",
                                                 info.status().ToString()));
    }
    runner->server_info_ = *std::move(info);
    runner->clients_.push_back(*std::move(client));
  }

  // Before the pool is built: a transport the server cannot offer fails at once. Shared
  // memory, when the clients take it, replaces --transport.
  bool shared_memory = false;
  if (config.shared_memory != tools::SharedMemory::kOff) {
    absl::StatusOr<std::string> active = runner->clients_.front()->ActiveTransport();
    if (!active.ok()) return active.status();
    shared_memory = *active == "shared memory";
  }
  absl::StatusOr<std::optional<DataChannelOptions>> data =
      shared_memory ? std::optional<DataChannelOptions>()
                    : tools::ChooseDataChannel(config.transport, config.target,
                                               runner->server_info_, config.tls);
  if (!data.ok()) return data.status();

  const std::vector<SequenceLengths> shapes =
      config.seqlens.empty() ? SampleShapes(config.shape, config.pool_size, config.seed)
                             : SelectRequests(config.seqlens, config.pool_size);
  WorkloadOptions options_for_pool;
  options_for_pool.heads = config.heads;
  options_for_pool.heads_k = config.heads_k;
  options_for_pool.head_dim = config.head_dim;
  options_for_pool.dtype = config.dtype;
  options_for_pool.causal = config.causal;
  options_for_pool.keep_context = config.keep_context;
  options_for_pool.forward = config.keep_context || config.rpc == RpcMix::kForward ||
                             (config.rpc == RpcMix::kMixed && config.backward_fraction < 1);
  options_for_pool.backward = config.rpc == RpcMix::kBackward ||
                              (config.rpc == RpcMix::kMixed && config.backward_fraction > 0);
  options_for_pool.references = config.check_every > 0;
  options_for_pool.seed = config.seed;
  absl::StatusOr<std::vector<WorkItem>> pool =
      BuildPool(shapes, options_for_pool, *runner->clients_.front());
  if (!pool.ok()) return pool.status();
  runner->pool_ = *std::move(pool);

  if (*data) {
    (*data)->connections = config.data_connections;
    (*data)->bearer_token = config.bearer_token;
    (*data)->timeout = config.timeout;
    absl::StatusOr<std::unique_ptr<LoadTransport>> transport =
        OpenDataTransport(**data, config.keep_context);
    if (!transport.ok()) return transport.status();
    runner->transport_ = *std::move(transport);
  } else {
    runner->transport_ = MakeGrpcTransport(runner->clients_, config.keep_context, shared_memory);
  }
  return runner;
}

RunResult LoadRunner::Run(int concurrency) {
  return LoadRun(config_, *transport_, pool_, concurrency).Execute();
}

}  // namespace attnserve::load

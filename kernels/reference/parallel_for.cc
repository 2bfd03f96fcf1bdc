#include "kernels/reference/parallel_for.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace attnserve::kernels::reference {

int ResolveWorkers(const ExecutionContext& ctx, int64_t items) {
  int64_t workers = ctx.num_threads > 0 ? static_cast<int64_t>(ctx.num_threads)
                                        : static_cast<int64_t>(std::thread::hardware_concurrency());
  workers = std::min(workers, items);
  return static_cast<int>(std::max<int64_t>(workers, 1));
}

KernelStatus ParallelFor(int64_t items, int workers,
                         const std::function<void(int64_t item, int worker)>& fn,
                         const std::function<bool()>& should_stop) {
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::atomic<bool> stopped{false};
  std::mutex error_mutex;
  std::string error;

  auto run = [&](int worker) {
    try {
      for (int64_t item = next++; item < items && !failed && !stopped; item = next++) {
        if (should_stop && should_stop()) {
          stopped = true;
          break;
        }
        fn(item, worker);
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!failed.exchange(true)) error = e.what();
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!failed.exchange(true)) error = "unknown exception";
    }
  };

  std::vector<std::thread> threads;
  try {
    threads.reserve(workers > 1 ? workers - 1 : 0);
    for (int worker = 1; worker < workers; ++worker) threads.emplace_back(run, worker);
  } catch (const std::exception&) {
    // Could not start every thread (resource limits): the ones running share all items.
  }
  run(0);
  for (std::thread& thread : threads) thread.join();
  if (failed) return KernelStatus::Error("reference kernel failed: " + error);
  if (stopped) return KernelStatus::Stopped();
  return KernelStatus::Ok();
}

}  // namespace attnserve::kernels::reference

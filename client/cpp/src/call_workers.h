// Threads for blocking calls started asynchronously (the data channel's calls block until
// their answer is in): the Client's asynchronous API over the data channel, and attnload.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace attnserve::internal {

// A task runs on an idle worker, or on a new one while fewer than `max_workers` exist, else
// waits its turn: workers never outnumber the most tasks in flight at once (nor the cap), and
// stay for later tasks. Tasks may submit further tasks. Destruction runs the tasks still
// waiting, then joins the workers; nothing may be submitted once it began.
class CallWorkers {
 public:
  explicit CallWorkers(size_t max_workers) : max_workers_(max_workers < 1 ? 1 : max_workers) {}
  ~CallWorkers();
  CallWorkers(const CallWorkers&) = delete;
  CallWorkers& operator=(const CallWorkers&) = delete;

  void Submit(std::function<void()> task);

 private:
  void Work();

  const size_t max_workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  size_t idle_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace attnserve::internal

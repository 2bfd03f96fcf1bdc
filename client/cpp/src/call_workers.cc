#include "client/cpp/src/call_workers.h"

#include <utility>

namespace attnserve::internal {

CallWorkers::~CallWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  // A worker leaves only when no task is left, so every task submitted runs.
  for (std::thread& worker : workers_) worker.join();
}

void CallWorkers::Submit(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  tasks_.push_back(std::move(task));
  if (tasks_.size() > idle_ && workers_.size() < max_workers_) {
    workers_.emplace_back([this] { Work(); });
  } else {
    cv_.notify_one();
  }
}

void CallWorkers::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ++idle_;
    cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    --idle_;
    if (tasks_.empty()) return;
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // what it holds goes before the next wait, not at the next task
    lock.lock();
  }
}

}  // namespace attnserve::internal

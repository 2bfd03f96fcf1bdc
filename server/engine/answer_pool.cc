#include "server/engine/answer_pool.h"

#include <algorithm>
#include <utility>

namespace attnserve::engine {

AnswerPool::AnswerPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Run(); });
}

AnswerPool::~AnswerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void AnswerPool::Post(absl::AnyInvocable<void() &&> answer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(answer));
  }
  cv_.notify_one();
}

void AnswerPool::Run() {
  for (;;) {
    absl::AnyInvocable<void() &&> answer;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      // Stopping still drains the queue: every posted answer is delivered.
      if (queue_.empty()) return;
      answer = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(answer)();
  }
}

}  // namespace attnserve::engine

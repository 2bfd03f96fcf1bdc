// Threads that deliver a device worker's answers, so a lane can start its next launch while
// the last one's results are encoded and serialized into the response (a copy of every output
// byte: ~100 ms for a long sequence's backward) and the call is finished. Closures run in the
// order posted, each exactly once; the destructor runs whatever is still queued, then joins.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"

namespace attnserve::engine {

class AnswerPool {
 public:
  explicit AnswerPool(int threads);
  ~AnswerPool();
  AnswerPool(const AnswerPool&) = delete;
  AnswerPool& operator=(const AnswerPool&) = delete;

  void Post(absl::AnyInvocable<void() &&> answer);

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<absl::AnyInvocable<void() &&>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace attnserve::engine

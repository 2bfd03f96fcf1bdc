#include "server/engine/parallel_copy.h"

#include <algorithm>
#include <cstring>

namespace attnserve::engine {
namespace {

// Copies the bytes [begin, end) of the concatenated pieces to dst + begin.
void CopyRange(const std::vector<HostBytes>& pieces, char* dst, size_t begin, size_t end) {
  size_t piece_start = 0;
  for (const HostBytes& piece : pieces) {
    const size_t piece_end = piece_start + piece.size;
    const size_t from = std::max(begin, piece_start), to = std::min(end, piece_end);
    if (from < to) {
      std::memcpy(dst + from, static_cast<const char*>(piece.data) + (from - piece_start),
                  to - from);
    }
    if (piece_end >= end) return;
    piece_start = piece_end;
  }
}

}  // namespace

ParallelCopier::ParallelCopier(int helpers) {
  for (int i = 0; i < helpers; ++i) helpers_.emplace_back([this, i] { HelperLoop(i + 1); });
}

ParallelCopier::~ParallelCopier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void ParallelCopier::HelperLoop(int share) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    const std::function<void(int)>& copy = copy_share_;
    lock.unlock();
    copy(share);  // copy_share_ stays unchanged until every helper has reported back
    lock.lock();
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

void ParallelCopier::Gather(const std::vector<HostBytes>& pieces, char* dst) {
  size_t total = 0;
  for (const HostBytes& piece : pieces) total += piece.size;
  if (helpers_.empty() || total < kMinParallelBytes) {
    CopyRange(pieces, dst, 0, total);
    return;
  }
  // Equal shares, cut at 64-byte boundaries so no two threads write one cache line.
  const size_t shares = helpers_.size() + 1;
  auto share_begin = [&](size_t s) {
    return s == shares ? total : std::min(total, (total * s / shares) & ~size_t{63});
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    copy_share_ = [&](int s) { CopyRange(pieces, dst, share_begin(s), share_begin(s + 1)); };
    pending_ = static_cast<int>(helpers_.size());
    ++generation_;
  }
  work_cv_.notify_all();
  CopyRange(pieces, dst, share_begin(0), share_begin(1));
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  copy_share_ = nullptr;
}

}  // namespace attnserve::engine

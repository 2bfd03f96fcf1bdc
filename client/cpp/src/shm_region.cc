#include "client/cpp/src/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cpp/src/call_workers.h"

namespace attnserve::internal {
namespace {

// Chunks of at least this size, so copies under 8 MiB run on the caller alone: the server's
// lanes measured four threads slower than one for 2 MB pieces, faster for 72 MB
// (server/engine/parallel_copy.h, bench/RESULTS.md "Lane threads").
constexpr size_t kMinChunkBytes = size_t{4} << 20;

std::string RandomName() {
  std::random_device device;
  std::mt19937_64 random((uint64_t{device()} << 32) ^ device());
  return absl::StrFormat("attnserve-%d-%016x", getpid(), random());
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Create(int64_t byte_size) {
  if (byte_size <= 0) return absl::InvalidArgumentError("byte_size: must be positive");
  const std::string name = RandomName();
  const std::string key = "/" + name;
  const int fd = shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot create shared memory ", key, ": ", std::strerror(errno)));
  }
  auto fail = [&](absl::StatusCode code, absl::string_view what, int error) {
    close(fd);
    shm_unlink(key.c_str());
    return absl::Status(code, absl::StrCat(what, " ", byte_size, " bytes of shared memory ", key,
                                            ": ", std::strerror(error)));
  };
  if (ftruncate(fd, byte_size) != 0) return fail(absl::StatusCode::kInternal, "cannot size", errno);
  // posix_fallocate returns its error rather than setting errno.
  if (const int error = posix_fallocate(fd, 0, byte_size); error != 0) {
    return fail(
        error == ENOSPC ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInternal,
        "cannot reserve", error);
  }
  void* mapping = mmap(nullptr, static_cast<size_t>(byte_size), PROT_READ | PROT_WRITE,
                       MAP_SHARED, fd, 0);
  if (mapping == MAP_FAILED) return fail(absl::StatusCode::kInternal, "cannot map", errno);
  close(fd);  // the mapping keeps the object
  return std::unique_ptr<ShmRegion>(new ShmRegion(name, static_cast<char*>(mapping), byte_size));
}

ShmRegion::~ShmRegion() {
  munmap(data_, static_cast<size_t>(byte_size_));
  if (getpid() == owner_) shm_unlink(key().c_str());
}

void CopyParallel(char* destination, const char* source, size_t bytes, CallWorkers& workers) {
  if (bytes == 0) return;  // an empty tensor's data may be null, which memcpy must not get
  const size_t chunks = std::clamp<size_t>(bytes / kMinChunkBytes, 1, kCopyThreads);
  if (chunks == 1) {
    std::memcpy(destination, source, bytes);
    return;
  }
  // Chunk boundaries on 4 KiB pages, so no two threads touch one page.
  const size_t chunk = (bytes / chunks + 4095) / 4096 * 4096;
  std::mutex mu;
  std::condition_variable done;
  size_t pending = chunks - 1;
  for (size_t i = 0; i + 1 < chunks; ++i) {
    const size_t begin = i * chunk;
    workers.Submit([&, begin] {
      std::memcpy(destination + begin, source + begin, chunk);
      std::lock_guard<std::mutex> lock(mu);
      if (--pending == 0) done.notify_one();
    });
  }
  const size_t last = (chunks - 1) * chunk;
  std::memcpy(destination + last, source + last, bytes - last);
  std::unique_lock<std::mutex> lock(mu);
  done.wait(lock, [&] { return pending == 0; });
}

}  // namespace attnserve::internal

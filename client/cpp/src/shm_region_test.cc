#include "client/cpp/src/shm_region.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "client/cpp/src/call_workers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::internal {
namespace {

bool Exists(const std::string& name) {
  struct stat st {};
  return stat(("/dev/shm/" + name).c_str(), &st) == 0;
}

TEST(ShmRegionTest, CreatesAReservedMappedObjectAndUnlinksItWhenDestroyed) {
  absl::StatusOr<std::unique_ptr<ShmRegion>> region = ShmRegion::Create(3 << 20);
  ASSERT_TRUE(region.ok()) << region.status();
  const std::string name = (*region)->name();
  EXPECT_EQ(name.rfind("attnserve-" + std::to_string(getpid()) + "-", 0), 0u) << name;
  EXPECT_EQ((*region)->key(), "/" + name);
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm/" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 3 << 20);
  EXPECT_GE(st.st_blocks * 512, 3 << 20);  // reserved, not sparse
  (*region)->data()[(3 << 20) - 1] = 7;    // mapped, writable to the end
  region->reset();
  EXPECT_FALSE(Exists(name));
}

TEST(ShmRegionTest, AForkedChildLeavesTheObjectToItsOwner) {
  absl::StatusOr<std::unique_ptr<ShmRegion>> region = ShmRegion::Create(1 << 20);
  ASSERT_TRUE(region.ok()) << region.status();
  const pid_t child = fork();
  if (child == 0) {
    region->reset();  // as the child's copy of a Client would at its exit
    _exit(0);
  }
  ASSERT_GT(child, 0);
  int status = -1;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(Exists((*region)->name()));
  const std::string name = (*region)->name();
  region->reset();
  EXPECT_FALSE(Exists(name));
}

TEST(ShmRegionTest, RefusesNonPositiveSizesAndMoreThanDevShmHolds) {
  EXPECT_EQ(ShmRegion::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
  // Far past any /dev/shm: posix_fallocate fails (no SIGBUS later), and nothing is left.
  absl::StatusOr<std::unique_ptr<ShmRegion>> huge = ShmRegion::Create(int64_t{1} << 50);
  ASSERT_FALSE(huge.ok());
  EXPECT_THAT(std::string(huge.status().message()), ::testing::HasSubstr("shared memory"));
}

TEST(CopyParallelTest, CopiesEveryByteWhateverTheSize) {
  CallWorkers workers(kCopyThreads - 1);
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4095}, (size_t{8} << 20) - 1,
                       (size_t{8} << 20) + 3, (size_t{21} << 20) + 12345}) {
    std::vector<char> source(bytes);
    std::iota(source.begin(), source.end(), static_cast<char>(bytes));
    std::vector<char> destination(bytes + 1, 'x');
    CopyParallel(destination.data(), source.data(), bytes, workers);
    EXPECT_TRUE(std::equal(source.begin(), source.end(), destination.begin())) << bytes;
    EXPECT_EQ(destination[bytes], 'x') << bytes;  // nothing past the end
  }
}

}  // namespace
}  // namespace attnserve::internal

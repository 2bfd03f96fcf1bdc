#include "server/transport/oip/shared_memory_regions.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::transport::oip {
namespace {

using ::testing::HasSubstr;

// Stands in for a client's device memory (the engine opens real IPC handles): host bytes, and
// a flag that says when the registry let go of them.
struct FakeDeviceMemory {
  std::string bytes = std::string(4096, '\0');
  bool closed = false;
  bool device_reset = false;  // as a reset of its device after a fault unmaps it

  SharedMemoryRegions::OpenDeviceMemory Opener(int device) {
    return [this, device]() -> absl::StatusOr<std::shared_ptr<engine::ForeignDeviceMemory>> {
      return std::make_shared<engine::ForeignDeviceMemory>(
          device, bytes.data(), bytes.size(), [this] { closed = true; },
          [this] { return !device_reset; });
    };
  }
};

SharedMemoryOptions Allowed() {
  SharedMemoryOptions options;
  options.allowed = true;
  return options;
}

TEST(SharedMemoryRegionsTest, CudaRegionsShareTheNamespaceButNotStatusOrUnregister) {
  FakeDeviceMemory memory;  // outlives the registry, which closes it last
  SharedMemoryRegions regions(Allowed());
  ASSERT_TRUE(regions.RegisterCuda("alice", "in", memory.Opener(1)).ok());
  // The name is taken for a system region too, as in Triton.
  EXPECT_EQ(regions.RegisterSystem("alice", "in", "/attnserve-none", 0, 64).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(regions.Status("alice", RegionKind::kSystem, "")->empty());
  auto cuda = regions.Status("alice", RegionKind::kCuda, "");
  ASSERT_TRUE(cuda.ok());
  ASSERT_EQ(cuda->size(), 1u);
  EXPECT_EQ((*cuda)[0]->device(), 1);
  EXPECT_EQ((*cuda)[0]->byte_size(), 4096u);
  EXPECT_EQ((*cuda)[0]->kind(), RegionKind::kCuda);
  EXPECT_EQ(regions.Unregister("alice", RegionKind::kSystem, "in").code(),
            absl::StatusCode::kNotFound);
  cuda->clear();

  // A call holding the region keeps it open past its unregistering.
  auto used = regions.Use("alice", "in", 1024, 1024, "inputs[q].parameters");
  ASSERT_TRUE(used.ok()) << used.status();
  EXPECT_EQ((*used)->data(), memory.bytes.data());
  EXPECT_THAT(regions.Use("alice", "in", 1024, 4096, "inputs[q].parameters").status().message(),
              HasSubstr("shared_memory_offset 1024 + byte size 4096 exceed the 4096 bytes"));
  EXPECT_TRUE(regions.Unregister("alice", RegionKind::kCuda, "in").ok());
  EXPECT_FALSE(memory.closed);
  used->reset();
  EXPECT_TRUE(memory.closed);
}

TEST(SharedMemoryRegionsTest, CudaRegistrationIsRefusedBeforeOpeningWhenOffOrTaken) {
  bool opened = false;
  auto open = [&]() -> absl::StatusOr<std::shared_ptr<engine::ForeignDeviceMemory>> {
    opened = true;
    return absl::FailedPreconditionError("CUDA shared memory: this server serves no CUDA device 0");
  };
  SharedMemoryRegions off{SharedMemoryOptions{}};
  EXPECT_EQ(off.RegisterCuda("alice", "in", open).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(opened);
  SharedMemoryRegions regions(Allowed());
  const absl::Status refused = regions.RegisterCuda("alice", "in", open);
  EXPECT_TRUE(opened);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("no CUDA device 0"));
  EXPECT_TRUE(regions.Status("alice", RegionKind::kCuda, "")->empty());
}

TEST(SharedMemoryRegionsTest, OtherPrincipalsDoNotSeeCudaRegions) {
  FakeDeviceMemory memory;  // outlives the registry, which closes it last
  SharedMemoryRegions regions(Allowed());
  ASSERT_TRUE(regions.RegisterCuda("alice", "in", memory.Opener(0)).ok());
  EXPECT_TRUE(regions.Status("bob", RegionKind::kCuda, "")->empty());
  EXPECT_EQ(regions.Use("bob", "in", 0, 16, "inputs[q].parameters").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(regions.Unregister("bob", RegionKind::kCuda, "").ok());  // none of bob's
  EXPECT_FALSE(memory.closed);
}

TEST(SharedMemoryRegionsTest, ARegionWhoseDeviceWasResetIsDroppedAndNamedForReRegistering) {
  FakeDeviceMemory memory, other, again;  // outlive the registry, which closes them last
  SharedMemoryRegions regions(Allowed());
  ASSERT_TRUE(regions.RegisterCuda("alice", "in", memory.Opener(0)).ok());
  ASSERT_TRUE(regions.RegisterCuda("alice", "elsewhere", other.Opener(1)).ok());
  ASSERT_TRUE(regions.Use("alice", "in", 0, 64, "inputs[q].parameters").ok());
  memory.device_reset = true;
  const absl::Status gone = regions.Use("alice", "in", 0, 64, "inputs[q].parameters").status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(gone.message(), HasSubstr("inputs[q].parameters.shared_memory_region: no shared "
                                        "memory region \"in\" is registered any more: its "
                                        "device was reset"));
  EXPECT_TRUE(memory.closed);  // let go of (its close is the engine's to skip after a reset)
  // Neither listed nor in the way of registering the name again; the other device's stays.
  auto cuda = regions.Status("alice", RegionKind::kCuda, "");
  ASSERT_TRUE(cuda.ok());
  ASSERT_EQ(cuda->size(), 1u);
  EXPECT_EQ((*cuda)[0]->name(), "elsewhere");
  cuda->clear();
  EXPECT_TRUE(regions.RegisterCuda("alice", "in", again.Opener(0)).ok());
  EXPECT_TRUE(regions.Use("alice", "in", 0, 64, "inputs[q].parameters").ok());
}

}  // namespace
}  // namespace attnserve::transport::oip

#include "server/devices/capability_emulation.h"

#include "gtest/gtest.h"

namespace attnserve::devices {
namespace {

std::vector<DeviceDescription> CpuAndGpu(const std::string& cc) {
  std::vector<DeviceDescription> devices(2);
  devices[0].name = "cpu";
  devices[1].kind = DeviceKind::kCuda;
  devices[1].name = "cuda:0";
  devices[1].compute_capability = cc;
  return devices;
}

TEST(CapabilityEmulationTest, GpusRouteAsTheOlderArchitecture) {
  std::vector<DeviceDescription> devices = CpuAndGpu("9.0");
  ASSERT_TRUE(EmulateComputeCapability("7.5", &devices).ok());
  EXPECT_EQ(devices[1].compute_capability, "7.5");
  EXPECT_EQ(devices[1].native_compute_capability, "9.0");
  EXPECT_EQ(devices[0].compute_capability, "");  // the CPU is untouched
}

TEST(CapabilityEmulationTest, TheEmulatedArchitecturesSharedMemoryLimitApplies) {
  std::vector<DeviceDescription> devices = CpuAndGpu("9.0");
  devices[1].shared_memory_per_block = 227 * 1024;
  ASSERT_TRUE(EmulateComputeCapability("8.6", &devices).ok());
  EXPECT_EQ(devices[1].shared_memory_per_block, 99 * 1024);
  EXPECT_EQ(devices[0].shared_memory_per_block, 0);
  // Never raised above the GPU's own; kept where the table does not know the architecture.
  devices = CpuAndGpu("8.6");
  devices[1].shared_memory_per_block = 99 * 1024;
  ASSERT_TRUE(EmulateComputeCapability("8.0", &devices).ok());
  EXPECT_EQ(devices[1].shared_memory_per_block, 99 * 1024);
  devices = CpuAndGpu("9.0");
  devices[1].shared_memory_per_block = 227 * 1024;
  ASSERT_TRUE(EmulateComputeCapability("8.8", &devices).ok());
  EXPECT_EQ(devices[1].shared_memory_per_block, 227 * 1024);
}

TEST(CapabilityEmulationTest, EmptyMeansNoEmulation) {
  std::vector<DeviceDescription> devices = CpuAndGpu("9.0");
  ASSERT_TRUE(EmulateComputeCapability("", &devices).ok());
  EXPECT_EQ(devices[1].compute_capability, "9.0");
  EXPECT_EQ(devices[1].native_compute_capability, "");
}

TEST(CapabilityEmulationTest, BadValuesAreRefusedWithTheReason) {
  struct Case {
    const char* spec;
    const char* gpu;
    const char* message;
  };
  for (const Case& c : {Case{"75", "9.0", "expected major.minor"},
                        Case{"7.5.1", "9.0", "expected major.minor"},
                        Case{"6.1", "9.0", "below 7.0"},
                        Case{"8.0", "7.5", "cannot run a newer architecture"}}) {
    std::vector<DeviceDescription> devices = CpuAndGpu(c.gpu);
    const absl::Status status = EmulateComputeCapability(c.spec, &devices);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.spec;
    EXPECT_NE(status.message().find(c.message), std::string::npos) << status.message();
  }
  std::vector<DeviceDescription> cpu_only(1);
  EXPECT_NE(EmulateComputeCapability("7.5", &cpu_only).message().find("no GPU device"),
            std::string::npos);
}

TEST(CapabilityEmulationTest, ParsesCapabilities) {
  EXPECT_EQ(ParseComputeCapability("9.0"), 90);
  EXPECT_EQ(ParseComputeCapability("12.1"), 121);
  EXPECT_EQ(ParseComputeCapability("x.0"), -1);
  EXPECT_EQ(ParseComputeCapability(""), -1);
}

}  // namespace
}  // namespace attnserve::devices

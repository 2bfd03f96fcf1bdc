#include "server/devices/device_registry.h"

#include "gtest/gtest.h"

namespace attnserve::devices {
namespace {

std::vector<DeviceDescription> TwoGpus() {
  std::vector<DeviceDescription> gpus(2);
  for (int i = 0; i < 2; ++i) {
    gpus[i].kind = DeviceKind::kCuda;
    gpus[i].ordinal = i;
    gpus[i].name = "cuda:" + std::to_string(i);
    gpus[i].compute_capability = "9.0";
  }
  return gpus;
}

TEST(DeviceRegistryTest, AutoFallsBackToTheCpu) {
  auto devices = ResolveDevices("auto", ListNoGpus);
  ASSERT_TRUE(devices.ok());
  ASSERT_EQ(devices->size(), 1u);
  EXPECT_EQ((*devices)[0].name, "cpu");
  EXPECT_GT((*devices)[0].memory_total_bytes, 0);
  EXPECT_FALSE((*devices)[0].model.empty());
}

TEST(DeviceRegistryTest, AutoTakesEveryGpu) {
  auto devices = ResolveDevices("auto", TwoGpus);
  ASSERT_TRUE(devices.ok());
  EXPECT_EQ(devices->size(), 2u);
}

TEST(DeviceRegistryTest, CpuIsAlwaysAvailable) {
  auto devices = ResolveDevices(" cpu ", TwoGpus);
  ASSERT_TRUE(devices.ok());
  EXPECT_EQ((*devices)[0].kind, DeviceKind::kCpu);
}

TEST(DeviceRegistryTest, OrdinalsPickGpus) {
  auto devices = ResolveDevices("1", TwoGpus);
  ASSERT_TRUE(devices.ok());
  ASSERT_EQ(devices->size(), 1u);
  EXPECT_EQ((*devices)[0].name, "cuda:1");
}

TEST(DeviceRegistryTest, BadSpecsNameTheProblem) {
  EXPECT_EQ(ResolveDevices("2", TwoGpus).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ResolveDevices("0,0", TwoGpus).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveDevices("gpu", TwoGpus).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveDevices("0", ListNoGpus).status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(ResolveDevices("-1", TwoGpus).status().message().find("-1"), absl::string_view::npos);
}

}  // namespace
}  // namespace attnserve::devices

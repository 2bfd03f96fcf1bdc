#include "server/engine/resident_device.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::engine {
namespace {

using ::testing::HasSubstr;

TensorView On(int device) {
  TensorView view;
  view.shape = {4, 1, 8};
  view.data = "";
  view.device = device;
  return view;
}

ForwardInputs Forward(int q, int k, int v) {
  ForwardInputs in;
  in.q = On(q);
  in.k = On(k);
  in.v = On(v);
  return in;
}

TEST(ResidentDeviceTest, HostRequestsAndOneDevicesRequestsAreFine) {
  EXPECT_EQ(*ResidentDevice(Forward(-1, -1, -1)), -1);
  EXPECT_EQ(*ResidentDevice(Forward(1, 1, 1)), 1);
  ForwardInputs device_outputs = Forward(1, 1, 1);
  device_outputs.output_space.device = 1;
  EXPECT_EQ(*ResidentDevice(device_outputs), 1);
  EXPECT_TRUE(IsResident(device_outputs));
  EXPECT_FALSE(IsResident(Forward(-1, -1, -1)));
}

TEST(ResidentDeviceTest, MixedPlacesAreNamed) {
  absl::StatusOr<int> mixed = ResidentDevice(Forward(0, -1, 0));
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mixed.status().message(),
              HasSubstr("k: in host memory, but q is in CUDA device 0's memory"));
  EXPECT_THAT(ResidentDevice(Forward(0, 0, 1)).status().message(),
              HasSubstr("v: in CUDA device 1's memory"));
  ForwardInputs outputs_only = Forward(-1, -1, -1);
  outputs_only.output_space.device = 0;
  EXPECT_THAT(ResidentDevice(outputs_only).status().message(),
              HasSubstr("outputs: in CUDA device 0's memory, which only a request whose inputs"));
}

TEST(ResidentDeviceTest, NoContextsWithDeviceTensors) {
  ForwardInputs keep = Forward(0, 0, 0);
  keep.keep_context = true;
  EXPECT_THAT(ResidentDevice(keep).status().message(), HasSubstr("keep_context: not with"));
  BackwardInputs on_context;
  on_context.context_id = "abc";
  on_context.dout = On(0);
  EXPECT_THAT(ResidentDevice(on_context).status().message(), HasSubstr("context_id: not with"));
  on_context.dout = On(-1);
  EXPECT_EQ(*ResidentDevice(on_context), -1);  // the context's own views are the engine's
}

}  // namespace
}  // namespace attnserve::engine

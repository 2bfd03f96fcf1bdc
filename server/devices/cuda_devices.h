// The CUDA devices this process can use, through the CUDA runtime. Built only with CUDA; a
// machine without a driver or GPU simply lists none.
#pragma once

#include <vector>

#include "server/devices/device_registry.h"

namespace attnserve::devices {

std::vector<DeviceDescription> ListCudaDevices();

}  // namespace attnserve::devices

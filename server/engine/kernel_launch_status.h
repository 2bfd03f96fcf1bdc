// What a GPU family's launch answered, as the status its request fails with: INTERNAL naming
// the family and the direction. One definition for every CUDA path (whole, grouped, resident).
#pragma once

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/kernel_families.h"

namespace attnserve::engine {

inline absl::Status KernelLaunchStatus(const kernels::KernelFamilyEntry& family,
                                       const char* direction,
                                       const kernels::KernelStatus& status) {
  if (status.ok) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(family.name, " ", direction, ": ", status.message));
}

}  // namespace attnserve::engine

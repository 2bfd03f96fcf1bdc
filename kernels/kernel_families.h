// Every kernel family built into this binary, by name, behind one entry-point table: the engine
// and the C ABI (kernels/capi) look families up here instead of including each family's header.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "kernels/attention_params.h"

namespace attnserve::kernels {

struct KernelFamilyEntry {
  const char* name;       // "reference", "flash", "fallback", "cublas"
  bool runs_on_device;    // tensors in device memory on ctx.stream (else host memory)
  ForwardFn forward;
  BackwardFn backward;
  // Bytes of ctx.workspace each direction needs (16-byte aligned); 0 = none.
  size_t (*forward_workspace_bytes)(const ForwardParams&);
  size_t (*backward_workspace_bytes)(const BackwardParams&);
};

// The families compiled in, best first by nothing in particular (routing decides; see
// server/engine/kernel_routing.h). "reference" is always there.
const std::vector<KernelFamilyEntry>& BuiltKernelFamilies();

// nullptr when no family of that name is built.
const KernelFamilyEntry* FindKernelFamily(std::string_view name);

}  // namespace attnserve::kernels

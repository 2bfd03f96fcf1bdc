// An Open Inference Protocol inference request and answer, independent of the protocol that
// carried them (gRPC ModelInfer, REST /v2/models/<m>/infer): both frontends decode into these,
// and model_codec.h maps them onto the engine's Forward and Backward jobs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/string_view.h"

namespace attnserve::transport::oip {

// A request, tensor or output parameter value, as the protocol allows.
using ParameterValue = std::variant<bool, int64_t, double, std::string>;
using Parameters = std::map<std::string, ParameterValue>;

struct InputTensor {
  std::string name;
  std::string datatype;  // "FP16", "BF16", "FP32", "INT32", ...
  std::vector<int64_t> shape;
  Parameters parameters;  // shared_memory_region, shared_memory_offset, shared_memory_byte_size
  // Where the bytes are: `owned` when the frontend had to convert them (typed contents, JSON),
  // else `external`, a view the frontend keeps alive (raw contents, a binary body, shared
  // memory) until the request is answered.
  std::string owned;
  absl::string_view external;
  bool is_owned = false;
  // >= 0: `external` is memory of this CUDA device (a CUDA shared memory region), which only
  // the device reads; -1: host memory.
  int device = -1;

  absl::string_view bytes() const { return is_owned ? absl::string_view(owned) : external; }
};

struct RequestedOutput {
  std::string name;
  Parameters parameters;  // shared_memory_*; REST: binary_data
};

struct InferRequest {
  std::string model_name;
  std::string model_version;
  std::string id;
  Parameters parameters;  // causal, softmax_scale, ... (DESIGN.md)
  std::vector<InputTensor> inputs;
  std::vector<RequestedOutput> outputs;  // empty: every output
};

struct OutputTensor {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;
  std::string data;  // empty when written to shared memory
  Parameters parameters;  // the request's output parameters, echoed (shared memory, binary)
  bool in_shared_memory = false;
};

struct InferAnswer {
  std::string model_name;
  std::string model_version;
  std::string id;
  std::vector<OutputTensor> outputs;
};

}  // namespace attnserve::transport::oip

// The two models of the Open Inference Protocol frontends (shared/DESIGN.md):
// attention_forward and attention_backward, version "1", and how their named tensors and
// request parameters map onto the engine's Forward and Backward inputs and results. Only names,
// datatypes and parameter kinds are checked here, each error naming its field; the engine's
// validation checks shapes, byte counts and offsets as for the native API.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/engine/attention_request.h"
#include "server/transport/oip/infer_request.h"

namespace attnserve::transport::oip {

inline constexpr char kForwardModel[] = "attention_forward";
inline constexpr char kBackwardModel[] = "attention_backward";
inline constexpr char kModelVersion[] = "1";
inline constexpr char kPlatform[] = "attnserve";

struct TensorMetadata {
  std::string name;
  std::string datatype;  // attention tensors: "FP32", though FP16 and BF16 are accepted too
  std::vector<int64_t> shape;  // -1: any size
};

struct ModelMetadata {
  std::string name;
  std::vector<TensorMetadata> inputs;
  std::vector<TensorMetadata> outputs;
};

// NOT_FOUND naming the model (or its version, which must be empty or "1") unless it is one of
// the two.
absl::StatusOr<const ModelMetadata*> FindModel(absl::string_view name, absl::string_view version);
const std::vector<ModelMetadata>& AllModels();

// Tensor bytes of `datatype` elements ("FP16" → 2, "INT32" → 4, ...); 0 for unknown ones.
int DatatypeSize(absl::string_view datatype);

// The request's inputs and parameters as engine inputs (views into the request's bytes, which
// must outlive the job).
absl::StatusOr<engine::ForwardInputs> DecodeForwardRequest(const InferRequest& request);
absl::StatusOr<engine::BackwardInputs> DecodeBackwardRequest(const InferRequest& request);

// The result's tensors as the outputs the request asked for (all when it named none), in the
// model's order; INVALID_ARGUMENT naming an output the model does not have.
absl::Status CheckRequestedOutputs(const InferRequest& request);
std::vector<OutputTensor> EncodeForwardResult(engine::ForwardResult result,
                                              const InferRequest& request);
std::vector<OutputTensor> EncodeBackwardResult(engine::BackwardResult result,
                                               const InferRequest& request);

}  // namespace attnserve::transport::oip

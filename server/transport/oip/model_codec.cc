#include "server/transport/oip/model_codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attnserve::transport::oip {
namespace {

using engine::DType;

// Attention tensors may be FP16, BF16 or FP32; metadata has one datatype per tensor, so it
// names FP32 (what generic clients such as perf_analyzer can generate) and the docs the rest.
constexpr char kAnyFloat[] = "FP32";

const std::vector<ModelMetadata>& Models() {
  static const auto* models = new std::vector<ModelMetadata>{
      {kForwardModel,
       {{"q", kAnyFloat, {-1, -1, -1}},
        {"k", kAnyFloat, {-1, -1, -1}},
        {"v", kAnyFloat, {-1, -1, -1}},
        {"cu_seqlens_q", "INT32", {-1}},
        {"cu_seqlens_k", "INT32", {-1}}},
       {{"out", kAnyFloat, {-1, -1, -1}}, {"lse", "FP32", {-1, -1}}}},
      {kBackwardModel,
       {{"dout", kAnyFloat, {-1, -1, -1}},
        {"q", kAnyFloat, {-1, -1, -1}},
        {"k", kAnyFloat, {-1, -1, -1}},
        {"v", kAnyFloat, {-1, -1, -1}},
        {"out", kAnyFloat, {-1, -1, -1}},
        {"lse", "FP32", {-1, -1}},
        {"cu_seqlens_q", "INT32", {-1}},
        {"cu_seqlens_k", "INT32", {-1}}},
       {{"dq", kAnyFloat, {-1, -1, -1}},
        {"dk", kAnyFloat, {-1, -1, -1}},
        {"dv", kAnyFloat, {-1, -1, -1}}}},
  };
  return *models;
}

// The parameters each model reads, and the ones the protocol reserves for clients and servers
// (Triton's sequence batching, priority, timeout, binary outputs), which are accepted and
// ignored. Anything else is most likely a misspelling, named in the error.
const std::set<std::string>& KnownParameters(bool backward) {
  static const auto* forward = new std::set<std::string>{
      "causal", "softmax_scale", "softcap", "dropout_p", "window_left", "window_right",
      "dropout_seed"};
  static const auto* backward_set = [] {
    auto* s = new std::set<std::string>(*forward);
    s->insert("deterministic");
    return s;
  }();
  return backward ? *backward_set : *forward;
}
const std::set<std::string>& ReservedParameters() {
  static const auto* reserved = new std::set<std::string>{
      "sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
      "binary_data_output", "headers", "triton_enable_empty_final_response"};
  return *reserved;
}

absl::StatusOr<DType> AttentionDType(absl::string_view datatype, const std::string& field) {
  if (datatype == "FP16") return DType::kFloat16;
  if (datatype == "BF16") return DType::kBFloat16;
  if (datatype == "FP32") return DType::kFloat32;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ".datatype: must be FP16, BF16 or FP32, got \"", datatype, "\""));
}

const char* DatatypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "FP16";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat32:
      return "FP32";
  }
  return "";
}

absl::StatusOr<engine::TensorView> ToView(const InputTensor& tensor, bool float32_only) {
  const std::string field = absl::StrCat("inputs[", tensor.name, "]");
  absl::StatusOr<DType> dtype = AttentionDType(tensor.datatype, field);
  if (!dtype.ok()) return dtype.status();
  if (float32_only && *dtype != DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".datatype: must be FP32, got \"", tensor.datatype, "\""));
  }
  engine::TensorView view;
  view.dtype = *dtype;
  view.shape = tensor.shape;
  view.data = tensor.bytes().data();
  if (view.data == nullptr) view.data = "";  // present, even when empty
  view.size_bytes = tensor.bytes().size();
  view.device = tensor.device;
  return view;
}

absl::StatusOr<std::vector<int32_t>> ToOffsets(const InputTensor& tensor) {
  const std::string field = absl::StrCat("inputs[", tensor.name, "]");
  if (tensor.datatype != "INT32") {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".datatype: must be INT32, got \"", tensor.datatype, "\""));
  }
  if (tensor.shape.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape: must be [batch + 1]"));
  }
  if (tensor.device >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": in CUDA shared memory, but the server reads offsets on the host: send them "
               "in the request or in system shared memory"));
  }
  const absl::string_view bytes = tensor.bytes();
  if (tensor.shape[0] < 0 || bytes.size() != static_cast<size_t>(tensor.shape[0]) * 4) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", bytes.size(),
                                                   " bytes for shape [", tensor.shape[0],
                                                   "] of INT32 (4 bytes each)"));
  }
  std::vector<int32_t> offsets(static_cast<size_t>(tensor.shape[0]));
  if (!offsets.empty()) std::memcpy(offsets.data(), bytes.data(), bytes.size());
  return offsets;
}

// Reads the request's parameters into the options, each checked for its kind.
absl::Status DecodeParameters(const InferRequest& request, bool backward,
                              engine::RequestOptions* options, bool* deterministic) {
  for (const auto& [name, value] : request.parameters) {
    const std::string field = absl::StrCat("parameters.", name);
    if (KnownParameters(backward).count(name) == 0) {
      if (ReservedParameters().count(name) != 0) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": unknown parameter for ", request.model_name, " (known: ",
          absl::StrJoin(KnownParameters(backward), ", "), ")"));
    }
    const bool* as_bool = std::get_if<bool>(&value);
    const int64_t* as_int = std::get_if<int64_t>(&value);
    const double* as_double = std::get_if<double>(&value);
    if (name == "causal" || name == "deterministic") {
      if (as_bool == nullptr) return absl::InvalidArgumentError(field + ": must be a bool");
      (name == "causal" ? options->causal : *deterministic) = *as_bool;
      continue;
    }
    if (name == "window_left" || name == "window_right" || name == "dropout_seed") {
      if (as_int == nullptr) return absl::InvalidArgumentError(field + ": must be an integer");
      if (name == "dropout_seed") {
        // int64 on this protocol: its bits are the uint64 seed (negative values included).
        options->dropout_seed = static_cast<uint64_t>(*as_int);
        continue;
      }
      if (*as_int < std::numeric_limits<int32_t>::min() ||
          *as_int > std::numeric_limits<int32_t>::max()) {
        return absl::InvalidArgumentError(field + ": out of the int32 range");
      }
      (name == "window_left" ? options->window_left : options->window_right) =
          static_cast<int32_t>(*as_int);
      continue;
    }
    // softmax_scale, softcap, dropout_p: a number (clients send whole numbers as integers).
    double number = 0;
    if (as_double != nullptr) {
      number = *as_double;
    } else if (as_int != nullptr) {
      number = static_cast<double>(*as_int);
    } else {
      return absl::InvalidArgumentError(field + ": must be a number");
    }
    if (!std::isfinite(number)) return absl::InvalidArgumentError(field + ": must be finite");
    if (name == "dropout_p") {
      // Checked after the rounding to float, which the kernels see (0.9999999999 is 1.0f).
      const float p = static_cast<float>(number);
      if (!(p >= 0.0f && p < 1.0f)) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": must be in [0, 1) (0 = off), got ", number));
      }
      options->dropout_p = p;
      continue;
    }
    (name == "softmax_scale" ? options->softmax_scale : options->softcap) =
        static_cast<float>(number);
  }
  // The answer has no place for a seed the server would pick, and the backward needs the
  // forward's: on this protocol the caller always chooses it. (ALiBi is not offered here.)
  if (options->has_dropout() && options->dropout_seed == 0) {
    return absl::InvalidArgumentError(
        "parameters.dropout_seed: required (nonzero) when dropout_p > 0 on the KServe API, "
        "which returns no seed; the backward must send the same one");
  }
  return absl::OkStatus();
}

// Finds each of the model's inputs by name: unknown or repeated names and missing inputs are
// errors naming them.
absl::StatusOr<std::map<std::string, const InputTensor*>> InputsByName(
    const InferRequest& request, const ModelMetadata& model) {
  std::map<std::string, const InputTensor*> by_name;
  for (const InputTensor& input : request.inputs) {
    bool known = false;
    for (const TensorMetadata& spec : model.inputs) known = known || spec.name == input.name;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("inputs[", input.name,
                                                     "]: unknown input for ", model.name));
    }
    if (!by_name.emplace(input.name, &input).second) {
      return absl::InvalidArgumentError(absl::StrCat("inputs[", input.name, "]: sent twice"));
    }
  }
  for (const TensorMetadata& spec : model.inputs) {
    if (by_name.count(spec.name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("inputs[", spec.name, "]: missing (", model.name, " needs it)"));
    }
  }
  return by_name;
}

bool Requested(const InferRequest& request, const std::string& name,
               const RequestedOutput** requested) {
  *requested = nullptr;
  if (request.outputs.empty()) return true;
  for (const RequestedOutput& output : request.outputs) {
    if (output.name == name) {
      *requested = &output;
      return true;
    }
  }
  return false;
}

void AddOutput(const InferRequest& request, const std::string& name, engine::OwnedTensor tensor,
               std::vector<OutputTensor>* outputs) {
  const RequestedOutput* requested = nullptr;
  if (!Requested(request, name, &requested)) return;
  OutputTensor out;
  out.name = name;
  out.datatype = DatatypeName(tensor.dtype);
  out.shape = std::move(tensor.shape);
  out.data = std::move(tensor.data);
  if (requested != nullptr) out.parameters = requested->parameters;
  outputs->push_back(std::move(out));
}

}  // namespace

const std::vector<ModelMetadata>& AllModels() { return Models(); }

absl::StatusOr<const ModelMetadata*> FindModel(absl::string_view name,
                                               absl::string_view version) {
  for (const ModelMetadata& model : Models()) {
    if (model.name != name) continue;
    if (!version.empty() && version != kModelVersion) {
      return absl::NotFoundError(absl::StrCat("model_version: ", name, " has no version \"",
                                              version, "\" (only \"", kModelVersion, "\")"));
    }
    return &model;
  }
  return absl::NotFoundError(absl::StrCat("model_name: no model \"", name, "\" (models: ",
                                          kForwardModel, ", ", kBackwardModel, ")"));
}

int DatatypeSize(absl::string_view datatype) {
  if (datatype == "FP16" || datatype == "BF16" || datatype == "INT16" || datatype == "UINT16") {
    return 2;
  }
  if (datatype == "FP32" || datatype == "INT32" || datatype == "UINT32") return 4;
  if (datatype == "FP64" || datatype == "INT64" || datatype == "UINT64") return 8;
  if (datatype == "INT8" || datatype == "UINT8" || datatype == "BOOL") return 1;
  return 0;
}

absl::Status CheckRequestedOutputs(const InferRequest& request) {
  absl::StatusOr<const ModelMetadata*> model =
      FindModel(request.model_name, request.model_version);
  if (!model.ok()) return model.status();
  std::set<std::string> seen;
  for (const RequestedOutput& output : request.outputs) {
    bool known = false;
    for (const TensorMetadata& spec : (*model)->outputs) known = known || spec.name == output.name;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("outputs[", output.name,
                                                     "]: unknown output for ", request.model_name));
    }
    if (!seen.insert(output.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("outputs[", output.name, "]: asked twice"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<engine::ForwardInputs> DecodeForwardRequest(const InferRequest& request) {
  absl::StatusOr<const ModelMetadata*> model = FindModel(kForwardModel, request.model_version);
  if (!model.ok()) return model.status();
  auto inputs = InputsByName(request, **model);
  if (!inputs.ok()) return inputs.status();
  engine::ForwardInputs in;
  for (auto [name, view] : {std::pair{"q", &in.q}, {"k", &in.k}, {"v", &in.v}}) {
    absl::StatusOr<engine::TensorView> decoded = ToView(*inputs->at(name), false);
    if (!decoded.ok()) return decoded.status();
    *view = *std::move(decoded);
  }
  for (auto [name, offsets] :
       {std::pair{"cu_seqlens_q", &in.cu_seqlens_q}, {"cu_seqlens_k", &in.cu_seqlens_k}}) {
    absl::StatusOr<std::vector<int32_t>> decoded = ToOffsets(*inputs->at(name));
    if (!decoded.ok()) return decoded.status();
    *offsets = *std::move(decoded);
  }
  bool unused_deterministic = false;
  if (absl::Status s = DecodeParameters(request, false, &in.options, &unused_deterministic);
      !s.ok()) {
    return s;
  }
  return in;
}

absl::StatusOr<engine::BackwardInputs> DecodeBackwardRequest(const InferRequest& request) {
  absl::StatusOr<const ModelMetadata*> model = FindModel(kBackwardModel, request.model_version);
  if (!model.ok()) return model.status();
  auto inputs = InputsByName(request, **model);
  if (!inputs.ok()) return inputs.status();
  engine::BackwardInputs in;
  for (auto [name, view] : {std::pair{"dout", &in.dout}, {"q", &in.q}, {"k", &in.k},
                            {"v", &in.v}, {"out", &in.out}, {"lse", &in.lse}}) {
    absl::StatusOr<engine::TensorView> decoded =
        ToView(*inputs->at(name), std::string(name) == "lse");
    if (!decoded.ok()) return decoded.status();
    *view = *std::move(decoded);
  }
  for (auto [name, offsets] :
       {std::pair{"cu_seqlens_q", &in.cu_seqlens_q}, {"cu_seqlens_k", &in.cu_seqlens_k}}) {
    absl::StatusOr<std::vector<int32_t>> decoded = ToOffsets(*inputs->at(name));
    if (!decoded.ok()) return decoded.status();
    *offsets = *std::move(decoded);
  }
  if (absl::Status s = DecodeParameters(request, true, &in.options, &in.deterministic);
      !s.ok()) {
    return s;
  }
  return in;
}

std::vector<OutputTensor> EncodeForwardResult(engine::ForwardResult result,
                                              const InferRequest& request) {
  std::vector<OutputTensor> outputs;
  AddOutput(request, "out", std::move(result.out), &outputs);
  AddOutput(request, "lse", std::move(result.lse), &outputs);
  return outputs;
}

std::vector<OutputTensor> EncodeBackwardResult(engine::BackwardResult result,
                                               const InferRequest& request) {
  std::vector<OutputTensor> outputs;
  AddOutput(request, "dq", std::move(result.dq), &outputs);
  AddOutput(request, "dk", std::move(result.dk), &outputs);
  AddOutput(request, "dv", std::move(result.dv), &outputs);
  return outputs;
}

}  // namespace attnserve::transport::oip

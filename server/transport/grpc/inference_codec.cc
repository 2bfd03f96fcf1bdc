#include "server/transport/grpc/inference_codec.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "server/transport/oip/model_codec.h"

namespace attnserve::transport {
namespace {

using ProtoParameters = google::protobuf::Map<std::string, inference::InferParameter>;

absl::StatusOr<oip::Parameters> DecodeParameters(const ProtoParameters& in,
                                                 const std::string& field) {
  oip::Parameters out;
  for (const auto& [name, value] : in) {
    switch (value.parameter_choice_case()) {
      case inference::InferParameter::kBoolParam:
        out[name] = value.bool_param();
        break;
      case inference::InferParameter::kInt64Param:
        out[name] = value.int64_param();
        break;
      case inference::InferParameter::kUint64Param:
        if (value.uint64_param() >
            static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return absl::InvalidArgumentError(
              absl::StrCat(field, ".", name, ": out of the int64 range"));
        }
        out[name] = static_cast<int64_t>(value.uint64_param());
        break;
      case inference::InferParameter::kDoubleParam:
        out[name] = value.double_param();
        break;
      case inference::InferParameter::kStringParam:
        out[name] = value.string_param();
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(field, ".", name, ": has no value"));
    }
  }
  return out;
}

void EncodeParameters(const oip::Parameters& in, ProtoParameters* out) {
  for (const auto& [name, value] : in) {
    inference::InferParameter& p = (*out)[name];
    if (const auto* b = std::get_if<bool>(&value)) p.set_bool_param(*b);
    if (const auto* i = std::get_if<int64_t>(&value)) p.set_int64_param(*i);
    if (const auto* d = std::get_if<double>(&value)) p.set_double_param(*d);
    if (const auto* s = std::get_if<std::string>(&value)) p.set_string_param(*s);
  }
}

// Typed contents as bytes; the datatypes attnserve's models take have typed forms only for
// FP32 and INT32 (FP16 and BF16 travel raw, as the protocol says).
absl::Status DecodeTypedContents(const inference::InferTensorContents& contents,
                                 const std::string& field, oip::InputTensor* tensor) {
  auto copy = [tensor](const auto& values) {
    tensor->owned.resize(values.size() * sizeof(values[0]));
    if (!values.empty()) std::memcpy(tensor->owned.data(), values.data(), tensor->owned.size());
    tensor->is_owned = true;
  };
  if (tensor->datatype == "FP32") {
    copy(contents.fp32_contents());
  } else if (tensor->datatype == "INT32") {
    copy(contents.int_contents());
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".contents: typed contents are not defined for ", tensor->datatype,
        "; send it in raw_input_contents"));
  }
  return absl::OkStatus();
}

bool HasTypedContents(const inference::ModelInferRequest::InferInputTensor& input) {
  return input.has_contents() && input.contents().ByteSizeLong() > 0;
}

}  // namespace

absl::StatusOr<oip::InferRequest> DecodeInferRequest(const inference::ModelInferRequest& in) {
  oip::InferRequest request;
  request.model_name = in.model_name();
  request.model_version = in.model_version();
  request.id = in.id();
  absl::StatusOr<oip::Parameters> parameters = DecodeParameters(in.parameters(), "parameters");
  if (!parameters.ok()) return parameters.status();
  request.parameters = *std::move(parameters);
  // raw_input_contents holds one entry per input that is neither typed nor in shared memory,
  // in order (as tritonclient sends them).
  int raw_index = 0;
  for (const auto& input : in.inputs()) {
    oip::InputTensor tensor;
    tensor.name = input.name();
    tensor.datatype = input.datatype();
    tensor.shape.assign(input.shape().begin(), input.shape().end());
    const std::string field = absl::StrCat("inputs[", tensor.name, "]");
    absl::StatusOr<oip::Parameters> tensor_parameters =
        DecodeParameters(input.parameters(), field + ".parameters");
    if (!tensor_parameters.ok()) return tensor_parameters.status();
    tensor.parameters = *std::move(tensor_parameters);
    const bool in_shared_memory = tensor.parameters.count("shared_memory_region") != 0;
    if (HasTypedContents(input)) {
      if (in.raw_input_contents_size() > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".contents: typed contents cannot be mixed with raw_input_contents"));
      }
      if (absl::Status s = DecodeTypedContents(input.contents(), field, &tensor); !s.ok()) {
        return s;
      }
    } else if (!in_shared_memory) {
      if (raw_index >= in.raw_input_contents_size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": no contents (raw_input_contents has ", in.raw_input_contents_size(),
            " entries)"));
      }
      tensor.external = in.raw_input_contents(raw_index++);
    }
    request.inputs.push_back(std::move(tensor));
  }
  if (raw_index != in.raw_input_contents_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("raw_input_contents: ", in.raw_input_contents_size(),
                     " entries for ", raw_index, " inputs sent raw"));
  }
  for (const auto& output : in.outputs()) {
    oip::RequestedOutput requested;
    requested.name = output.name();
    absl::StatusOr<oip::Parameters> output_parameters =
        DecodeParameters(output.parameters(), absl::StrCat("outputs[", output.name(),
                                                           "].parameters"));
    if (!output_parameters.ok()) return output_parameters.status();
    requested.parameters = *std::move(output_parameters);
    request.outputs.push_back(std::move(requested));
  }
  return request;
}

int64_t EncodeInferAnswer(oip::InferAnswer answer, inference::ModelInferResponse* response) {
  response->set_model_name(std::move(answer.model_name));
  response->set_model_version(std::move(answer.model_version));
  response->set_id(std::move(answer.id));
  int64_t bytes = 0;
  for (oip::OutputTensor& output : answer.outputs) {
    auto* out = response->add_outputs();
    out->set_name(output.name);
    out->set_datatype(output.datatype);
    out->mutable_shape()->Assign(output.shape.begin(), output.shape.end());
    if (output.in_shared_memory) EncodeParameters(output.parameters, out->mutable_parameters());
    bytes += static_cast<int64_t>(output.data.size());
    // One entry per output, empty for those in shared memory, so clients that index raw
    // contents by output position stay aligned.
    response->add_raw_output_contents(std::move(output.data));
  }
  return bytes;
}

}  // namespace attnserve::transport

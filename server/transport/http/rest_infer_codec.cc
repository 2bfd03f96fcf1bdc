#include "server/transport/http/rest_infer_codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/reference/half_convert.h"
#include "server/transport/http/rest_json.h"

namespace attnserve::transport::rest {
namespace {

using kernels::reference::BFloat16ToFloat;
using kernels::reference::FloatToBFloat16;
using kernels::reference::FloatToHalf;
using kernels::reference::HalfToFloat;

constexpr char kBinaryDataSize[] = "binary_data_size";
constexpr char kBinaryData[] = "binary_data";
constexpr char kBinaryDataOutput[] = "binary_data_output";

// Tensor data as Triton accepts it, flat or in nested JSON lists: how many leaves it holds, and
// the leaves appended to `values` depth first (row-major order).
size_t CountValues(const Json& data) {
  if (!data.is_array()) return 1;
  size_t count = 0;
  for (const Json& item : data) count += CountValues(item);
  return count;
}

void Flatten(const Json& data, std::vector<const Json*>* values) {
  if (!data.is_array()) {
    values->push_back(&data);
    return;
  }
  for (const Json& item : data) Flatten(item, values);
}

// JSON numbers as little-endian tensor bytes of `datatype`: FP32, FP16 and BF16 (rounded to
// nearest even, as a client converting floats would) and INT32.
absl::Status JsonToBytes(const std::vector<const Json*>& values, const std::string& datatype,
                         const std::string& field, std::string* bytes) {
  const bool is_int = datatype == "INT32";
  const bool is_float = datatype == "FP32" || datatype == "FP16" || datatype == "BF16";
  if (!is_int && !is_float) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".datatype: JSON data is read for FP32, FP16, BF16 and INT32, got \"",
                     datatype, "\""));
  }
  const size_t item = datatype == "FP32" || is_int ? 4 : 2;
  bytes->resize(values.size() * item);
  char* out = bytes->data();
  for (size_t i = 0; i < values.size(); ++i, out += item) {
    const Json& value = *values[i];
    if (is_int) {
      if (!value.is_number_integer() ||
          (value.is_number_unsigned() &&
           value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) ||
          (!value.is_number_unsigned() &&
           (value.get<int64_t>() < std::numeric_limits<int32_t>::min() ||
            value.get<int64_t>() > std::numeric_limits<int32_t>::max()))) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".data[", i, "]: must be an INT32 integer"));
      }
      const int32_t v = static_cast<int32_t>(value.get<int64_t>());
      std::memcpy(out, &v, item);
      continue;
    }
    if (!value.is_number()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".data[", i, "]: must be a number"));
    }
    const float v = value.get<float>();
    if (datatype == "FP32") {
      std::memcpy(out, &v, item);
    } else {
      const uint16_t half = datatype == "FP16" ? FloatToHalf(v) : FloatToBFloat16(v);
      std::memcpy(out, &half, item);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> DecodeShape(const Json& input, const std::string& field,
                                                 size_t* elements) {
  auto shape = Member(input, "shape", field, &Json::is_array, "a list of sizes");
  if (!shape.ok()) return shape.status();
  if (*shape == nullptr) return absl::InvalidArgumentError(field + ".shape: missing");
  std::vector<int64_t> out;
  *elements = 1;
  for (const Json& size : **shape) {
    if (!size.is_number_integer() || size.get<int64_t>() < 0) {
      return absl::InvalidArgumentError(field + ".shape: sizes must be integers ≥ 0");
    }
    out.push_back(size.get<int64_t>());
    // Saturate: a product past any body's size is refused by the byte count anyway.
    const auto n = static_cast<uint64_t>(out.back());
    *elements = n != 0 && *elements > std::numeric_limits<uint32_t>::max() / n
                    ? std::numeric_limits<uint32_t>::max()
                    : *elements * n;
  }
  return out;
}

absl::StatusOr<oip::InputTensor> DecodeInput(const Json& input, size_t index,
                                             absl::string_view* binary) {
  if (!input.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("inputs[", index, "]: must be an object"));
  }
  oip::InputTensor tensor;
  auto name =
      Member(input, "name", absl::StrCat("inputs[", index, "]"), &Json::is_string, "a string");
  if (!name.ok()) return name.status();
  if (*name == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("inputs[", index, "].name: missing"));
  tensor.name = (*name)->get<std::string>();
  const std::string field = absl::StrCat("inputs[", tensor.name, "]");
  auto datatype = Member(input, "datatype", field, &Json::is_string, "a string");
  if (!datatype.ok()) return datatype.status();
  if (*datatype == nullptr) return absl::InvalidArgumentError(field + ".datatype: missing");
  tensor.datatype = (*datatype)->get<std::string>();
  size_t elements = 0;
  absl::StatusOr<std::vector<int64_t>> shape = DecodeShape(input, field, &elements);
  if (!shape.ok()) return shape.status();
  tensor.shape = *std::move(shape);
  if (auto it = input.find("parameters"); it != input.end()) {
    absl::StatusOr<oip::Parameters> parameters = DecodeParameters(*it, field + ".parameters");
    if (!parameters.ok()) return parameters.status();
    tensor.parameters = *std::move(parameters);
  }
  const auto data = input.find("data");
  const bool has_data = data != input.end();
  auto size = tensor.parameters.find(kBinaryDataSize);
  if (size != tensor.parameters.end()) {
    const int64_t* bytes = std::get_if<int64_t>(&size->second);
    if (bytes == nullptr || *bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".parameters.", kBinaryDataSize, ": must be an integer ≥ 0"));
    }
    if (has_data) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": has both data and ", kBinaryDataSize, "; send one of them"));
    }
    if (static_cast<uint64_t>(*bytes) > binary->size()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".parameters.", kBinaryDataSize, ": ",
                                                     *bytes, " bytes, but only ", binary->size(),
                                                     " binary bytes are left after the JSON"));
    }
    tensor.external = binary->substr(0, static_cast<size_t>(*bytes));
    binary->remove_prefix(static_cast<size_t>(*bytes));
    return tensor;
  }
  if (!has_data) {
    if (tensor.parameters.count("shared_memory_region") != 0) return tensor;
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".data: missing (or send the tensor in binary with ", kBinaryDataSize, ")"));
  }
  // Counted before anything is reserved: the shape is only the client's word, and a shape of
  // 2 x 1 x 42949672962 over two values once reserved 34 GB here (the fuzzer's find).
  const size_t count = CountValues(*data);
  if (count != elements) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".data: ", count, " values for a shape of ", elements));
  }
  std::vector<const Json*> values;
  values.reserve(count);
  Flatten(*data, &values);
  if (absl::Status s = JsonToBytes(values, tensor.datatype, field, &tensor.owned); !s.ok()) {
    return s;
  }
  tensor.is_owned = true;
  return tensor;
}

absl::StatusOr<oip::RequestedOutput> DecodeOutput(const Json& output, size_t index) {
  const std::string at = absl::StrCat("outputs[", index, "]");
  if (!output.is_object()) return absl::InvalidArgumentError(at + ": must be an object");
  auto name = Member(output, "name", at, &Json::is_string, "a string");
  if (!name.ok()) return name.status();
  if (*name == nullptr) return absl::InvalidArgumentError(at + ".name: missing");
  oip::RequestedOutput requested;
  requested.name = (*name)->get<std::string>();
  if (auto it = output.find("parameters"); it != output.end()) {
    absl::StatusOr<oip::Parameters> parameters =
        DecodeParameters(*it, absl::StrCat("outputs[", requested.name, "].parameters"));
    if (!parameters.ok()) return parameters.status();
    requested.parameters = *std::move(parameters);
  }
  return requested;
}

// Whether `parameters` holds `name` as true; absent: `fallback`.
bool Flag(const oip::Parameters& parameters, const char* name, bool fallback) {
  auto it = parameters.find(name);
  if (it == parameters.end()) return fallback;
  const bool* value = std::get_if<bool>(&it->second);
  return value != nullptr && *value;
}

// The tensor's values as JSON numbers (FP16 and BF16 widened to float, exactly).
Json BytesToJson(const oip::OutputTensor& output) {
  Json data = Json::array();
  const char* bytes = output.data.data();
  const size_t size = output.data.size();
  if (output.datatype == "FP32") {
    for (size_t i = 0; i + 4 <= size; i += 4) {
      float v;
      std::memcpy(&v, bytes + i, 4);
      data.push_back(v);
    }
  } else if (output.datatype == "FP16" || output.datatype == "BF16") {
    for (size_t i = 0; i + 2 <= size; i += 2) {
      uint16_t v;
      std::memcpy(&v, bytes + i, 2);
      data.push_back(output.datatype == "FP16" ? HalfToFloat(v) : BFloat16ToFloat(v));
    }
  }
  return data;
}

}  // namespace

absl::StatusOr<oip::InferRequest> DecodeInferBody(absl::string_view body,
                                                  std::optional<int64_t> json_length,
                                                  int64_t max_json_bytes) {
  absl::string_view json_text = body;
  absl::string_view binary;
  if (json_length.has_value()) {
    if (*json_length <= 0 || static_cast<uint64_t>(*json_length) > body.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Inference-Header-Content-Length: ", *json_length,
                       " is not within the body's ", body.size(), " bytes"));
    }
    json_text = body.substr(0, static_cast<size_t>(*json_length));
    binary = body.substr(static_cast<size_t>(*json_length));
  }
  if (static_cast<int64_t>(json_text.size()) > max_json_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request body: ", json_text.size(), " bytes of JSON exceed the server's ", max_json_bytes,
        " (send tensors in binary, with Inference-Header-Content-Length)"));
  }
  absl::StatusOr<Json> json = ParseJson(json_text, "request body");
  if (!json.ok()) return json.status();
  if (!json->is_object()) return absl::InvalidArgumentError("request body: must be an object");
  oip::InferRequest request;
  auto id = Member(*json, "id", "request", &Json::is_string, "a string");
  if (!id.ok()) return id.status();
  if (*id != nullptr) request.id = (*id)->get<std::string>();
  if (auto it = json->find("parameters"); it != json->end()) {
    absl::StatusOr<oip::Parameters> parameters = DecodeParameters(*it, "parameters");
    if (!parameters.ok()) return parameters.status();
    request.parameters = *std::move(parameters);
  }
  auto inputs = Member(*json, "inputs", "request", &Json::is_array, "a list");
  if (!inputs.ok()) return inputs.status();
  if (*inputs == nullptr) return absl::InvalidArgumentError("inputs: missing");
  for (size_t i = 0; i < (*inputs)->size(); ++i) {
    absl::StatusOr<oip::InputTensor> tensor = DecodeInput((**inputs)[i], i, &binary);
    if (!tensor.ok()) return tensor.status();
    request.inputs.push_back(*std::move(tensor));
  }
  if (!binary.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("request body: ", binary.size(),
                                                   " binary bytes after the JSON that no input's ",
                                                   kBinaryDataSize, " claims"));
  }
  auto outputs = Member(*json, "outputs", "request", &Json::is_array, "a list");
  if (!outputs.ok()) return outputs.status();
  if (*outputs != nullptr) {
    for (size_t i = 0; i < (*outputs)->size(); ++i) {
      absl::StatusOr<oip::RequestedOutput> output = DecodeOutput((**outputs)[i], i);
      if (!output.ok()) return output.status();
      request.outputs.push_back(*std::move(output));
    }
  }
  return request;
}

EncodedAnswer EncodeInferAnswer(oip::InferAnswer answer, const oip::InferRequest& request) {
  const bool binary_by_default = Flag(request.parameters, kBinaryDataOutput, false);
  Json json = {{"model_name", answer.model_name}, {"model_version", answer.model_version}};
  if (!answer.id.empty()) json["id"] = answer.id;
  Json& outputs = json["outputs"] = Json::array();
  std::vector<const std::string*> binary_parts;
  EncodedAnswer encoded;
  for (const oip::OutputTensor& output : answer.outputs) {
    Json out = {{"name", output.name}, {"datatype", output.datatype}, {"shape", output.shape}};
    encoded.tensor_bytes += static_cast<int64_t>(output.data.size());
    if (output.in_shared_memory) {
      out["parameters"] = EncodeParameters(output.parameters);
    } else if (Flag(output.parameters, kBinaryData, binary_by_default)) {
      out["parameters"] = {{kBinaryDataSize, output.data.size()}};
      binary_parts.push_back(&output.data);
    } else {
      out["data"] = BytesToJson(output);
    }
    outputs.push_back(std::move(out));
  }
  encoded.body = json.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (!binary_parts.empty()) {
    encoded.json_length = encoded.body.size();
    size_t total = encoded.body.size();
    for (const std::string* part : binary_parts) total += part->size();
    encoded.body.reserve(total);
    for (const std::string* part : binary_parts) encoded.body.append(*part);
  }
  return encoded;
}

}  // namespace attnserve::transport::rest

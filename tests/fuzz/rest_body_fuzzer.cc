// libFuzzer target: an Open Inference Protocol REST inference body (JSON, optionally followed
// by binary tensors) -> DecodeInferBody, and the same bytes as a shared-memory registration
// body. The first byte says whether an Inference-Header-Content-Length is sent (odd) and the
// next two give it (little-endian). Checks that decoding never crashes, that binary inputs
// lie inside the body and JSON inputs hold exactly their shape's bytes, and that an answer
// echoing the inputs encodes to valid JSON followed by exactly its binary outputs.
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "server/transport/http/rest_documents.h"
#include "server/transport/http/rest_infer_codec.h"
#include "server/transport/http/rest_json.h"

namespace {

using attnserve::transport::rest::DecodeInferBody;
using attnserve::transport::rest::EncodeInferAnswer;

// Small, so the fuzzer spends its time on structure rather than on huge documents.
constexpr int64_t kMaxJsonBytes = 1 << 16;

void Check(bool condition) {
  if (!condition) std::abort();
}

size_t ItemBytes(const std::string& datatype) {
  return datatype == "FP16" || datatype == "BF16" ? 2 : 4;
}

uint64_t Elements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t size : shape) n *= static_cast<uint64_t>(size);
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  std::optional<int64_t> json_length;
  if (data[0] & 1) json_length = data[1] | (data[2] << 8);
  const std::string body(reinterpret_cast<const char*>(data) + 3, size - 3);

  (void)attnserve::transport::rest::DecodeRegistration(body);
  absl::StatusOr<attnserve::transport::oip::InferRequest> request =
      DecodeInferBody(body, json_length, kMaxJsonBytes);
  if (!request.ok()) return 0;

  attnserve::transport::oip::InferAnswer answer;
  for (const auto& input : request->inputs) {
    const absl::string_view bytes = input.bytes();
    if (input.is_owned) {
      Check(bytes.size() == Elements(input.shape) * ItemBytes(input.datatype));
    } else if (!bytes.empty()) {
      Check(bytes.data() >= body.data() &&
            bytes.data() + bytes.size() <= body.data() + body.size());
    }
    attnserve::transport::oip::OutputTensor output;
    output.name = input.name;
    output.datatype = input.datatype;
    output.shape = input.shape;
    output.data = std::string(bytes);
    output.parameters = input.parameters;
    answer.outputs.push_back(std::move(output));
  }
  const attnserve::transport::rest::EncodedAnswer encoded =
      EncodeInferAnswer(std::move(answer), *request);
  const size_t json_bytes = encoded.json_length.value_or(encoded.body.size());
  Check(json_bytes <= encoded.body.size());
  Check(attnserve::transport::rest::ParseJson(absl::string_view(encoded.body).substr(0, json_bytes),
                                              "answer")
            .ok());
  return 0;
}

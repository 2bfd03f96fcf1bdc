#include "server/transport/http/rest_documents.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/transport/oip/server_metadata.h"

namespace attnserve::transport::rest {
namespace {

Json TensorsMetadata(const std::vector<oip::TensorMetadata>& tensors) {
  Json out = Json::array();
  for (const oip::TensorMetadata& spec : tensors) {
    out.push_back({{"name", spec.name}, {"datatype", spec.datatype}, {"shape", spec.shape}});
  }
  return out;
}

Json DurationJson(const oip::Duration& duration) {
  return {{"count", duration.count}, {"ns", duration.ns}};
}

// An integer ≥ 0 member of the registration body; `fallback` when absent and optional.
absl::StatusOr<uint64_t> SizeMember(const Json& body, const char* name, bool required) {
  auto it = body.find(name);
  if (it == body.end()) {
    if (required) return absl::InvalidArgumentError(absl::StrCat(name, ": missing"));
    return 0;
  }
  if (!it->is_number_integer() || (!it->is_number_unsigned() && it->get<int64_t>() < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": must be an integer ≥ 0"));
  }
  return it->get<uint64_t>();
}

}  // namespace

Json ServerMetadata(const std::string& version) {
  return {
      {"name", oip::kServerName}, {"version", version}, {"extensions", oip::ServerExtensions()}};
}

Json ModelMetadata(const oip::ModelMetadata& model) {
  return {{"name", model.name},
          {"versions", {oip::kModelVersion}},
          {"platform", oip::kPlatform},
          {"inputs", TensorsMetadata(model.inputs)},
          {"outputs", TensorsMetadata(model.outputs)}};
}

Json ModelStatistics(const std::vector<const oip::ModelMetadata*>& models,
                     const oip::ModelStatistics& statistics) {
  Json stats = Json::array();
  for (const oip::ModelMetadata* model : models) {
    const oip::ModelCounts counts = statistics.Get(model->name);
    stats.push_back({{"name", model->name},
                     {"version", oip::kModelVersion},
                     {"last_inference", counts.last_inference_ms},
                     {"inference_count", counts.inference_count},
                     {"execution_count", counts.execution_count},
                     {"inference_stats",
                      {{"success", DurationJson(counts.success)},
                       {"fail", DurationJson(counts.fail)},
                       {"queue", DurationJson(counts.queue)},
                       {"compute_infer", DurationJson(counts.compute_infer)}}}});
  }
  return {{"model_stats", std::move(stats)}};
}

Json SharedMemoryStatus(const std::vector<std::shared_ptr<const oip::MappedRegion>>& regions) {
  Json out = Json::array();
  for (const auto& region : regions) {
    out.push_back({{"name", region->name()},
                   {"key", region->key()},
                   {"offset", region->offset()},
                   {"byte_size", region->byte_size()}});
  }
  return out;
}

Json CudaSharedMemoryStatus(
    const std::vector<std::shared_ptr<const oip::MappedRegion>>& regions) {
  Json out = Json::array();
  for (const auto& region : regions) {
    out.push_back({{"name", region->name()},
                   {"device_id", region->device()},
                   {"byte_size", region->byte_size()}});
  }
  return out;
}

absl::StatusOr<CudaRegionRegistration> DecodeCudaRegistration(absl::string_view text) {
  absl::StatusOr<Json> body = ParseJson(text, "request body");
  if (!body.ok()) return body.status();
  if (!body->is_object()) return absl::InvalidArgumentError("request body: must be an object");
  CudaRegionRegistration registration;
  auto handle = Member(*body, "raw_handle", "request", &Json::is_object, "an object");
  if (!handle.ok()) return handle.status();
  if (*handle == nullptr) return absl::InvalidArgumentError("raw_handle: missing");
  auto b64 = Member(**handle, "b64", "raw_handle", &Json::is_string, "a string");
  if (!b64.ok()) return b64.status();
  if (*b64 == nullptr) return absl::InvalidArgumentError("raw_handle.b64: missing");
  if (!absl::Base64Unescape((*b64)->get<std::string>(), &registration.raw_handle)) {
    return absl::InvalidArgumentError("raw_handle.b64: not base64");
  }
  absl::StatusOr<uint64_t> device = SizeMember(*body, "device_id", true);
  if (!device.ok()) return device.status();
  if (*device > static_cast<uint64_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("device_id: not a CUDA ordinal (", *device, ")"));
  }
  registration.device_id = static_cast<int>(*device);
  absl::StatusOr<uint64_t> byte_size = SizeMember(*body, "byte_size", true);
  if (!byte_size.ok()) return byte_size.status();
  registration.byte_size = *byte_size;
  return registration;
}

absl::StatusOr<RegionRegistration> DecodeRegistration(absl::string_view text) {
  absl::StatusOr<Json> body = ParseJson(text, "request body");
  if (!body.ok()) return body.status();
  if (!body->is_object()) return absl::InvalidArgumentError("request body: must be an object");
  RegionRegistration registration;
  auto key = Member(*body, "key", "request", &Json::is_string, "a string");
  if (!key.ok()) return key.status();
  if (*key == nullptr) return absl::InvalidArgumentError("key: missing");
  registration.key = (*key)->get<std::string>();
  absl::StatusOr<uint64_t> offset = SizeMember(*body, "offset", false);
  if (!offset.ok()) return offset.status();
  registration.offset = *offset;
  absl::StatusOr<uint64_t> byte_size = SizeMember(*body, "byte_size", true);
  if (!byte_size.ok()) return byte_size.status();
  registration.byte_size = *byte_size;
  return registration;
}

}  // namespace attnserve::transport::rest

// The JSON documents of the Open Inference Protocol's REST endpoints other than inference:
// server and model metadata, model statistics (Triton's statistics extension), and Triton's
// system and CUDA shared memory status and registration bodies. Field names are the protocol's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/transport/http/rest_json.h"
#include "server/transport/oip/model_codec.h"
#include "server/transport/oip/model_statistics.h"
#include "server/transport/oip/shared_memory_regions.h"

namespace attnserve::transport::rest {

Json ServerMetadata(const std::string& version);
Json ModelMetadata(const oip::ModelMetadata& model);
// {"model_stats": [...]} for `models`, each with its counts.
Json ModelStatistics(const std::vector<const oip::ModelMetadata*>& models,
                     const oip::ModelStatistics& statistics);
// A list of {"name", "key", "offset", "byte_size"}, as Triton answers.
Json SharedMemoryStatus(const std::vector<std::shared_ptr<const oip::MappedRegion>>& regions);

// A list of {"name", "device_id", "byte_size"}, as Triton answers.
Json CudaSharedMemoryStatus(const std::vector<std::shared_ptr<const oip::MappedRegion>>& regions);

// The body of POST /v2/cudasharedmemory/region/<name>/register: {"raw_handle": {"b64": ...},
// "device_id", "byte_size"}, all required; the handle's bytes decoded from base64.
struct CudaRegionRegistration {
  std::string raw_handle;
  int device_id = 0;
  uint64_t byte_size = 0;
};
absl::StatusOr<CudaRegionRegistration> DecodeCudaRegistration(absl::string_view body);

// The body of POST /v2/systemsharedmemory/region/<name>/register.
struct RegionRegistration {
  std::string key;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};
// INVALID_ARGUMENT naming the field: `key` (string) and `byte_size` are required, `offset`
// defaults to 0; sizes are integers ≥ 0.
absl::StatusOr<RegionRegistration> DecodeRegistration(absl::string_view body);

}  // namespace attnserve::transport::rest

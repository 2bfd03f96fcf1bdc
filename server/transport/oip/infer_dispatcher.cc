#include "server/transport/oip/infer_dispatcher.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/transport/grpc/answer_size.h"
#include "server/transport/oip/model_codec.h"

namespace attnserve::transport::oip {

namespace {

constexpr char kRegion[] = "shared_memory_region";
constexpr char kOffset[] = "shared_memory_offset";
constexpr char kByteSize[] = "shared_memory_byte_size";

bool UsesSharedMemory(const Parameters& parameters) { return parameters.count(kRegion) != 0; }

// The region, offset and size a tensor's parameters name; nullopt region when it names none.
struct RegionRef {
  std::string region;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};
absl::StatusOr<std::optional<RegionRef>> RegionOf(const Parameters& parameters,
                                                  const std::string& field) {
  auto it = parameters.find(kRegion);
  if (it == parameters.end()) {
    for (const char* other : {kOffset, kByteSize}) {
      if (parameters.count(other) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".", other, ": given without ",
                                                       kRegion));
      }
    }
    return std::optional<RegionRef>();
  }
  const std::string* name = std::get_if<std::string>(&it->second);
  if (name == nullptr || name->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".", kRegion,
                                                   ": must be a region's name"));
  }
  RegionRef ref;
  ref.region = *name;
  absl::StatusOr<uint64_t> offset = UnsignedParameter(parameters, kOffset, field, 0);
  if (!offset.ok()) return offset.status();
  ref.offset = *offset;
  if (parameters.count(kByteSize) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".", kByteSize, ": missing (",
                                                   kRegion, " needs it)"));
  }
  absl::StatusOr<uint64_t> size = UnsignedParameter(parameters, kByteSize, field, 0);
  if (!size.ok()) return size.status();
  ref.byte_size = *size;
  return std::optional<RegionRef>(ref);
}

}  // namespace

absl::StatusOr<uint64_t> UnsignedParameter(const Parameters& parameters, const std::string& name,
                                           const std::string& field, uint64_t fallback) {
  auto it = parameters.find(name);
  if (it == parameters.end()) return fallback;
  const int64_t* value = std::get_if<int64_t>(&it->second);
  if (value == nullptr || *value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".", name, ": must be an integer ≥ 0"));
  }
  return static_cast<uint64_t>(*value);
}

struct InferDispatcher::Call {
  std::shared_ptr<InferRequest> request;
  std::string protocol;
  std::function<void(absl::StatusOr<InferAnswer>)> done;
  absl::Time start;
  // Keep the regions mapped while the call runs: the engine reads inputs in place.
  std::vector<std::shared_ptr<const MappedRegion>> regions;
  // Per requested output (by name): where to write it; absent: into the answer.
  std::map<std::string, std::pair<std::shared_ptr<const MappedRegion>, RegionRef>> output_regions;
  // The metrics' shared_memory label: "none", "system", or "cuda" when any region is CUDA's.
  std::string shared_memory = "none";
  std::string principal;  // whose shared-memory regions the request may name
};

InferDispatcher::InferDispatcher(engine::Engine* engine, metrics::ProtocolMetrics* metrics,
                                 SharedMemoryRegions* shared_memory, ModelStatistics* statistics)
    : engine_(engine), metrics_(metrics), shared_memory_(shared_memory), statistics_(statistics) {}

// Points inputs that name a region at its bytes, and finds the regions outputs go to.
absl::Status InferDispatcher::Prepare(Call& call) {
  InferRequest& request = *call.request;
  if (absl::Status s = CheckRequestedOutputs(request); !s.ok()) return s;
  for (InputTensor& input : request.inputs) {
    const std::string field = absl::StrCat("inputs[", input.name, "].parameters");
    absl::StatusOr<std::optional<RegionRef>> ref = RegionOf(input.parameters, field);
    if (!ref.ok()) return ref.status();
    if (!ref->has_value()) continue;
    if (input.is_owned || !input.external.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "inputs[", input.name, "]: has both contents and ", kRegion, "; send one of them"));
    }
    absl::StatusOr<std::shared_ptr<const MappedRegion>> region =
        shared_memory_->Use(call.principal, (*ref)->region, (*ref)->offset, (*ref)->byte_size,
                            field);
    if (!region.ok()) return region.status();
    input.external = absl::string_view((*region)->data() + (*ref)->offset, (*ref)->byte_size);
    input.device = (*region)->device();
    NoteRegion(call, **region, "in", (*ref)->byte_size);
    call.regions.push_back(*std::move(region));
  }
  for (const RequestedOutput& output : request.outputs) {
    const std::string field = absl::StrCat("outputs[", output.name, "].parameters");
    absl::StatusOr<std::optional<RegionRef>> ref = RegionOf(output.parameters, field);
    if (!ref.ok()) return ref.status();
    if (!ref->has_value()) continue;
    absl::StatusOr<std::shared_ptr<const MappedRegion>> region =
        shared_memory_->Use(call.principal, (*ref)->region, (*ref)->offset, (*ref)->byte_size,
                            field);
    if (!region.ok()) return region.status();
    NoteRegion(call, **region, "out", 0);
    call.output_regions[output.name] = {*std::move(region), **ref};
  }
  return absl::OkStatus();
}

void InferDispatcher::NoteRegion(Call& call, const MappedRegion& region, const char* direction,
                                 uint64_t bytes) {
  const char* kind = RegionKindName(region.kind());
  if (call.shared_memory != "cuda") call.shared_memory = kind;
  if (bytes > 0) metrics_->AddSharedMemoryBytes(kind, direction, static_cast<double>(bytes));
}

// Outputs whose request names a region go there: the engine writes them in place (a CUDA
// region's device to device). Each must fit its region's share, and all lie in host memory
// or all on one device.
absl::Status InferDispatcher::PlaceOutputs(
    const Call& call, const std::vector<std::pair<const char*, uint64_t>>& outputs,
    engine::OutputSpace* space) const {
  space->destinations.assign(outputs.size(), nullptr);
  bool placed = false;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [name, bytes] = outputs[i];
    auto it = call.output_regions.find(name);
    if (it == call.output_regions.end()) continue;
    const auto& [region, ref] = it->second;
    const std::string field = absl::StrCat("outputs[", name, "].parameters.", kByteSize);
    if (bytes > ref.byte_size) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", ref.byte_size,
                                                     " bytes are too few for the output's ",
                                                     bytes));
    }
    if (placed && region->device() != space->device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "outputs[", name, "].parameters.", kRegion, ": every output in shared memory must be "
          "in system shared memory, or all in CUDA shared memory of one device"));
    }
    space->destinations[i] = region->data() + ref.offset;
    space->device = region->device();
    placed = true;
  }
  return absl::OkStatus();
}

absl::Status InferDispatcher::Dispatch(std::shared_ptr<InferRequest> request,
                                       engine::JobControl control, const std::string& protocol,
                                       std::function<void(absl::StatusOr<InferAnswer>)> done) {
  auto call = std::make_shared<Call>();
  call->request = std::move(request);
  call->protocol = protocol;
  call->done = std::move(done);
  call->start = absl::Now();
  call->principal = control.principal;
  const InferRequest& req = *call->request;
  auto refuse = [&](absl::Status status) {
    metrics_->RecordInference(protocol, req.model_name, call->shared_memory,
                              absl::StatusCodeToString(status.code()));
    if (absl::IsInvalidArgument(status) || absl::IsResourceExhausted(status)) {
      statistics_->RecordFailure(req.model_name, 0);
    }
    return status;
  };
  absl::StatusOr<const ModelMetadata*> model = FindModel(req.model_name, req.model_version);
  if (!model.ok()) return model.status();
  if (absl::Status s = Prepare(*call); !s.ok()) return refuse(s);
  const int64_t max_bytes = engine_->limits().max_message_bytes;
  if (req.model_name == kForwardModel) {
    absl::StatusOr<engine::ForwardInputs> inputs = DecodeForwardRequest(req);
    if (!inputs.ok()) return refuse(inputs.status());
    if (absl::Status s = CheckAnswerFits(*inputs, max_bytes); !s.ok()) return refuse(s);
    const engine::TensorView& q = inputs->q;
    const uint64_t lse_bytes = q.shape.size() == 3 ? 4 * q.shape[0] * q.shape[1] : 0;
    if (absl::Status s = PlaceOutputs(*call, {{"out", q.size_bytes}, {"lse", lse_bytes}},
                                      &inputs->output_space);
        !s.ok()) {
      return refuse(s);
    }
    engine::ForwardJob job;
    job.inputs = *std::move(inputs);
    job.control = std::move(control);
    job.done = [this, call](absl::StatusOr<engine::ForwardResult> result) {
      if (!result.ok()) return Complete(call, result.status(), 0, 0);
      const engine::ExecutionReport report = result->execution;
      InferAnswer answer;
      answer.outputs = EncodeForwardResult(*std::move(result), *call->request);
      Complete(call, std::move(answer), report.queue_us, report.compute_us);
    };
    if (absl::Status s = engine_->Enqueue(std::move(job)); !s.ok()) return refuse(s);
    return absl::OkStatus();
  }
  absl::StatusOr<engine::BackwardInputs> inputs = DecodeBackwardRequest(req);
  if (!inputs.ok()) return refuse(inputs.status());
  if (absl::Status s = CheckAnswerFits(*inputs, max_bytes); !s.ok()) return refuse(s);
  if (absl::Status s = PlaceOutputs(*call,
                                    {{"dq", inputs->q.size_bytes},
                                     {"dk", inputs->k.size_bytes},
                                     {"dv", inputs->v.size_bytes}},
                                    &inputs->output_space);
      !s.ok()) {
    return refuse(s);
  }
  engine::BackwardJob job;
  job.inputs = *std::move(inputs);
  job.control = std::move(control);
  job.done = [this, call](absl::StatusOr<engine::BackwardResult> result) {
    if (!result.ok()) return Complete(call, result.status(), 0, 0);
    const engine::ExecutionReport report = result->execution;
    InferAnswer answer;
    answer.outputs = EncodeBackwardResult(*std::move(result), *call->request);
    Complete(call, std::move(answer), report.queue_us, report.compute_us);
  };
  if (absl::Status s = engine_->Enqueue(std::move(job)); !s.ok()) return refuse(s);
  return absl::OkStatus();
}

// Writes outputs bound for shared memory into their regions, then records and answers.
void InferDispatcher::Complete(const std::shared_ptr<Call>& call,
                               absl::StatusOr<InferAnswer> answer, int64_t queue_us,
                               int64_t compute_us) {
  const InferRequest& request = *call->request;
  if (answer.ok()) {
    answer->model_name = request.model_name;
    answer->model_version = kModelVersion;
    answer->id = request.id;
    for (OutputTensor& output : answer->outputs) {
      auto it = call->output_regions.find(output.name);
      if (it == call->output_regions.end()) continue;
      const auto& [region, ref] = it->second;
      // Written in place by the engine (PlaceOutputs), or returned as bytes by a launch shared
      // with other requests (host regions only: a CUDA region's request runs alone).
      uint64_t bytes = static_cast<uint64_t>(DatatypeSize(output.datatype));
      for (int64_t d : output.shape) bytes *= static_cast<uint64_t>(d);
      if (!output.data.empty()) {
        if (region->kind() != RegionKind::kSystem || output.data.size() != bytes ||
            bytes > ref.byte_size) {
          answer = absl::InternalError(absl::StrCat("outputs[", output.name,
                                                    "]: not written to its shared memory"));
          break;
        }
        std::memcpy(region->data() + ref.offset, output.data.data(), output.data.size());
      }
      metrics_->AddSharedMemoryBytes(RegionKindName(region->kind()), "out",
                                     static_cast<double>(bytes));
      output.parameters[kByteSize] = static_cast<int64_t>(bytes);
      output.data.clear();
      output.in_shared_memory = true;
    }
  }
  const uint64_t total_ns =
      static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - call->start));
  if (answer.ok()) {
    statistics_->RecordSuccess(request.model_name, total_ns,
                               static_cast<uint64_t>(queue_us) * 1000,
                               static_cast<uint64_t>(compute_us) * 1000);
  } else {
    statistics_->RecordFailure(request.model_name, total_ns);
  }
  metrics_->RecordInference(call->protocol, request.model_name, call->shared_memory,
                            absl::StatusCodeToString(answer.status().code()));
  call->done(std::move(answer));
}

}  // namespace attnserve::transport::oip

#include "client/cpp/src/shared_memory_path.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attnserve/tensor_codec.h"
#include "client/cpp/src/call_workers.h"
#include "client/cpp/src/grpc_status.h"
#include "client/cpp/src/shm_region.h"

namespace attnserve::internal {
namespace {

// Tensors start at multiples of this, so the server's kernels read aligned rows.
constexpr int64_t kAlignment = 64;
// Regions are sized in whole MiB: a call a little larger than the last reuses the region.
constexpr int64_t kGranule = int64_t{1} << 20;
// Deadline of the bookkeeping calls (register, unregister) that run outside a caller's call.
constexpr auto kHousekeepingTimeout = std::chrono::seconds(5);
// The server's message for a region it does not know (forgotten after its idle timeout, or
// lost in a restart).
constexpr char kUnknownRegion[] = "no shared memory region";

int64_t Aligned(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

const char* Datatype(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT16: return "FP16";
    case v1::DTYPE_BFLOAT16: return "BF16";
    case v1::DTYPE_FLOAT32: return "FP32";
    default: return "";
  }
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return count;
}

template <typename Field>
std::vector<int64_t> Shape(const Field& shape) {
  return std::vector<int64_t>(shape.begin(), shape.end());
}

// Register answers that say this server will never map this client's memory: shared memory
// off (FAILED_PRECONDITION), an object it cannot open (another container's /dev/shm:
// INVALID_ARGUMENT), no inference service at all. Its region limit (RESOURCE_EXHAUSTED) is not
// among them: other clients' regions come and go.
bool NeverMaps(grpc::StatusCode code) {
  return code == grpc::FAILED_PRECONDITION || code == grpc::INVALID_ARGUMENT ||
         code == grpc::UNIMPLEMENTED || code == grpc::NOT_FOUND;
}

// Register answers about the caller, not shared memory: the call itself would get the same.
bool RefusesCaller(grpc::StatusCode code) {
  return code == grpc::UNAUTHENTICATED || code == grpc::PERMISSION_DENIED;
}

void SetParameters(google::protobuf::Map<std::string, inference::InferParameter>& parameters,
                   const ShmRegion& region, int64_t offset, int64_t byte_size) {
  parameters["shared_memory_region"].set_string_param(region.name());
  parameters["shared_memory_offset"].set_int64_param(offset);
  parameters["shared_memory_byte_size"].set_int64_param(byte_size);
}

// The native AttentionOptions as DESIGN.md's request parameters; values the native wire leaves
// at their defaults (scale 0, softcap 0, unbounded windows) are left out.
void SetOptions(const v1::AttentionOptions& options, std::optional<bool> deterministic,
                inference::ModelInferRequest& request) {
  auto& parameters = *request.mutable_parameters();
  parameters["causal"].set_bool_param(options.causal());
  if (options.softmax_scale() != 0) {
    parameters["softmax_scale"].set_double_param(options.softmax_scale());
  }
  if (options.softcap() != 0) parameters["softcap"].set_double_param(options.softcap());
  if (options.has_window_left()) parameters["window_left"].set_int64_param(options.window_left());
  if (options.has_window_right()) {
    parameters["window_right"].set_int64_param(options.window_right());
  }
  if (deterministic) parameters["deterministic"].set_bool_param(*deterministic);
}

void AddInline(const std::string& name, const google::protobuf::RepeatedField<int32_t>& values,
               inference::ModelInferRequest& request) {
  inference::ModelInferRequest::InferInputTensor* input = request.add_inputs();
  input->set_name(name);
  input->set_datatype("INT32");
  input->add_shape(values.size());
  // Little-endian host, as the server (Linux on x86-64 or arm64) is.
  request.add_raw_input_contents(reinterpret_cast<const char*>(values.data()),
                                 values.size() * sizeof(int32_t));
}

}  // namespace

SharedMemoryPath::SharedMemoryPath(std::shared_ptr<grpc::Channel> channel, Prepare prepare)
    : channel_(std::move(channel)),
      stub_(inference::GRPCInferenceService::NewStub(channel_)),
      prepare_(std::move(prepare)),
      owner_(getpid()),
      copiers_(std::make_unique<CallWorkers>(kCopyThreads - 1)) {}

SharedMemoryPath::~SharedMemoryPath() {
  std::vector<std::unique_ptr<ShmRegion>> regions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    regions.swap(idle_);
    for (auto& region : busy_) regions.push_back(std::move(region));
    busy_.clear();
  }
  if (getpid() != owner_) return;  // the regions go unmapped, left to the owner
  for (auto& region : regions) Drop(std::move(region));
}

grpc::Status SharedMemoryPath::Register(const ShmRegion& region) {
  grpc::ClientContext context;
  prepare_(context);
  context.set_deadline(std::chrono::system_clock::now() + kHousekeepingTimeout);
  inference::SystemSharedMemoryRegisterRequest request;
  request.set_name(region.name());
  request.set_key(region.key());
  request.set_offset(0);
  request.set_byte_size(region.byte_size());
  inference::SystemSharedMemoryRegisterResponse response;
  return stub_->SystemSharedMemoryRegister(&context, request, &response);
}

void SharedMemoryPath::Drop(std::unique_ptr<ShmRegion> region) {
  grpc::ClientContext context;
  prepare_(context);
  context.set_deadline(std::chrono::system_clock::now() + kHousekeepingTimeout);
  inference::SystemSharedMemoryUnregisterRequest request;
  request.set_name(region->name());
  inference::SystemSharedMemoryUnregisterResponse response;
  (void)stub_->SystemSharedMemoryUnregister(&context, request, &response);
  region.reset();  // unmaps and unlinks
}

absl::StatusOr<ShmRegion*> SharedMemoryPath::Acquire(int64_t byte_size,
                                                     std::optional<ShmUnavailable>* why) {
  std::unique_ptr<ShmRegion> too_small;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto largest = std::max_element(idle_.begin(), idle_.end(), [](const auto& a, const auto& b) {
      return a->byte_size() < b->byte_size();
    });
    if (largest != idle_.end()) {
      std::unique_ptr<ShmRegion> region = std::move(*largest);
      idle_.erase(largest);
      if (region->byte_size() >= byte_size) {
        busy_.push_back(std::move(region));
        return busy_.back().get();
      }
      too_small = std::move(region);
    }
  }
  if (too_small != nullptr) Drop(std::move(too_small));
  absl::StatusOr<std::unique_ptr<ShmRegion>> made =
      ShmRegion::Create((byte_size + kGranule - 1) / kGranule * kGranule);
  if (!made.ok()) {
    *why = ShmUnavailable{made.status(), false};
    return nullptr;
  }
  if (grpc::Status status = Register(**made); !status.ok()) {
    made->reset();  // unlinked; the server mapped nothing
    if (RefusesCaller(status.error_code())) return FromGrpc(status);
    *why = ShmUnavailable{absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                                       absl::StrCat("SystemSharedMemoryRegister: ",
                                                    status.error_message())),
                          NeverMaps(status.error_code())};
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mu_);
  busy_.push_back(*std::move(made));
  return busy_.back().get();
}

void SharedMemoryPath::Release(ShmRegion* region, bool keep) {
  std::unique_ptr<ShmRegion> owned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(busy_.begin(), busy_.end(),
                           [region](const auto& r) { return r.get() == region; });
    owned = std::move(*it);
    busy_.erase(it);
    if (keep) {
      idle_.push_back(std::move(owned));
      return;
    }
  }
  Drop(std::move(owned));
}

ShmOutcome<bool> SharedMemoryPath::EnsureRegistered() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty() || !busy_.empty()) return {true, {}};
  }
  std::optional<ShmUnavailable> why;
  absl::StatusOr<ShmRegion*> region = Acquire(kGranule, &why);
  if (!region.ok()) return {region.status(), {}};
  if (why) return {std::nullopt, *std::move(why)};
  Release(*region, true);
  return {true, {}};
}

std::optional<ShmUnavailable> SharedMemoryPath::Call(
    const std::string& model, const std::vector<Input>& inputs,
    const google::protobuf::RepeatedField<int32_t>& cu_seqlens_q,
    const google::protobuf::RepeatedField<int32_t>& cu_seqlens_k,
    const std::vector<Output>& outputs, const v1::AttentionOptions& options,
    std::optional<bool> deterministic, absl::Status* error) {
  // Inputs, then outputs, each at an aligned offset.
  std::vector<int64_t> offsets;
  int64_t end = 0;
  for (const Input& input : inputs) {
    offsets.push_back(end);
    end = Aligned(end + static_cast<int64_t>(input.tensor->data().size()));
  }
  std::vector<int64_t> output_bytes;
  for (const Output& output : outputs) {
    offsets.push_back(end);
    output_bytes.push_back(Elements(output.shape) * DTypeItemSize(output.dtype));
    end = Aligned(end + output_bytes.back());
  }
  if (getpid() != owner_) {
    return ShmUnavailable{
        absl::FailedPreconditionError("the shared memory regions belong to the parent process"),
        true};
  }
  std::optional<ShmUnavailable> why;
  absl::StatusOr<ShmRegion*> acquired = Acquire(std::max(end, kAlignment), &why);
  if (!acquired.ok()) {
    *error = acquired.status();
    return std::nullopt;
  }
  if (why) return why;
  ShmRegion& region = **acquired;

  inference::ModelInferRequest request;
  request.set_model_name(model);
  SetOptions(options, deterministic, request);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const v1::Tensor& tensor = *inputs[i].tensor;
    CopyParallel(region.data() + offsets[i], tensor.data().data(), tensor.data().size(),
                 *copiers_);
    inference::ModelInferRequest::InferInputTensor* input = request.add_inputs();
    input->set_name(inputs[i].name);
    input->set_datatype(Datatype(tensor.dtype()));
    for (int64_t d : tensor.shape()) input->add_shape(d);
    SetParameters(*input->mutable_parameters(), region, offsets[i],
                  static_cast<int64_t>(tensor.data().size()));
  }
  AddInline("cu_seqlens_q", cu_seqlens_q, request);
  AddInline("cu_seqlens_k", cu_seqlens_k, request);
  for (size_t i = 0; i < outputs.size(); ++i) {
    inference::ModelInferRequest::InferRequestedOutputTensor* output = request.add_outputs();
    output->set_name(outputs[i].name);
    SetParameters(*output->mutable_parameters(), region, offsets[inputs.size() + i],
                  output_bytes[i]);
  }

  inference::ModelInferResponse response;
  grpc::Status status;
  // A region the server lost (it restarted, or forgot it after its idle timeout) is registered
  // again once, its inputs still in place, and the call repeated.
  for (int attempt = 0; attempt < 2; ++attempt) {
    grpc::ClientContext context;
    prepare_(context);
    status = stub_->ModelInfer(&context, request, &response);
    if (status.ok() || attempt > 0 ||
        !absl::StrContains(status.error_message(), kUnknownRegion) || !Register(region).ok()) {
      break;
    }
  }
  const std::string& message = status.error_message();
  if (!status.ok()) {
    const bool stale = absl::StrContains(message, kUnknownRegion);
    Release(&region, !stale);
    const absl::Status failed = FromGrpc(status);
    // A region still unknown, or a server out of reach (which the other paths retry), fail this
    // call only; shared memory turned off or regions refused fail every later one too.
    if (stale || status.error_code() == grpc::UNAVAILABLE) {
      return ShmUnavailable{absl::Status(failed.code(), absl::StrCat("ModelInfer: ", message)),
                            false};
    }
    if (status.error_code() == grpc::FAILED_PRECONDITION ||
        (status.error_code() == grpc::INVALID_ARGUMENT &&
         absl::StrContains(message, ".shared_memory_"))) {
      return ShmUnavailable{absl::Status(failed.code(), absl::StrCat("ModelInfer: ", message)),
                            true};
    }
    *error = failed;
    return std::nullopt;
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Output& expected = outputs[i];
    const inference::ModelInferResponse::InferOutputTensor* answered = nullptr;
    for (const auto& output : response.outputs()) {
      if (output.name() == expected.name) answered = &output;
    }
    bool in_place = answered != nullptr && Shape(answered->shape()) == expected.shape;
    if (in_place) {
      const auto parameter = answered->parameters().find("shared_memory_region");
      in_place = parameter != answered->parameters().end() &&
                 parameter->second.string_param() == region.name();
    }
    if (!in_place) {
      Release(&region, true);
      *error = absl::InternalError(absl::StrCat(
          expected.name, ": the server answered shape [",
          answered == nullptr ? "none" : absl::StrJoin(answered->shape(), ", "),
          "] outside region \"", region.name(), "\"; expected [",
          absl::StrJoin(expected.shape, ", "), "] in it"));
      return std::nullopt;
    }
    v1::Tensor& tensor = *expected.into;
    tensor.set_dtype(expected.dtype);
    tensor.mutable_shape()->Assign(expected.shape.begin(), expected.shape.end());
    std::string* data = tensor.mutable_data();
    data->resize(static_cast<size_t>(output_bytes[i]));
    CopyParallel(data->data(), region.data() + offsets[inputs.size() + i], data->size(),
                 *copiers_);
  }
  Release(&region, true);
  return std::nullopt;
}

ShmOutcome<v1::ForwardResponse> SharedMemoryPath::Forward(const v1::ForwardRequest& request) {
  const std::vector<int64_t> q_shape = Shape(request.q().shape());
  v1::ForwardResponse response;
  absl::Status error;
  std::optional<ShmUnavailable> why =
      Call("attention_forward", {{"q", &request.q()}, {"k", &request.k()}, {"v", &request.v()}},
           request.cu_seqlens_q(), request.cu_seqlens_k(),
           {{"out", request.q().dtype(), q_shape, response.mutable_out()},
            {"lse", v1::DTYPE_FLOAT32, {q_shape[1], q_shape[0]}, response.mutable_lse()}},
           request.options(), std::nullopt, &error);
  if (why) return {std::nullopt, *std::move(why)};
  if (!error.ok()) return {error, {}};
  // The protocol has no saved contexts: keep_context gets an empty context_id, which the
  // contract allows (the backward then goes in full), and no execution report.
  return {std::move(response), {}};
}

ShmOutcome<v1::BackwardResponse> SharedMemoryPath::Backward(const v1::BackwardRequest& request) {
  // The server requires dout's dtype to be q's; the gradients have it.
  const v1::DType dtype = request.dout().dtype();
  v1::BackwardResponse response;
  absl::Status error;
  std::optional<ShmUnavailable> why = Call(
      "attention_backward",
      {{"dout", &request.dout()}, {"q", &request.q()}, {"k", &request.k()}, {"v", &request.v()},
       {"out", &request.out()}, {"lse", &request.lse()}},
      request.cu_seqlens_q(), request.cu_seqlens_k(),
      {{"dq", dtype, Shape(request.q().shape()), response.mutable_dq()},
       {"dk", dtype, Shape(request.k().shape()), response.mutable_dk()},
       {"dv", dtype, Shape(request.v().shape()), response.mutable_dv()}},
      request.options(), request.deterministic(), &error);
  if (why) return {std::nullopt, *std::move(why)};
  if (!error.ok()) return {error, {}};
  return {std::move(response), {}};
}

}  // namespace attnserve::internal

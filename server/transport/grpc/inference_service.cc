#include "server/transport/grpc/inference_service.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/transport/grpc/answer_reactor.h"
#include "server/transport/grpc/attention_service.h"
#include "server/transport/grpc/call_auth.h"
#include "server/transport/grpc/call_control.h"
#include "server/transport/grpc/inference_codec.h"
#include "server/transport/oip/model_codec.h"
#include "server/transport/oip/server_metadata.h"

namespace attnserve::transport {

InferenceServiceImpl::InferenceServiceImpl(oip::InferDispatcher* dispatcher,
                                           metrics::ServerMetrics* metrics, CallSlots* slots,
                                           InferenceServiceOptions options)
    : dispatcher_(dispatcher), metrics_(metrics), slots_(slots), options_(std::move(options)) {}

grpc::ServerUnaryReactor* InferenceServiceImpl::Unary(grpc::CallbackServerContext* context,
                                                      const char* rpc, const Authenticator* auth,
                                                      absl::FunctionRef<absl::Status()> body) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  absl::Status status = AuthenticateCall(auth, *context);
  if (status.ok()) status = body();
  metrics_->RecordRequest(rpc, absl::StatusCodeToString(status.code()),
                          absl::ToDoubleSeconds(absl::Now() - start));
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ServerLive(
    grpc::CallbackServerContext* context, const inference::ServerLiveRequest*,
    inference::ServerLiveResponse* response) {
  return Unary(context, "ServerLive", options_.health_auth, [&]() -> absl::Status {
    response->set_live(true);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ServerReady(
    grpc::CallbackServerContext* context, const inference::ServerReadyRequest*,
    inference::ServerReadyResponse* response) {
  return Unary(context, "ServerReady", options_.health_auth, [&]() -> absl::Status {
    response->set_ready(!options_.is_ready || options_.is_ready());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ModelReady(
    grpc::CallbackServerContext* context, const inference::ModelReadyRequest* request,
    inference::ModelReadyResponse* response) {
  return Unary(context, "ModelReady", options_.health_auth, [&]() -> absl::Status {
    absl::StatusOr<const oip::ModelMetadata*> model =
        oip::FindModel(request->name(), request->version());
    if (!model.ok()) return model.status();
    response->set_ready(!options_.is_ready || options_.is_ready());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ServerMetadata(
    grpc::CallbackServerContext* context, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  return Unary(context, "ServerMetadata", options_.auth, [&]() -> absl::Status {
    response->set_name(oip::kServerName);
    response->set_version(options_.version);
    for (const std::string& extension : oip::ServerExtensions()) {
      response->add_extensions(extension);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ModelMetadata(
    grpc::CallbackServerContext* context, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  return Unary(context, "ModelMetadata", options_.auth, [&]() -> absl::Status {
    absl::StatusOr<const oip::ModelMetadata*> model =
        oip::FindModel(request->name(), request->version());
    if (!model.ok()) return model.status();
    response->set_name((*model)->name);
    response->add_versions(oip::kModelVersion);
    response->set_platform(oip::kPlatform);
    auto add = [](const oip::TensorMetadata& spec, auto* out) {
      out->set_name(spec.name);
      out->set_datatype(spec.datatype);
      out->mutable_shape()->Assign(spec.shape.begin(), spec.shape.end());
    };
    for (const auto& spec : (*model)->inputs) add(spec, response->add_inputs());
    for (const auto& spec : (*model)->outputs) add(spec, response->add_outputs());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ModelStatistics(
    grpc::CallbackServerContext* context, const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  return Unary(context, "ModelStatistics", options_.auth, [&]() -> absl::Status {
    std::vector<const oip::ModelMetadata*> models;
    if (request->name().empty()) {
      for (const auto& model : oip::AllModels()) models.push_back(&model);
    } else {
      absl::StatusOr<const oip::ModelMetadata*> model =
          oip::FindModel(request->name(), request->version());
      if (!model.ok()) return model.status();
      models.push_back(*model);
    }
    for (const oip::ModelMetadata* model : models) {
      const oip::ModelCounts counts = dispatcher_->statistics().Get(model->name);
      auto* stats = response->add_model_stats();
      stats->set_name(model->name);
      stats->set_version(oip::kModelVersion);
      stats->set_last_inference(counts.last_inference_ms);
      stats->set_inference_count(counts.inference_count);
      stats->set_execution_count(counts.execution_count);
      auto set = [](const oip::Duration& d, inference::StatisticDuration* out) {
        out->set_count(d.count);
        out->set_ns(d.ns);
      };
      auto* infer = stats->mutable_inference_stats();
      set(counts.success, infer->mutable_success());
      set(counts.fail, infer->mutable_fail());
      set(counts.queue, infer->mutable_queue());
      set(counts.compute_infer, infer->mutable_compute_infer());
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* InferenceServiceImpl::ModelInfer(
    grpc::CallbackServerContext* context, const inference::ModelInferRequest* request,
    inference::ModelInferResponse* response) {
  auto* reactor = new AnswerReactor(context, slots_, options_.limits.answer_send_timeout);
  const absl::Time start = absl::Now();
  auto finish = [this, reactor, start](const absl::Status& status) {
    metrics_->RecordRequest("ModelInfer", absl::StatusCodeToString(status.code()),
                            absl::ToDoubleSeconds(absl::Now() - start));
    reactor->FinishCall(ToGrpcStatus(status));
  };
  if (absl::Status refusal = AuthenticateCall(options_.auth, *context); !refusal.ok()) {
    finish(refusal);
    return reactor;
  }
  if (absl::Status slot = reactor->AcquireSlot(); !slot.ok()) {
    finish(slot);
    return reactor;
  }
  int64_t received = 0;
  for (const std::string& raw : request->raw_input_contents()) received += raw.size();
  metrics_->AddReceivedBytes(static_cast<double>(received));
  absl::StatusOr<oip::InferRequest> decoded = DecodeInferRequest(*request);
  if (!decoded.ok()) {
    finish(decoded.status());
    return reactor;
  }
  absl::StatusOr<engine::JobControl> control =
      CallControl(context, options_.auth, start, options_.limits.max_deadline);
  if (!control.ok()) {
    finish(control.status());
    return reactor;
  }
  // The request message belongs to gRPC until the reactor finishes, which is after `done`.
  auto shared = std::make_shared<oip::InferRequest>(*std::move(decoded));
  absl::Status status = dispatcher_->Dispatch(
      shared, *std::move(control), "grpc",
      [this, response, finish](absl::StatusOr<oip::InferAnswer> answer) {
        if (!answer.ok()) return finish(answer.status());
        metrics_->AddSentBytes(
            static_cast<double>(EncodeInferAnswer(*std::move(answer), response)));
        finish(absl::OkStatus());
      });
  if (!status.ok()) finish(status);
  return reactor;
}

}  // namespace attnserve::transport

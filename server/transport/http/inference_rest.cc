#include "server/transport/http/inference_rest.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/transport/http/http_body.h"
#include "server/transport/http/rest_documents.h"
#include "server/transport/http/rest_json.h"
#include "server/transport/http/rest_status.h"

namespace attnserve::transport {
namespace {

// Registration bodies are a few short fields, sent at once.
constexpr int64_t kMaxControlBodyBytes = 64 << 10;
constexpr absl::Duration kControlBodyTimeout = absl::Seconds(10);
constexpr char kRegion[] = "region";

RestResponse JsonResponse(const rest::Json& json) {
  return {200, json.dump(-1, ' ', false, rest::Json::error_handler_t::replace)};
}

// 200 with no body when true, 503 when false: KServe's health and readiness answers.
RestResponse Truth(bool value) { return {value ? 200 : 503, ""}; }

// The path below /v2, split at '/': "/v2/models/m/ready" → {"models", "m", "ready"}; nullopt
// for a path outside /v2 (civetweb also hands "/v2x" to the "/v2" handler).
std::optional<std::vector<std::string>> PathBelowV2(mg_connection* conn) {
  const char* uri = mg_get_request_info(conn)->local_uri;
  const absl::string_view path = uri == nullptr ? "" : uri;
  if (path == "/v2" || path == "/v2/") return std::vector<std::string>();
  if (!absl::StartsWith(path, "/v2/")) return std::nullopt;
  return absl::StrSplit(path.substr(4), '/');
}

// Splits "models/<m>[/versions/<v>]/<rest...>" into model, version and the rest; false when
// `path` is not of that form.
bool ModelPath(const std::vector<std::string>& path, std::string* model, std::string* version,
               std::vector<std::string>* rest) {
  if (path.size() < 2 || path[0] != "models" || path[1].empty()) return false;
  *model = path[1];
  size_t next = 2;
  if (path.size() >= 4 && path[2] == "versions") {
    *version = path[3];
    next = 4;
  }
  rest->assign(path.begin() + static_cast<std::ptrdiff_t>(next), path.end());
  return true;
}

absl::Status NoEndpoint(const char* method) {
  return absl::NotFoundError(absl::StrCat("no ", method, " endpoint at this path"));
}

// The region kind a path below /v2 starts with: "systemsharedmemory" or "cudasharedmemory".
std::optional<oip::RegionKind> RegionKindOf(const std::vector<std::string>& path) {
  if (path.empty()) return std::nullopt;
  if (path[0] == "systemsharedmemory") return oip::RegionKind::kSystem;
  if (path[0] == "cudasharedmemory") return oip::RegionKind::kCuda;
  return std::nullopt;
}

}  // namespace

InferenceRestHandler::InferenceRestHandler(oip::InferDispatcher* dispatcher,
                                           metrics::ServerMetrics* metrics, CallSlots* slots,
                                           InferenceRestOptions options)
    : dispatcher_(dispatcher), metrics_(metrics), slots_(slots), options_(std::move(options)) {}

RestResponse InferenceRestHandler::Call(mg_connection* conn, const char* rpc,
                                        const Authenticator* auth,
                                        const std::function<absl::StatusOr<RestResponse>()>& body) {
  const absl::Time start = absl::Now();
  const absl::Status accepted =
      auth == nullptr ? absl::OkStatus() : auth->Check(RequestHeader(conn, "Authorization"));
  absl::StatusOr<RestResponse> response = accepted.ok() ? body() : accepted;
  metrics_->RecordRequest(rpc, absl::StatusCodeToString(response.status().code()),
                          absl::ToDoubleSeconds(absl::Now() - start));
  return response.ok() ? *std::move(response) : RestError(response.status());
}

std::string InferenceRestHandler::PrincipalOf(mg_connection* conn) const {
  if (options_.auth == nullptr) return "";
  return options_.auth->Principal(RequestHeader(conn, "Authorization"));
}

bool InferenceRestHandler::handleGet(CivetServer*, mg_connection* conn) {
  std::optional<Path> path = PathBelowV2(conn);
  SendResponse(conn, path.has_value() ? Get(conn, *path) : RestError(NoEndpoint("GET")));
  return true;
}

bool InferenceRestHandler::handlePost(CivetServer*, mg_connection* conn) {
  std::optional<Path> path = PathBelowV2(conn);
  SendResponse(conn, path.has_value() ? Post(conn, *path) : RestError(NoEndpoint("POST")));
  return true;
}

RestResponse InferenceRestHandler::Get(mg_connection* conn, const Path& path) {
  auto ready = [this] { return !options_.is_ready || options_.is_ready(); };
  if (path.empty()) {
    return Call(conn, "ServerMetadata", options_.auth, [&]() -> absl::StatusOr<RestResponse> {
      return JsonResponse(rest::ServerMetadata(options_.version));
    });
  }
  if (path == Path{"health", "live"}) {
    return Call(conn, "ServerLive", options_.health_auth,
                [&]() -> absl::StatusOr<RestResponse> { return Truth(true); });
  }
  if (path == Path{"health", "ready"}) {
    return Call(conn, "ServerReady", options_.health_auth,
                [&]() -> absl::StatusOr<RestResponse> { return Truth(ready()); });
  }
  if (path == Path{"models", "stats"}) {
    return Call(conn, "ModelStatistics", options_.auth, [&]() -> absl::StatusOr<RestResponse> {
      std::vector<const oip::ModelMetadata*> models;
      for (const auto& model : oip::AllModels()) models.push_back(&model);
      return JsonResponse(rest::ModelStatistics(models, dispatcher_->statistics()));
    });
  }
  std::string model, version;
  Path rest;
  if (ModelPath(path, &model, &version, &rest) && rest.size() <= 1) {
    const std::string what = rest.empty() ? "" : rest[0];
    if (what.empty() || what == "stats") {
      return Call(conn, what.empty() ? "ModelMetadata" : "ModelStatistics", options_.auth,
                  [&]() -> absl::StatusOr<RestResponse> {
                    absl::StatusOr<const oip::ModelMetadata*> found =
                        oip::FindModel(model, version);
                    if (!found.ok()) return found.status();
                    if (what.empty()) return JsonResponse(rest::ModelMetadata(**found));
                    return JsonResponse(rest::ModelStatistics({*found}, dispatcher_->statistics()));
                  });
    }
    if (what == "ready") {
      return Call(conn, "ModelReady", options_.health_auth, [&]() -> absl::StatusOr<RestResponse> {
        absl::StatusOr<const oip::ModelMetadata*> found = oip::FindModel(model, version);
        if (!found.ok()) return found.status();
        return Truth(ready());
      });
    }
  }
  const std::optional<oip::RegionKind> kind = RegionKindOf(path);
  const bool all_regions = kind.has_value() && path.size() == 2 && path[1] == "status";
  if (all_regions ||
      (kind.has_value() && path.size() == 4 && path[1] == kRegion && path[3] == "status")) {
    const bool cuda = *kind == oip::RegionKind::kCuda;
    return Call(conn, cuda ? "CudaSharedMemoryStatus" : "SystemSharedMemoryStatus",
                options_.auth, [&]() -> absl::StatusOr<RestResponse> {
                  auto regions = dispatcher_->shared_memory().Status(
                      PrincipalOf(conn), *kind, all_regions ? std::string() : path[2]);
                  if (!regions.ok()) return regions.status();
                  return JsonResponse(cuda ? rest::CudaSharedMemoryStatus(*regions)
                                           : rest::SharedMemoryStatus(*regions));
                });
  }
  return RestError(NoEndpoint("GET"));
}

absl::Status InferenceRestHandler::RegisterSystem(const std::string& principal,
                                                  const std::string& name,
                                                  const std::string& body) {
  absl::StatusOr<rest::RegionRegistration> registration = rest::DecodeRegistration(body);
  if (!registration.ok()) return registration.status();
  return dispatcher_->shared_memory().RegisterSystem(principal, name, registration->key,
                                                     registration->offset,
                                                     registration->byte_size);
}

// As the gRPC CudaSharedMemoryRegister: the engine opens the handle on that device, and a
// server without it answers FAILED_PRECONDITION.
absl::Status InferenceRestHandler::RegisterCuda(const std::string& principal,
                                                const std::string& name,
                                                const std::string& body) {
  absl::StatusOr<rest::CudaRegionRegistration> registration = rest::DecodeCudaRegistration(body);
  if (!registration.ok()) return registration.status();
  return dispatcher_->shared_memory().RegisterCuda(principal, name, [&] {
    return dispatcher_->engine().OpenForeignDeviceMemory(
        registration->device_id, registration->raw_handle, registration->byte_size);
  });
}

RestResponse InferenceRestHandler::Post(mg_connection* conn, const Path& path) {
  std::string model, version;
  Path rest;
  if (ModelPath(path, &model, &version, &rest) && rest == Path{"infer"}) {
    return Infer(conn, model, version);
  }
  const std::string principal = PrincipalOf(conn);
  const std::optional<oip::RegionKind> kind = RegionKindOf(path);
  const bool is_region =
      kind.has_value() && path.size() == 4 && path[1] == kRegion && !path[2].empty();
  if (is_region && path[3] == "register") {
    const bool cuda = *kind == oip::RegionKind::kCuda;
    return Call(
        conn, cuda ? "CudaSharedMemoryRegister" : "SystemSharedMemoryRegister", options_.auth,
        [&]() -> absl::StatusOr<RestResponse> {
          absl::StatusOr<std::string> body =
              ReadRequestBody(conn, kMaxControlBodyBytes, absl::Now() + kControlBodyTimeout);
          if (!body.ok()) return BodyRefusal(body.status());
          absl::Status status = cuda ? RegisterCuda(principal, path[2], *body)
                                     : RegisterSystem(principal, path[2], *body);
          if (!status.ok()) return status;
          return RestResponse{200, ""};
        });
  }
  const bool all_regions = kind.has_value() && path.size() == 2 && path[1] == "unregister";
  if (all_regions || (is_region && path[3] == "unregister")) {
    return Call(conn,
                *kind == oip::RegionKind::kCuda ? "CudaSharedMemoryUnregister"
                                                : "SystemSharedMemoryUnregister",
                options_.auth, [&]() -> absl::StatusOr<RestResponse> {
                  absl::Status status = dispatcher_->shared_memory().Unregister(
                      principal, *kind, all_regions ? std::string() : path[2]);
                  if (!status.ok()) return status;
                  return RestResponse{200, ""};
                });
  }
  return RestError(NoEndpoint("POST"));
}

}  // namespace attnserve::transport

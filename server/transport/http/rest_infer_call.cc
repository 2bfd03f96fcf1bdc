// InferenceRestHandler's inference: POST /v2/models/<m>[/versions/<v>]/infer, run through the
// InferDispatcher while the civetweb thread waits, boundedly, for the answer.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/engine/priority.h"
#include "server/transport/http/http_body.h"
#include "server/transport/http/inference_rest.h"
#include "server/transport/http/rest_exchange.h"
#include "server/transport/http/rest_infer_codec.h"
#include "server/transport/http/rest_status.h"
#include "server/transport/oip/model_codec.h"

namespace attnserve::transport {
namespace {

constexpr char kHeaderLength[] = "Inference-Header-Content-Length";
// Triton's request parameter for a client's deadline, in microseconds.
constexpr char kTimeoutParameter[] = "timeout";

// The body and the request decoded from it, which views into it: the dispatcher keeps the
// request (and so the body) until it has answered.
struct BodyAndRequest {
  std::string body;
  oip::InferRequest request;
};

// Where the dispatcher leaves the answer for the waiting civetweb thread. `abandoned` is set
// when that thread stopped waiting, so the engine drops the job if it has not started.
struct PendingAnswer {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<absl::StatusOr<oip::InferAnswer>> answer;
  std::atomic<bool> abandoned{false};
};

// Gives a max_concurrent_requests slot back when the last holder lets go: the waiting thread,
// or the dispatcher's `done` if that runs later (an abandoned call still holds its memory).
class SlotHold {
 public:
  explicit SlotHold(CallSlots* slots) : slots_(slots) {}
  ~SlotHold() { slots_->Release(); }
  SlotHold(const SlotHold&) = delete;
  SlotHold& operator=(const SlotHold&) = delete;

 private:
  CallSlots* const slots_;
};

// Counts an inference's hold on a civetweb thread for as long as it lives.
class ThreadHold {
 public:
  explicit ThreadHold(std::atomic<int>* count) : count_(count) { count_->fetch_add(1); }
  ~ThreadHold() { count_->fetch_sub(1); }
  ThreadHold(const ThreadHold&) = delete;
  ThreadHold& operator=(const ThreadHold&) = delete;

 private:
  std::atomic<int>* const count_;
};

absl::StatusOr<std::optional<int64_t>> JsonLength(mg_connection* conn) {
  std::optional<absl::string_view> value = RequestHeader(conn, kHeaderLength);
  if (!value.has_value()) return std::optional<int64_t>();
  int64_t length = 0;
  if (!absl::SimpleAtoi(*value, &length)) {
    return absl::InvalidArgumentError(absl::StrCat(kHeaderLength, ": must be a byte count"));
  }
  return std::optional<int64_t>(length);
}

// The engine's control of the call: its deadline (the cap, else the HTTP default, shortened
// by a `timeout` parameter), priority header, principal, and cancellation once abandoned.
absl::StatusOr<engine::JobControl> Control(mg_connection* conn, const oip::InferRequest& request,
                                           absl::Time start, absl::Duration cap,
                                           std::string principal,
                                           const std::shared_ptr<PendingAnswer>& pending) {
  engine::JobControl control;
  control.deadline = start + cap;
  absl::StatusOr<uint64_t> timeout_us =
      oip::UnsignedParameter(request.parameters, kTimeoutParameter, "parameters", 0);
  if (!timeout_us.ok()) return timeout_us.status();
  if (*timeout_us > 0) {
    control.deadline = std::min(control.deadline,
                                start + absl::Microseconds(static_cast<int64_t>(
                                            std::min<uint64_t>(*timeout_us, uint64_t{1} << 62))));
  }
  if (std::optional<absl::string_view> priority =
          RequestHeader(conn, engine::kPriorityMetadataKey)) {
    absl::StatusOr<engine::Priority> parsed = engine::ParsePriority(*priority);
    if (!parsed.ok()) return parsed.status();
    control.priority = *parsed;
  }
  control.principal = std::move(principal);
  control.cancelled = [pending] { return pending->abandoned.load(); };
  return control;
}

absl::Status NotIdentityEncoded(mg_connection* conn) {
  std::optional<absl::string_view> encoding = RequestHeader(conn, "Content-Encoding");
  if (!encoding.has_value() || *encoding == "identity") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("Content-Encoding: \"", *encoding, "\" is not accepted; send the body as is"));
}

}  // namespace

RestResponse InferenceRestHandler::Infer(mg_connection* conn, const std::string& model,
                                         const std::string& version) {
  const absl::Time start = absl::Now();
  absl::StatusOr<RestResponse> response = RunInfer(conn, model, version, start);
  metrics_->RecordRequest("ModelInfer", absl::StatusCodeToString(response.status().code()),
                          absl::ToDoubleSeconds(absl::Now() - start));
  return response.ok() ? *std::move(response) : RestError(response.status());
}

absl::StatusOr<RestResponse> InferenceRestHandler::RunInfer(mg_connection* conn,
                                                            const std::string& model,
                                                            const std::string& version,
                                                            absl::Time start) {
  if (options_.auth != nullptr) {
    absl::Status accepted = options_.auth->Check(RequestHeader(conn, "Authorization"));
    if (!accepted.ok()) return accepted;
  }
  ThreadHold thread_hold(&inferences_);
  if (inferences_.load() > options_.max_inferences) {
    return absl::ResourceExhaustedError(
        absl::StrCat("too many HTTP inferences at once (", options_.max_inferences,
                     " may hold HTTP threads; the rest are kept for probes): retry, or use gRPC"));
  }
  if (absl::StatusOr<const oip::ModelMetadata*> found = oip::FindModel(model, version);
      !found.ok()) {
    return found.status();
  }
  if (absl::Status s = slots_->Acquire(); !s.ok()) return s;
  auto slot = std::make_shared<SlotHold>(slots_);
  if (absl::Status s = NotIdentityEncoded(conn); !s.ok()) return s;
  absl::StatusOr<std::optional<int64_t>> json_length = JsonLength(conn);
  if (!json_length.ok()) return json_length.status();

  // The body, too, must arrive within the call's longest deadline.
  const absl::Duration cap = options_.limits.max_deadline == absl::InfiniteDuration()
                                 ? options_.default_deadline
                                 : options_.limits.max_deadline;
  auto holder = std::make_shared<BodyAndRequest>();
  absl::StatusOr<std::string> body = ReadRequestBody(conn, options_.max_body_bytes, start + cap);
  if (!body.ok()) return BodyRefusal(body.status());
  holder->body = *std::move(body);
  metrics_->AddReceivedBytes(static_cast<double>(holder->body.size()));
  absl::StatusOr<oip::InferRequest> decoded =
      rest::DecodeInferBody(holder->body, *json_length, options_.max_json_bytes);
  if (!decoded.ok()) return BodyRefusal(decoded.status());
  holder->request = *std::move(decoded);
  holder->request.model_name = model;
  holder->request.model_version = version;

  auto pending = std::make_shared<PendingAnswer>();
  absl::StatusOr<engine::JobControl> control =
      Control(conn, holder->request, start, cap, PrincipalOf(conn), pending);
  if (!control.ok()) return control.status();
  const absl::Time wait_until = control->deadline + options_.answer_grace;
  std::shared_ptr<oip::InferRequest> request(holder, &holder->request);
  absl::Status dispatched =
      dispatcher_->Dispatch(request, *std::move(control), "http",
                            [pending, slot](absl::StatusOr<oip::InferAnswer> answer) {
                              std::lock_guard<std::mutex> lock(pending->mu);
                              pending->answer = std::move(answer);
                              pending->cv.notify_one();
                            });
  if (!dispatched.ok()) return dispatched;
  slot.reset();  // `done` holds it now

  std::unique_lock<std::mutex> lock(pending->mu);
  if (!pending->cv.wait_until(lock, absl::ToChronoTime(wait_until),
                              [&] { return pending->answer.has_value(); })) {
    pending->abandoned = true;
    return absl::DeadlineExceededError(
        "no answer by the call's deadline (--max_deadline_seconds or the timeout parameter); "
        "the call was abandoned");
  }
  absl::StatusOr<oip::InferAnswer> answer = *std::move(pending->answer);
  lock.unlock();
  if (!answer.ok()) return answer.status();
  rest::EncodedAnswer encoded = rest::EncodeInferAnswer(*std::move(answer), holder->request);
  metrics_->AddSentBytes(static_cast<double>(encoded.tensor_bytes));
  return RestResponse{200, std::move(encoded.body), encoded.json_length, ""};
}

}  // namespace attnserve::transport

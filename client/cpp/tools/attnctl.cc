// attnctl: talks to an attnserve server from the command line.
//   attnctl info                       server version, devices, kernel families, limits
//   attnctl forward  [--check] ...     a forward on random packed sequences
//   attnctl backward [--check] ...     a backward on random packed sequences
//   attnctl forward --keep_context     a forward whose context the server keeps (left to
//                                      its TTL); prints the id
//   attnctl backward --keep_context    the same through a saved context: a Forward that keeps
//                                      it, then a backward that sends only dout
// --transport=grpc|data|auto picks gRPC or the server's data channel (ClientOptions::transport;
// auto: the data channel when the server offers one, with TLS when the client uses it);
// --shared_memory=off|auto|on passes the tensors through POSIX shared memory to a server on
// this host started with --allow_shared_memory (ClientOptions::shared_memory).
// --check compares the answer with the local exact reference and fails (exit 1) beyond the
// dtype's tolerance. TLS and bearer tokens: tools/security_flags.h.
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attnserve/client.h"
#include "attnserve/tensor_codec.h"
#include "google/protobuf/util/json_util.h"
#include "tools/attention_problem.h"
#include "tools/security_flags.h"
#include "tools/transport_choice.h"

ABSL_FLAG(std::string, target, "localhost:8001", "Server address (gRPC target).");
ABSL_FLAG(std::string, transport, "auto",
          "grpc, data (the server's bulk data channel) or auto (the data channel when the server "
          "offers one as protected as the gRPC channel: TLS on both or neither).");
ABSL_FLAG(int32_t, data_connections, 4, "Data channel: TCP connections of the session.");
ABSL_FLAG(std::string, shared_memory, "off",
          "off, auto (POSIX shared memory when the server is on this host and started with "
          "--allow_shared_memory, else --transport) or on (shared memory or an error).");
ABSL_FLAG(int32_t, timeout_ms, 0, "Per-call deadline in milliseconds (0 = none).");
ABSL_FLAG(int32_t, batch, 2, "Sequences in the request.");
ABSL_FLAG(int32_t, seqlen_q, 128, "Longest query sequence (lengths are random in [n/2, n]).");
ABSL_FLAG(int32_t, seqlen_k, 128, "Longest key sequence (lengths are random in [n/2, n]).");
ABSL_FLAG(int32_t, heads, 4, "Query heads.");
ABSL_FLAG(int32_t, heads_k, 0, "Key/value heads (0 = same as --heads).");
ABSL_FLAG(int32_t, head_dim, 64, "Head dimension.");
ABSL_FLAG(std::string, dtype, "bf16", "fp16, bf16 or fp32.");
ABSL_FLAG(bool, causal, false, "Causal (bottom-right aligned) masking.");
ABSL_FLAG(int32_t, window_left, -1, "Sliding window to the left (-1 = unbounded).");
ABSL_FLAG(int32_t, window_right, -1, "Sliding window to the right (-1 = unbounded).");
ABSL_FLAG(double, softcap, 0.0, "Softcap (0 = off).");
ABSL_FLAG(uint64_t, seed, 1, "Random seed.");
ABSL_FLAG(bool, check, false, "Compare with the local reference; exit 1 beyond tolerance.");
ABSL_FLAG(bool, keep_context, false,
          "forward: ask the server to keep the context (left to its TTL) and print its id. "
          "backward: run the forward on the server keeping its context, then a backward that "
          "sends only dout (resent in full if the server no longer has the context).");

namespace attnserve {
namespace {

absl::StatusOr<v1::DType> ParseDType(const std::string& name) {
  if (name == "fp16" || name == "float16") return v1::DTYPE_FLOAT16;
  if (name == "bf16" || name == "bfloat16") return v1::DTYPE_BFLOAT16;
  if (name == "fp32" || name == "float32") return v1::DTYPE_FLOAT32;
  return absl::InvalidArgumentError("--dtype must be fp16, bf16 or fp32, got " + name);
}

absl::StatusOr<tools::ProblemSpec> SpecFromFlags() {
  tools::ProblemSpec spec;
  spec.batch = absl::GetFlag(FLAGS_batch);
  spec.max_seqlen_q = absl::GetFlag(FLAGS_seqlen_q);
  spec.max_seqlen_k = absl::GetFlag(FLAGS_seqlen_k);
  spec.num_heads = absl::GetFlag(FLAGS_heads);
  spec.num_heads_k = absl::GetFlag(FLAGS_heads_k) > 0 ? absl::GetFlag(FLAGS_heads_k) : spec.num_heads;
  spec.head_dim = absl::GetFlag(FLAGS_head_dim);
  if (spec.batch < 0 || spec.max_seqlen_q < 1 || spec.max_seqlen_k < 1 || spec.num_heads < 1 ||
      spec.num_heads_k < 1 || spec.head_dim < 1) {
    return absl::InvalidArgumentError(
        "--batch must be >= 0 and --seqlen_q, --seqlen_k, --heads, --heads_k, --head_dim >= 1");
  }
  absl::StatusOr<v1::DType> dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return dtype.status();
  spec.dtype = *dtype;
  spec.causal = absl::GetFlag(FLAGS_causal);
  if (absl::GetFlag(FLAGS_window_left) >= 0) spec.window_left = absl::GetFlag(FLAGS_window_left);
  if (absl::GetFlag(FLAGS_window_right) >= 0) spec.window_right = absl::GetFlag(FLAGS_window_right);
  spec.softcap = static_cast<float>(absl::GetFlag(FLAGS_softcap));
  spec.seed = absl::GetFlag(FLAGS_seed);
  return spec;
}

void PrintExecution(const char* rpc, const tools::Problem& p, const v1::Execution& e) {
  std::printf("%s: %lld query tokens in %d sequences, %d heads, head_dim %d, %s\n", rpc,
              static_cast<long long>(p.total_q()), p.spec.batch, p.spec.num_heads,
              p.spec.head_dim, v1::DType_Name(p.spec.dtype).c_str());
  std::printf("  ran on device %s with kernel %s (%s): queue %lld us, compute %lld us, batched "
              "with %d\n",
              e.device().c_str(), e.kernel().c_str(), e.code_path().c_str(),
              static_cast<long long>(e.queue_us()), static_cast<long long>(e.compute_us()),
              e.batched_requests());
}

// Prints one comparison; returns whether it is within tolerance.
bool Report(const char* name, const v1::Tensor& tensor, const std::vector<float>& want,
            double tolerance) {
  absl::StatusOr<std::vector<float>> got = TensorToFloats(tensor);
  if (!got.ok()) {
    std::printf("  %-4s unreadable: %s\n", name, got.status().ToString().c_str());
    return false;
  }
  const tools::ErrorStats stats = tools::Compare(*got, want);
  const bool ok = !stats.mismatched_nonfinite && stats.relative <= tolerance;
  std::printf("  %-4s max |error| %.3e, relative error %.3e (tolerance %.0e) %s\n", name,
              stats.max_abs, stats.relative, tolerance, ok ? "ok" : "FAILED");
  return ok;
}

int RunInfo(Client& client) {
  absl::StatusOr<v1::ServerInfo> info = client.GetServerInfo();
  if (!info.ok()) {
    std::fprintf(stderr, "attnctl: %s\n", info.status().ToString().c_str());
    return 1;
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(*info, &json, options);
  std::printf("%s", json.c_str());
  return 0;
}

void PrintContext(const v1::ForwardResponse& answer) {
  if (answer.context_id().empty()) {
    std::printf("  no context kept (over the server's context budget)\n");
    return;
  }
  std::printf("  kept context %s%s%s\n", answer.context_id().c_str(),
              answer.context_address().empty() ? "" : " on ", answer.context_address().c_str());
}

int RunForward(Client& client, const tools::Problem& problem, bool check) {
  v1::ForwardRequest request = problem.MakeForwardRequest();
  request.set_keep_context(absl::GetFlag(FLAGS_keep_context));
  absl::StatusOr<v1::ForwardResponse> response = client.Forward(request);
  if (!response.ok()) {
    std::fprintf(stderr, "attnctl: Forward failed: %s\n", response.status().ToString().c_str());
    return 1;
  }
  PrintExecution("Forward", problem, response->execution());
  if (request.keep_context()) PrintContext(*response);
  if (!check) return 0;
  const tools::ForwardAnswer want = tools::ReferenceForward(problem);
  const double tol = tools::Tolerance(problem.spec.dtype);
  bool ok = Report("out", response->out(), want.out, tol);
  ok = Report("lse", response->lse(), want.lse, tools::Tolerance(v1::DTYPE_FLOAT32) * 10) && ok;
  return ok ? 0 : 1;
}

int RunBackward(Client& client, const tools::Problem& problem, bool check) {
  // The backward differentiates the exact forward, computed locally.
  const tools::ForwardAnswer forward = tools::ReferenceForward(problem);
  const v1::BackwardRequest request = problem.MakeBackwardRequest(forward.out, forward.lse);
  absl::StatusOr<v1::BackwardResponse> response = client.Backward(request);
  if (!response.ok()) {
    std::fprintf(stderr, "attnctl: Backward failed: %s\n", response.status().ToString().c_str());
    return 1;
  }
  PrintExecution("Backward", problem, response->execution());
  if (!check) return 0;
  // Compare against the reference fed exactly what the server got (out rounded to dtype).
  const std::vector<float> sent_out = *TensorToFloats(request.out());
  const tools::BackwardAnswer want = tools::ReferenceBackward(problem, sent_out, forward.lse);
  const double tol = tools::Tolerance(problem.spec.dtype);
  bool ok = Report("dq", response->dq(), want.dq, tol);
  ok = Report("dk", response->dk(), want.dk, tol) && ok;
  ok = Report("dv", response->dv(), want.dv, tol) && ok;
  return ok ? 0 : 1;
}

int RunBackwardOnContext(Client& client, const tools::Problem& problem, bool check) {
  v1::ForwardRequest forward = problem.MakeForwardRequest();
  forward.set_keep_context(true);
  absl::StatusOr<v1::ForwardResponse> answer = client.Forward(forward);
  if (!answer.ok()) {
    std::fprintf(stderr, "attnctl: Forward failed: %s\n", answer.status().ToString().c_str());
    return 1;
  }
  PrintExecution("Forward", problem, answer->execution());
  PrintContext(*answer);
  const std::vector<int64_t> shape(forward.q().shape().begin(), forward.q().shape().end());
  absl::StatusOr<v1::Tensor> dout = MakeTensor(problem.spec.dtype, shape, problem.dout);
  if (!dout.ok()) {
    std::fprintf(stderr, "attnctl: %s\n", dout.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<v1::BackwardResponse> response = client.BackwardOnContext(forward, *answer, *dout);
  if (!response.ok()) {
    std::fprintf(stderr, "attnctl: Backward failed: %s\n", response.status().ToString().c_str());
    return 1;
  }
  PrintExecution("Backward", problem, response->execution());
  if (!check) return 0;
  // The reference differentiates the forward the server answered (out in its dtype).
  const tools::BackwardAnswer want = tools::ReferenceBackward(
      problem, *TensorToFloats(answer->out()), *TensorToFloats(answer->lse()));
  const double tol = tools::Tolerance(problem.spec.dtype);
  bool ok = Report("dq", response->dq(), want.dq, tol);
  ok = Report("dk", response->dk(), want.dk, tol) && ok;
  ok = Report("dv", response->dv(), want.dv, tol) && ok;
  return ok ? 0 : 1;
}

}  // namespace

// --transport, --data_connections and --shared_memory into `options`.
absl::Status ApplyTransportFlags(ClientOptions& options) {
  absl::StatusOr<tools::Transport> choice = tools::ParseTransport(absl::GetFlag(FLAGS_transport));
  if (!choice.ok()) return choice.status();
  absl::StatusOr<SharedMemory> shared_memory =
      tools::ParseSharedMemory(absl::GetFlag(FLAGS_shared_memory));
  if (!shared_memory.ok()) return shared_memory.status();
  options.shared_memory = *shared_memory;
  if (absl::GetFlag(FLAGS_data_connections) < 1) {
    return absl::InvalidArgumentError("--data_connections must be >= 1");
  }
  options.transport = *choice;
  options.data_connections = absl::GetFlag(FLAGS_data_connections);
  return absl::OkStatus();
}

}  // namespace attnserve

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("attnctl info | forward [--check] | backward [--check] [flags]");
  // --help lists this file's flags and the shared TLS and token flags.
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "attnctl.cc") || absl::StrContains(file, "security_flags.cc");
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr, "usage: attnctl info | forward [--check] | backward [--check]\n");
    return 2;
  }
  const std::string command = args[1];
  attnserve::ClientOptions options;
  if (absl::GetFlag(FLAGS_timeout_ms) > 0) {
    options.timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  }
  for (absl::Status s : {attnserve::tools::ApplySecurityFlags(options),
                         attnserve::ApplyTransportFlags(options)}) {
    if (!s.ok()) {
      std::fprintf(stderr, "attnctl: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  auto client = attnserve::Client::Create(absl::GetFlag(FLAGS_target), options);
  if (!client.ok()) {
    std::fprintf(stderr, "attnctl: %s\n", client.status().ToString().c_str());
    return 2;
  }
  if (command == "info") return attnserve::RunInfo(**client);
  if (command != "forward" && command != "backward") {
    std::fprintf(stderr, "attnctl: unknown command '%s'\n", command.c_str());
    return 2;
  }
  absl::StatusOr<attnserve::tools::ProblemSpec> spec = attnserve::SpecFromFlags();
  if (!spec.ok()) {
    std::fprintf(stderr, "attnctl: %s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  const attnserve::tools::Problem problem = attnserve::tools::MakeRandomProblem(*spec);
  // Decided before the call, so a transport the server cannot offer fails clearly here.
  absl::StatusOr<std::string> transport = (*client)->ActiveTransport();
  if (!transport.ok()) {
    std::fprintf(stderr, "attnctl: %s\n", std::string(transport.status().message()).c_str());
    return 2;
  }
  std::printf("transport: %s\n", transport->c_str());
  const bool check = absl::GetFlag(FLAGS_check);
  if (command == "forward") return attnserve::RunForward(**client, problem, check);
  return absl::GetFlag(FLAGS_keep_context) ? attnserve::RunBackwardOnContext(**client, problem, check)
                                           : attnserve::RunBackward(**client, problem, check);
}

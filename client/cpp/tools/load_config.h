// attnload's configuration and the parsers of its textual specs (shapes, sequence-length
// files, sweep levels). Everything here returns errors that name the offending flag or line,
// so bad input ends in a message, never a crash.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "attnserve/client.h"
#include "attnserve/v1/attention.pb.h"
#include "tools/transport_choice.h"

namespace attnserve::load {

struct IntRange {
  int min = 1, max = 1;
};

// --shape: "fixed:batch=4,seqlen=512" or "uniform:seqlen=128-2048,batch=1-8". `seqlen` sets
// query and key lengths alike; `seqlen_q` / `seqlen_k` set one side. A uniform spec draws the
// batch size per request and every sequence's length independently.
struct ShapeSpec {
  bool uniform = false;
  IntRange batch;
  IntRange seqlen_q{1024, 1024};
  IntRange seqlen_k{1024, 1024};
  // When false, each key length equals its query length (self-attention).
  bool separate_k = false;
};
absl::StatusOr<ShapeSpec> ParseShapeSpec(absl::string_view text);

// One request's sequence lengths.
struct SequenceLengths {
  std::vector<int32_t> q, k;
};

// A sequence-length file: one request per line, lengths separated by commas or spaces, each
// `n` (query and key) or `q:k`; blank lines and `#` comments are skipped.
absl::StatusOr<std::vector<SequenceLengths>> ParseSeqlensText(absl::string_view text);
absl::StatusOr<std::vector<SequenceLengths>> ReadSeqlensFile(const std::string& path);

// --sweep: comma-separated positive concurrency levels.
absl::StatusOr<std::vector<int>> ParseSweepLevels(absl::string_view text);

absl::StatusOr<v1::DType> ParseDType(absl::string_view name);
absl::string_view DTypeShortName(v1::DType dtype);

enum class RpcMix { kForward, kBackward, kMixed };
absl::StatusOr<RpcMix> ParseRpcMix(absl::string_view name);
absl::string_view RpcMixName(RpcMix rpc);

enum class Arrival { kConstant, kPoisson };
absl::StatusOr<Arrival> ParseArrival(absl::string_view name);
absl::string_view ArrivalName(Arrival arrival);

struct LoadConfig {
  std::string target = "localhost:8001";
  TlsOptions tls;
  std::string bearer_token;  // never printed
  int connections = 1;
  tools::Transport transport = tools::Transport::kAuto;
  int data_connections = 4;  // of the data channel session, when it is the transport
  // Not kOff: calls go through the Clients (ClientOptions::shared_memory), which take shared
  // memory when they can and gRPC otherwise (kAuto).
  tools::SharedMemory shared_memory = tools::SharedMemory::kOff;
  // Closed loop: this many calls always in flight. Ignored when rate > 0 (open loop).
  int concurrency = 1;
  double rate = 0;
  Arrival arrival = Arrival::kConstant;
  absl::Duration duration = absl::Seconds(10);
  int64_t requests = 0;  // > 0: stop after this many measured requests instead of duration
  absl::Duration warmup = absl::Seconds(2);
  absl::Duration timeout = absl::Seconds(60);
  int max_inflight = 1024;  // open loop: sends wait (and count their wait) beyond this

  ShapeSpec shape;
  std::vector<SequenceLengths> seqlens;  // from --seqlens_file; replaces `shape` when set
  int heads = 16, heads_k = 16, head_dim = 128;
  v1::DType dtype = v1::DTYPE_BFLOAT16;
  bool causal = false;
  RpcMix rpc = RpcMix::kForward;
  double backward_fraction = 0.5;  // for kMixed
  // kBackward: each call is a Forward keeping its context, then the backward on it (dout only).
  bool keep_context = false;
  int pool_size = 16;
  uint64_t seed = 1;

  int check_every = 0;  // 0 = off
  double max_error_rate = 1.0;
  std::vector<int> sweep;  // concurrency levels; empty = one run
  std::string sweep_prefix = "attnload_sweep";
  std::string gnuplot = "gnuplot";
  std::string output_json, output_csv;
  bool progress = true;
  // > 0: after the runs, move this many bytes over a loopback TCP peer (1 and N connections)
  // and state the payload rate as a multiple of it.
  int64_t raw_socket_peer_bytes = 0;
};

// Cross-flag checks (ranges, combinations); the message names the flag.
absl::Status ValidateConfig(const LoadConfig& config);

}  // namespace attnserve::load

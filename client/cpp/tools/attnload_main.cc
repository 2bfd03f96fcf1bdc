// attnload: load tester for attnserve. Sends pre-built Forward/Backward requests over K gRPC
// connections or the data channel (--transport) in a closed loop (--concurrency calls in flight) or an open loop (--rate calls
// per second), and reports throughput, latency percentiles and errors; --sweep measures a
// series of concurrency levels and plots latency against throughput.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tools/load_config.h"
#include "tools/load_report.h"
#include "tools/load_runner.h"
#include "tools/security_flags.h"
#include "tools/sweep_plot.h"

ABSL_FLAG(std::string, target, "localhost:8001", "attnserve gRPC address.");
ABSL_FLAG(int32_t, connections, 1,
          "gRPC connections (channels); calls are spread over them round-robin.");
ABSL_FLAG(std::string, transport, "auto",
          "grpc, data (the bulk data channel the server advertises, with TLS when it has TLS) "
          "or auto (data when the server offers it as protected as the gRPC channel: TLS on "
          "both or neither; else grpc).");
ABSL_FLAG(std::string, shared_memory, "off",
          "off, auto (POSIX shared memory when the server is on this host and started with "
          "--allow_shared_memory, else --transport) or on (shared memory or an error): calls "
          "then go through the client library (attnserve::Client) on --connections clients.");
ABSL_FLAG(int32_t, data_connections, 4,
          "Data channel: TCP connections of the one session all calls share.");
ABSL_FLAG(int32_t, concurrency, 1, "Closed loop: calls kept in flight.");
ABSL_FLAG(double, rate, 0,
          "Open loop: calls started per second, whatever the latency (0 = closed loop). "
          "Latency counts from each call's scheduled start.");
ABSL_FLAG(std::string, arrival, "constant",
          "Open loop arrivals: constant (evenly spaced) or poisson (exponential gaps).");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(10),
          "Measured time, after warmup (e.g. 10s, 500ms).");
ABSL_FLAG(int64_t, requests, 0, "Measure this many requests instead of --duration (0 = off).");
ABSL_FLAG(absl::Duration, warmup, absl::Seconds(2),
          "Load sent first and not counted (connections, caches, GPU clocks warm up).");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(60), "Deadline of each call.");
ABSL_FLAG(int32_t, max_inflight, 1024,
          "Open loop: most calls in flight; a send past it waits, and the wait counts in its "
          "latency.");
ABSL_FLAG(std::string, shape, "fixed:batch=1,seqlen=1024",
          "Request shapes: fixed:batch=B,seqlen=S or uniform:batch=B1-B2,seqlen=S1-S2 "
          "(per request batch and per sequence length drawn uniformly); seqlen_q= and "
          "seqlen_k= set the sides apart.");
ABSL_FLAG(std::string, seqlens_file, "",
          "Real workload shapes instead of --shape: one request per line, sequence lengths "
          "separated by commas or spaces, each N or Q:K; '#' starts a comment.");
ABSL_FLAG(int32_t, heads, 16, "Query heads.");
ABSL_FLAG(int32_t, heads_k, 0, "Key/value heads (0 = --heads; fewer for GQA/MQA).");
ABSL_FLAG(int32_t, head_dim, 128, "Head dimension.");
ABSL_FLAG(std::string, dtype, "bf16", "fp16, bf16 or fp32.");
ABSL_FLAG(bool, causal, false, "Causal masking (bottom-right aligned).");
ABSL_FLAG(std::string, rpc, "forward", "forward, backward or mixed.");
ABSL_FLAG(double, backward_fraction, 0.5, "--rpc=mixed: share of Backward calls.");
ABSL_FLAG(bool, keep_context, false,
          "--rpc=backward: each call is a training step, a Forward that keeps its context and "
          "then the Backward on it that sends only dout (in full if the context is gone).");
ABSL_FLAG(int32_t, pool_size, 16,
          "Distinct requests pre-built and cycled through (a --seqlens_file longer than this "
          "is sampled evenly).");
ABSL_FLAG(uint64_t, seed, 1, "Random seed for shapes, tensors and arrivals.");
ABSL_FLAG(int32_t, check, 0,
          "Verify every K-th successful response against the local exact reference "
          "(0 = off); a mismatch counts as an error (MISMATCH).");
ABSL_FLAG(double, max_error_rate, 1.0,
          "Exit with status 2 when errors / requests exceeds this (errors include "
          "mismatches).");
ABSL_FLAG(std::string, sweep, "",
          "Concurrency sweep, e.g. 1,2,4,8,16: one closed-loop run per level (each with "
          "--warmup and --duration/--requests); writes PREFIX.md, PREFIX.csv, PREFIX.gp and "
          "PREFIX.png (latency p50/p99 against throughput, drawn with gnuplot).");
ABSL_FLAG(std::string, sweep_prefix, "attnload_sweep", "Path prefix of the sweep's files.");
ABSL_FLAG(std::string, gnuplot, "gnuplot", "gnuplot binary that draws the sweep's PNG.");
ABSL_FLAG(std::string, output_json, "", "Also write the results as JSON to this file.");
ABSL_FLAG(std::string, output_csv, "", "Also write the results as CSV to this file.");
ABSL_FLAG(bool, progress, true, "Print progress to stderr once a second.");
ABSL_FLAG(int64_t, raw_socket_peer_bytes, 0,
          "After the runs, move this many bytes one way over loopback TCP between two threads "
          "(on 1 connection and on --data_connections or --connections) and state each run's "
          "payload rate as a multiple of it (0 = off).");

namespace attnserve::load {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;  // bad flags, unreachable server, unwritable output
constexpr int kExitTooManyErrors = 2;

constexpr char kUsage[] =
    "load tester for attnserve.\n"
    "\n"
    "  attnload --target=HOST:8001 --concurrency=8 --duration=30s "
    "--shape=fixed:batch=4,seqlen=512\n"
    "  attnload --rate=200 --arrival=poisson --requests=5000 --rpc=mixed --check=100\n"
    "  attnload --sweep=1,2,4,8,16 --sweep_prefix=results/h100 --seqlens_file=lengths.txt\n"
    "  attnload --target=HOST:8001 --tls_ca_file=ca.pem --token_file=token --duration=30s\n"
    "  attnload --transport=data --shape=fixed:batch=1,seqlen=16384 --causal --requests=10 \\\n"
    "           --raw_socket_peer_bytes=1073741824\n"
    "\n"
    "Requests are built before the load starts (--pool_size of them) and reused, so building\n"
    "tensors never limits the load. Throughput counts every measured completion (req/s) and\n"
    "the successful ones' query tokens and FLOPs (4 * head_dim * heads * visible query-key\n"
    "pairs forward, causal masking counted exactly; 2.5x that backward) and the tensor bytes\n"
    "sent and received (payload GB/s). Latency percentiles\n"
    "are of successful calls. Exit status: 0 ok; 1 bad flags or the run could not be done;\n"
    "2 the error rate exceeded --max_error_rate (or no request succeeded).";

template <typename T>
absl::Status Assign(absl::StatusOr<T> parsed, T& field) {
  if (!parsed.ok()) return parsed.status();
  field = *std::move(parsed);
  return absl::OkStatus();
}

absl::StatusOr<LoadConfig> ConfigFromFlags() {
  LoadConfig c;
  c.target = absl::GetFlag(FLAGS_target);
  ClientOptions security;
  if (absl::Status s = tools::ApplySecurityFlags(security); !s.ok()) return s;
  c.tls = security.tls;
  c.bearer_token = security.bearer_token;
  c.connections = absl::GetFlag(FLAGS_connections);
  c.data_connections = absl::GetFlag(FLAGS_data_connections);
  c.keep_context = absl::GetFlag(FLAGS_keep_context);
  c.raw_socket_peer_bytes = absl::GetFlag(FLAGS_raw_socket_peer_bytes);
  c.concurrency = absl::GetFlag(FLAGS_concurrency);
  c.rate = absl::GetFlag(FLAGS_rate);
  c.duration = absl::GetFlag(FLAGS_duration);
  c.requests = absl::GetFlag(FLAGS_requests);
  c.warmup = absl::GetFlag(FLAGS_warmup);
  c.timeout = absl::GetFlag(FLAGS_timeout);
  c.max_inflight = absl::GetFlag(FLAGS_max_inflight);
  c.heads = absl::GetFlag(FLAGS_heads);
  c.heads_k = absl::GetFlag(FLAGS_heads_k) == 0 ? c.heads : absl::GetFlag(FLAGS_heads_k);
  c.head_dim = absl::GetFlag(FLAGS_head_dim);
  c.causal = absl::GetFlag(FLAGS_causal);
  c.backward_fraction = absl::GetFlag(FLAGS_backward_fraction);
  c.pool_size = absl::GetFlag(FLAGS_pool_size);
  c.seed = absl::GetFlag(FLAGS_seed);
  c.check_every = absl::GetFlag(FLAGS_check);
  c.max_error_rate = absl::GetFlag(FLAGS_max_error_rate);
  c.sweep_prefix = absl::GetFlag(FLAGS_sweep_prefix);
  c.gnuplot = absl::GetFlag(FLAGS_gnuplot);
  c.output_json = absl::GetFlag(FLAGS_output_json);
  c.output_csv = absl::GetFlag(FLAGS_output_csv);
  c.progress = absl::GetFlag(FLAGS_progress);
  for (absl::Status s : {Assign(ParseArrival(absl::GetFlag(FLAGS_arrival)), c.arrival),
                         Assign(ParseShapeSpec(absl::GetFlag(FLAGS_shape)), c.shape),
                         Assign(ParseDType(absl::GetFlag(FLAGS_dtype)), c.dtype),
                         Assign(ParseRpcMix(absl::GetFlag(FLAGS_rpc)), c.rpc),
                         Assign(tools::ParseTransport(absl::GetFlag(FLAGS_transport)),
                                c.transport),
                         Assign(tools::ParseSharedMemory(absl::GetFlag(FLAGS_shared_memory)),
                                c.shared_memory)}) {
    if (!s.ok()) return s;
  }
  if (!absl::GetFlag(FLAGS_sweep).empty()) {
    if (absl::Status s = Assign(ParseSweepLevels(absl::GetFlag(FLAGS_sweep)), c.sweep); !s.ok()) {
      return s;
    }
  }
  if (!absl::GetFlag(FLAGS_seqlens_file).empty()) {
    if (absl::Status s = Assign(ReadSeqlensFile(absl::GetFlag(FLAGS_seqlens_file)), c.seqlens);
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = ValidateConfig(c); !s.ok()) return s;
  return c;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "attnload: %s\n", std::string(status.message()).c_str());
  return kExitFailed;
}

// Sweep files: the markdown table and CSV, then the plot.
absl::Status WriteSweep(const LoadConfig& config, const std::vector<RunResult>& runs) {
  const std::string& prefix = config.sweep_prefix;
  std::printf("\n%s", RunsToMarkdown(runs).c_str());
  for (absl::Status s : {WriteTextFile(prefix + ".md", RunsToMarkdown(runs)),
                         WriteTextFile(prefix + ".csv", RunsToCsv(runs)),
                         DrawSweepPlot(runs, config.gnuplot, prefix + ".gp", prefix + ".png")}) {
    if (!s.ok()) return s;
  }
  std::printf("sweep written to %s.md, %s.csv and %s.png\n", prefix.c_str(), prefix.c_str(),
              prefix.c_str());
  return absl::OkStatus();
}

// The raw socket on 1 connection and on as many as the transport used.
absl::StatusOr<RawSocketResult> MeasureRawPeer(const LoadConfig& config,
                                               const LoadTransport& transport) {
  RawSocketResult raw;
  raw.bytes = config.raw_socket_peer_bytes;
  raw.connections = transport.Name() == "data" ? config.data_connections : config.connections;
  absl::StatusOr<double> one = MeasureRawSocket(raw.bytes, 1);
  if (!one.ok()) return one.status();
  absl::StatusOr<double> many = MeasureRawSocket(raw.bytes, raw.connections);
  if (!many.ok()) return many.status();
  raw.gbps_one = *one;
  raw.gbps_many = *many;
  return raw;
}

int Main() {
  absl::StatusOr<LoadConfig> config = ConfigFromFlags();
  if (!config.ok()) return Fail(config.status());
  if (config->progress) std::fprintf(stderr, "attnload: connecting and building requests\n");
  absl::StatusOr<std::unique_ptr<LoadRunner>> runner = LoadRunner::Create(*config);
  if (!runner.ok()) return Fail(runner.status());
  std::printf("%s", DescribeLoad(*config, (*runner)->pool(), (*runner)->server_info(),
                                 (*runner)->transport().Describe())
                        .c_str());
  std::fflush(stdout);

  std::vector<int> levels = config->sweep;
  if (levels.empty()) levels.push_back(config->concurrency);
  std::vector<RunResult> runs;
  for (int level : levels) {
    runs.push_back((*runner)->Run(level));
    std::printf("%s", FormatRun(runs.back()).c_str());
    std::fflush(stdout);
  }

  std::optional<RawSocketResult> raw;
  if (config->raw_socket_peer_bytes > 0) {
    absl::StatusOr<RawSocketResult> measured = MeasureRawPeer(*config, (*runner)->transport());
    if (!measured.ok()) return Fail(measured.status());
    raw = *measured;
    std::printf("%s", FormatRawSocket(*raw, runs).c_str());
    std::fflush(stdout);
  }

  if (!config->sweep.empty()) {
    if (absl::Status s = WriteSweep(*config, runs); !s.ok()) return Fail(s);
  }
  if (!config->output_json.empty()) {
    if (absl::Status s = WriteTextFile(config->output_json, RunsToJson(*config, runs, raw)); !s.ok()) {
      return Fail(s);
    }
  }
  if (!config->output_csv.empty()) {
    if (absl::Status s = WriteTextFile(config->output_csv, RunsToCsv(runs)); !s.ok()) {
      return Fail(s);
    }
  }

  int64_t requests = 0, errors = 0;
  for (const RunResult& run : runs) {
    requests += run.requests;
    errors += run.errors;
  }
  if (requests == 0 || errors == requests) {
    std::fprintf(
        stderr, "attnload: FAILED: %s\n",
        requests == 0 ? "no request completed in the measured time" : "no request succeeded");
    return kExitTooManyErrors;
  }
  const double error_rate = static_cast<double>(errors) / requests;
  if (error_rate > config->max_error_rate) {
    std::fprintf(stderr,
                 "attnload: FAILED: error rate %.4f (%lld of %lld requests) exceeds "
                 "--max_error_rate=%g\n",
                 error_rate, static_cast<long long>(errors), static_cast<long long>(requests),
                 config->max_error_rate);
    return kExitTooManyErrors;
  }
  return kExitOk;
}

}  // namespace
}  // namespace attnserve::load

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(attnserve::load::kUsage);
  // --help lists the flags of this file; absl's default filter looks for a file named after
  // the program (attnload.cc), which this is not.
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "attnload_main.cc") ||
           absl::StrContains(file, "security_flags.cc");
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::fprintf(stderr, "attnload: unexpected argument '%s' (flags only; see --help)\n",
                 positional[1]);
    return attnserve::load::kExitFailed;
  }
  return attnserve::load::Main();
}

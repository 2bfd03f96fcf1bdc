// attnserve: the attention compute server. Flags are listed by --help.
#include <signal.h>

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/main/allocator_config.h"
#include "server/main/descriptor_limit.h"
#include "server/main/server_app.h"
#ifdef ATTN_WITH_CUDA
#include "server/devices/cuda_devices.h"
#endif

ABSL_FLAG(std::string, host, "0.0.0.0", "Address both ports listen on.");
ABSL_FLAG(int32_t, grpc_port, 8001, "gRPC port (0 picks a free one).");
ABSL_FLAG(int32_t, http_port, 8000,
          "HTTP port for /healthz, /readyz, /metrics, /v1/info and the Open Inference "
          "Protocol's REST API (/v2).");
ABSL_FLAG(std::string, devices, "auto",
          "auto (all GPUs, else the CPU), cpu, or CUDA ordinals like 0,1.");
ABSL_FLAG(std::string, emulate_compute_capability, "",
          "Make every GPU route (and run kernel code paths) as this older compute capability, "
          "e.g. 7.5 to serve as a Turing GPU would; for tests. Empty: the GPUs' own.");
ABSL_FLAG(std::string, kernel, "",
          "Force one kernel family for every request (flash, fallback, cublas, reference); "
          "requests it cannot run fail with FAILED_PRECONDITION. For tests. Empty: route by "
          "device and request.");
ABSL_FLAG(int64_t, max_message_bytes, int64_t{1} << 30,
          "Largest gRPC message accepted or sent, in bytes (at most 2147483647).");
ABSL_FLAG(int64_t, max_total_tokens, int64_t{1} << 20,
          "Most query (and, separately, key) tokens in one request.");
ABSL_FLAG(int32_t, max_head_dim, 256, "Largest head_dim accepted.");
ABSL_FLAG(int32_t, max_num_heads, 1024, "Most query heads in one request.");
ABSL_FLAG(int32_t, max_batch, 65536, "Most sequences in one request.");
ABSL_FLAG(double, max_request_compute_seconds, 30,
          "Longest a request may be estimated to run on the device it would run on (its FLOPs, "
          "attention scores and transfers over that device's rates); longer ones are refused "
          "with RESOURCE_EXHAUSTED. 0 = no limit.");
ABSL_FLAG(double, max_launch_seconds, 0.25,
          "On a GPU, a request (or batch) estimated to run longer than this runs as several "
          "launches of about this long each (groups of whole sequences; a forward's sequence "
          "too long for one, blocks of its query rows), and stops between them once its "
          "deadline passed (DEADLINE_EXCEEDED) or its caller cancelled (CANCELLED): how long a "
          "stopped request may still hold its GPU. A backward's single sequence is never cut "
          "(--max_request_compute_seconds bounds it). 0 = one launch always.");
ABSL_FLAG(int32_t, cpu_threads, 0, "Threads of the CPU reference kernels (0 = all cores).");
ABSL_FLAG(int32_t, http_threads, 32,
          "HTTP worker threads. Each connection holds one until its request has arrived (at "
          "most --http_request_timeout_ms), so silent connections can take them all and fail "
          "the liveness probe: keep this well above the probes' and scrapers' concurrency.");
ABSL_FLAG(bool, batching, false,
          "Merge concurrent compatible requests into one kernel launch (off by default: on the "
          "H100 it lowered throughput, see bench/RESULTS.md).");
ABSL_FLAG(int64_t, max_batch_tokens, 65536,
          "Most query (and, separately, key) tokens one batched launch may carry.");
ABSL_FLAG(int64_t, max_queue_delay_us, 0,
          "How long the oldest queued request may wait for batch company, in microseconds.");
ABSL_FLAG(int64_t, max_queue_size, 1024,
          "Requests a device may hold waiting (those waiting for memory included); more are "
          "refused with RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, device_memory_bytes, 0,
          "Bytes of each device's memory running requests may hold at once (0 = the device's "
          "total). A request that fits but not beside the running ones waits in the queue.");
ABSL_FLAG(int64_t, context_memory_bytes, 0,
          "Bytes of saved contexts (keep_context forwards) each device may hold; the least "
          "recently used are evicted to make room. 0 = a quarter of the device's memory budget.");
ABSL_FLAG(int32_t, context_ttl_seconds, 300,
          "A saved context unused this long is freed (its backward then gets NOT_FOUND and the "
          "client resends in full).");
ABSL_FLAG(bool, transport_ceiling, false,
          "Benchmarks only: answer every valid request at once with zero-filled outputs, "
          "computing nothing, to measure what the transports alone sustain.");
ABSL_FLAG(std::string, advertise_address, "",
          "This replica's own gRPC address (host:port) as clients reach it, returned with kept "
          "contexts (ForwardResponse.context_address) and in ServerInfo.address so clients "
          "balancing over several replicas send a context's backward here. In Kubernetes: the "
          "pod IP and the gRPC port (the Helm chart sets it). Empty: not advertised.");
ABSL_FLAG(int64_t, priority_aging_ms, 500,
          "Waiting this long lifts a queued request one priority level (x-attnserve-priority: "
          "high, normal, low), so low priority never starves.");
ABSL_FLAG(int32_t, cpu_lanes, 1,
          "Requests the CPU device runs at once, each with --cpu_threads threads.");
ABSL_FLAG(int32_t, cuda_lanes, 2,
          "Requests each GPU runs at once, each on its own stream and pinned staging buffer.");
ABSL_FLAG(int64_t, pinned_host_cache_bytes, -1,
          "GPU hosts: bytes of page-locked receive buffers kept for reuse after their requests, "
          "so steady traffic pins no new memory (-1: twice --data_max_buffered_bytes, at most "
          "a quarter of the host's memory).");
ABSL_FLAG(double, device_reset_interval_seconds, 1.0,
          "After a device fault (a sticky CUDA error) the device is out of service until a "
          "reset of its context succeeds: tried at once, then again after this, doubling up to "
          "60 s.");
ABSL_FLAG(std::string, inject_device_fault, "",
          "TEST ONLY: DEVICE@LAUNCH[+EVERY][/FAILED_RESETS],... makes that launch on the device "
          "(and every EVERY launches after it) fail as a device fault (a trapped kernel on a "
          "GPU) and that many resets after the first fail, e.g. cpu@3, cuda:0@5/1 or "
          "cuda:0@50+400.");
ABSL_FLAG(int32_t, stage_threads_per_lane, 4,
          "Threads per GPU lane that copy a request's inputs of 8 MB and more into pinned "
          "memory (1: the lane's own thread alone).");
ABSL_FLAG(int32_t, answer_threads_per_lane, 1,
          "Threads per lane that encode and send answers, so lanes start their next launch at "
          "once; a batched launch hands all of its answers over together.");
ABSL_FLAG(int32_t, grpc_max_connection_age_seconds, 0,
          "Close client connections gracefully after this many seconds so clients re-resolve "
          "and spread over new replicas (0 = never).");
ABSL_FLAG(int64_t, max_concurrent_requests, 256,
          "Forward/Backward calls served at once over all connections; more are refused at "
          "once with RESOURCE_EXHAUSTED (0 = unlimited).");
ABSL_FLAG(int32_t, max_concurrent_streams_per_connection, 100,
          "Calls one client connection may have open at once (HTTP/2 streams); more wait on "
          "the client side.");
ABSL_FLAG(int32_t, max_deadline_seconds, 600,
          "Longest a call may wait for its turn: longer client deadlines are shortened to "
          "this and calls without a deadline get it (0 = no cap).");
ABSL_FLAG(int32_t, grpc_answer_timeout_seconds, 60,
          "A computed gRPC answer must be taken by the client within this many seconds, else "
          "the call is cancelled; until then it counts against --max_concurrent_requests, so "
          "clients that never read cannot hold memory without bound (0 = no limit).");
ABSL_FLAG(int32_t, keepalive_time_seconds, 60,
          "How often the server pings each gRPC connection to detect dead clients.");
ABSL_FLAG(int32_t, keepalive_timeout_seconds, 20,
          "How long a keepalive ping may go unanswered before the connection is closed.");
ABSL_FLAG(int32_t, keepalive_min_client_ping_interval_seconds, 10,
          "Client pings closer together than this are abusive; after two such strikes the "
          "connection is closed with GOAWAY too_many_pings.");
ABSL_FLAG(bool, keepalive_permit_without_calls, false,
          "Allow keepalive pings on connections with no call in progress (both directions).");
ABSL_FLAG(int32_t, http_request_timeout_ms, 2000,
          "HTTP connections that take longer to send their request or read the reply are "
          "closed.");
ABSL_FLAG(int32_t, http_max_request_bytes, 8192,
          "Largest HTTP request head (request line and headers) accepted.");
ABSL_FLAG(int64_t, http_max_json_bytes, int64_t{16} << 20,
          "Largest JSON part of an Open Inference Protocol REST inference body (/v2); its parsed "
          "form takes many times its size, so large tensors go in the binary part.");
ABSL_FLAG(int32_t, drain_timeout_seconds, 30,
          "On SIGTERM/SIGINT, how long accepted requests may take to finish.");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM server certificate (then any intermediates): serve TLS on both ports. Needs "
          "--tls_key_file.");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file (unencrypted).");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA certificates: require client certificates signed by one of them (mTLS) on "
          "both ports.");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "File of accepted bearer tokens, one per line ('#' comments and blank lines "
          "skipped): every AttentionService call and /v1/info must send 'authorization: Bearer "
          "<token>'. Re-read when it changes (checked every second) and on SIGHUP; a file that "
          "is deleted or cannot be read or parsed revokes every token until it is fixed.");
ABSL_FLAG(bool, auth_open_health_and_metrics, true,
          "With --auth_tokens_file: leave grpc.health.v1, /healthz, /readyz and /metrics open "
          "to callers without a token (false: they need one too).");
ABSL_FLAG(bool, allow_shared_memory, false,
          "Let Open Inference Protocol clients register system shared memory regions (Triton's "
          "extension) and pass tensors through them; off, since a client then makes the server "
          "map memory it names.");
ABSL_FLAG(int32_t, shared_memory_idle_seconds, 600,
          "A registered shared memory region unused this long is unregistered and unmapped.");
ABSL_FLAG(int32_t, data_port, 8002,
          "Port of the bulk data path (raw TCP, tensors by offset over several connections; "
          "proto/attnserve/v1/data_channel.proto) on --host; 0 = off. TLS and mTLS as on the "
          "gRPC port. A port that cannot be bound leaves it off (logged; clients then use "
          "gRPC).");
ABSL_FLAG(int32_t, data_max_connections, 256, "Data path connections open at once.");
ABSL_FLAG(int32_t, data_max_connections_per_session, 16,
          "Data path connections one session (client) may open.");
ABSL_FLAG(int32_t, data_max_requests_per_session, 64,
          "Data path requests one session may have in progress at once.");
ABSL_FLAG(int64_t, data_max_chunk_bytes, int64_t{16} << 20,
          "Largest CHUNK frame on the data path, in bytes.");
ABSL_FLAG(int64_t, data_max_buffered_bytes, int64_t{8} << 30,
          "Request payload bytes the data path buffers at once over all sessions; requests "
          "past it are refused with RESOURCE_EXHAUSTED.");
ABSL_FLAG(int32_t, data_transfer_timeout_seconds, 60,
          "A data path request's payload must arrive within this many seconds of its "
          "REQUEST; a frame that stalls, or a response the client does not read, this long "
          "closes the connection.");

namespace {

#ifdef ATTN_WITH_CUDA
const attnserve::devices::GpuLister kListGpus = attnserve::devices::ListCudaDevices;
#else
const attnserve::devices::GpuLister kListGpus = attnserve::devices::ListNoGpus;
#endif

// --pinned_host_cache_bytes=-1: room to keep every buffer of a full --data_max_buffered_bytes
// of requests twice over (their sizes vary, and a cached buffer serves a request of at most a
// quarter less). With 4 GiB, two GPUs under 16 clients of 0.3-0.7 GB requests pinned and
// freed buffers all the time, and the driver calls on the receiving threads held up the first
// GPU's lanes (GPUs 65% and 71% busy, against 93% with 16 GiB: bench/RESULTS.md).
size_t PinnedHostCacheBytes(int64_t flag, int64_t max_buffered_bytes) {
  if (flag >= 0) return static_cast<size_t>(flag);
  const int64_t quarter_of_host = sysconf(_SC_PAGESIZE) * sysconf(_SC_PHYS_PAGES) / 4;
  return static_cast<size_t>(
      std::max<int64_t>(0, std::min(2 * max_buffered_bytes, quarter_of_host)));
}

// Checks flag values so a typo fails at startup with the flag's name, not later.
absl::StatusOr<attnserve::ServerConfig> ConfigFromFlags() {
  attnserve::ServerConfig config;
  config.host = absl::GetFlag(FLAGS_host);
  config.grpc_port = absl::GetFlag(FLAGS_grpc_port);
  config.http_port = absl::GetFlag(FLAGS_http_port);
  config.devices = absl::GetFlag(FLAGS_devices);
  config.emulate_compute_capability = absl::GetFlag(FLAGS_emulate_compute_capability);
  config.engine.forced_kernel_family = absl::GetFlag(FLAGS_kernel);
  if (const std::string& forced = config.engine.forced_kernel_family;
      !forced.empty() && !attnserve::engine::KernelCatalog::Built().Has(forced)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kernel=", forced, ": not a kernel family of this build (built: ",
                     absl::StrJoin(attnserve::engine::KernelCatalog::Built().families, ", "),
                     ")"));
  }
  config.http_threads = absl::GetFlag(FLAGS_http_threads);
  config.drain_timeout = absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_seconds));
  config.max_connection_age =
      absl::Seconds(absl::GetFlag(FLAGS_grpc_max_connection_age_seconds));
  config.call_limits.max_concurrent_requests = absl::GetFlag(FLAGS_max_concurrent_requests);
  const int32_t max_deadline_seconds = absl::GetFlag(FLAGS_max_deadline_seconds);
  config.call_limits.max_deadline = max_deadline_seconds == 0
                                        ? absl::InfiniteDuration()
                                        : absl::Seconds(max_deadline_seconds);
  const int32_t answer_timeout_seconds = absl::GetFlag(FLAGS_grpc_answer_timeout_seconds);
  config.call_limits.answer_send_timeout = answer_timeout_seconds == 0
                                               ? absl::InfiniteDuration()
                                               : absl::Seconds(answer_timeout_seconds);
  config.max_concurrent_streams_per_connection =
      absl::GetFlag(FLAGS_max_concurrent_streams_per_connection);
  config.keepalive_time = absl::Seconds(absl::GetFlag(FLAGS_keepalive_time_seconds));
  config.keepalive_timeout = absl::Seconds(absl::GetFlag(FLAGS_keepalive_timeout_seconds));
  config.keepalive_min_client_ping_interval =
      absl::Seconds(absl::GetFlag(FLAGS_keepalive_min_client_ping_interval_seconds));
  config.keepalive_permit_without_calls = absl::GetFlag(FLAGS_keepalive_permit_without_calls);
  config.http_request_timeout_ms = absl::GetFlag(FLAGS_http_request_timeout_ms);
  config.http_max_request_bytes = absl::GetFlag(FLAGS_http_max_request_bytes);
  config.http_max_json_bytes = absl::GetFlag(FLAGS_http_max_json_bytes);
  config.engine.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  config.engine.batching.enabled = absl::GetFlag(FLAGS_batching);
  config.engine.batching.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  config.engine.batching.max_queue_delay =
      absl::Microseconds(absl::GetFlag(FLAGS_max_queue_delay_us));
  config.engine.max_queue_size = absl::GetFlag(FLAGS_max_queue_size);
  config.engine.device_memory_bytes = absl::GetFlag(FLAGS_device_memory_bytes);
  config.engine.priority_aging = absl::Milliseconds(absl::GetFlag(FLAGS_priority_aging_ms));
  config.engine.contexts.memory_bytes = absl::GetFlag(FLAGS_context_memory_bytes);
  config.engine.contexts.ttl = absl::Seconds(absl::GetFlag(FLAGS_context_ttl_seconds));
  config.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  config.transport_ceiling = absl::GetFlag(FLAGS_transport_ceiling);
  config.engine.cpu_lanes = absl::GetFlag(FLAGS_cpu_lanes);
  config.engine.cuda_lanes = absl::GetFlag(FLAGS_cuda_lanes);
  config.engine.max_launch_seconds = absl::GetFlag(FLAGS_max_launch_seconds);
  if (!(config.engine.max_launch_seconds >= 0 && config.engine.max_launch_seconds <= 3600)) {
    return absl::InvalidArgumentError("--max_launch_seconds is out of range [0, 3600]");
  }
  config.engine.answer_threads_per_lane = absl::GetFlag(FLAGS_answer_threads_per_lane);
  config.engine.stage_threads_per_lane = absl::GetFlag(FLAGS_stage_threads_per_lane);
  config.engine.pinned_host_cache_bytes = PinnedHostCacheBytes(
      absl::GetFlag(FLAGS_pinned_host_cache_bytes), absl::GetFlag(FLAGS_data_max_buffered_bytes));
  config.engine.device_reset_interval =
      absl::Seconds(absl::GetFlag(FLAGS_device_reset_interval_seconds));
  if (config.engine.device_reset_interval < absl::Milliseconds(1) ||
      config.engine.device_reset_interval > absl::Seconds(3600)) {
    return absl::InvalidArgumentError(
        "--device_reset_interval_seconds is out of range [0.001, 3600]");
  }
  absl::StatusOr<std::map<std::string, attnserve::engine::InjectedFault>> injected =
      attnserve::engine::ParseInjectedFaults(absl::GetFlag(FLAGS_inject_device_fault));
  if (!injected.ok()) return injected.status();
  config.engine.injected_faults = *std::move(injected);
  attnserve::engine::Limits& limits = config.engine.limits;
  limits.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  limits.max_total_tokens = absl::GetFlag(FLAGS_max_total_tokens);
  limits.max_head_dim = absl::GetFlag(FLAGS_max_head_dim);
  limits.max_num_heads = absl::GetFlag(FLAGS_max_num_heads);
  limits.max_batch = absl::GetFlag(FLAGS_max_batch);
  limits.max_request_compute_seconds = absl::GetFlag(FLAGS_max_request_compute_seconds);
  if (!(limits.max_request_compute_seconds >= 0 &&
        limits.max_request_compute_seconds <= 86400 * 7)) {
    return absl::InvalidArgumentError(
        "--max_request_compute_seconds is out of range [0, 604800]");
  }
  config.tls.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  config.tls.key_file = absl::GetFlag(FLAGS_tls_key_file);
  config.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  config.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  config.auth_open_health_and_metrics = absl::GetFlag(FLAGS_auth_open_health_and_metrics);
  config.shared_memory.allowed = absl::GetFlag(FLAGS_allow_shared_memory);
  config.shared_memory.idle_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_shared_memory_idle_seconds));
  attnserve::transport::data::DataServerOptions& data = config.data_channel;
  data.host = config.host;
  data.port = absl::GetFlag(FLAGS_data_port);
  data.max_connections = absl::GetFlag(FLAGS_data_max_connections);
  data.max_connections_per_session = absl::GetFlag(FLAGS_data_max_connections_per_session);
  data.max_requests_per_session = absl::GetFlag(FLAGS_data_max_requests_per_session);
  data.max_chunk_bytes = absl::GetFlag(FLAGS_data_max_chunk_bytes);
  data.max_buffered_bytes = absl::GetFlag(FLAGS_data_max_buffered_bytes);
  data.transfer_timeout = absl::Seconds(absl::GetFlag(FLAGS_data_transfer_timeout_seconds));
  data.response_chunk_bytes = std::min(data.response_chunk_bytes, data.max_chunk_bytes);
  if (config.tls.cert_file.empty() != config.tls.key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert_file and --tls_key_file go together");
  }
  if (!config.tls.client_ca_file.empty() && config.tls.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca_file needs TLS: set --tls_cert_file and --tls_key_file too");
  }

  struct Range {
    const char* flag;
    int64_t value, min, max;
  };
  // Upper bounds keep every size product in int64 and every offset in int32.
  const Range ranges[] = {
      {"grpc_port", config.grpc_port, 0, 65535},
      {"http_port", config.http_port, 0, 65535},
      {"data_port", data.port, 0, 65535},
      {"data_max_connections", data.max_connections, 1, 65536},
      {"data_max_connections_per_session", data.max_connections_per_session, 1, 1024},
      {"data_max_requests_per_session", data.max_requests_per_session, 1, 1 << 20},
      // A CHUNK's length is checked against it before any byte is read.
      {"data_max_chunk_bytes", data.max_chunk_bytes, 64 << 10, 1 << 30},
      {"data_max_buffered_bytes", data.max_buffered_bytes, 0, int64_t{1} << 50},
      {"data_transfer_timeout_seconds", absl::GetFlag(FLAGS_data_transfer_timeout_seconds), 1,
       86400},
      {"http_threads", config.http_threads, 1, 1024},
      {"drain_timeout_seconds", absl::GetFlag(FLAGS_drain_timeout_seconds), 0, 86400},
      {"grpc_max_connection_age_seconds", absl::GetFlag(FLAGS_grpc_max_connection_age_seconds), 0,
       86400 * 365},
      {"cpu_threads", config.engine.cpu_threads, 0, 1024},
      {"max_concurrent_requests", config.call_limits.max_concurrent_requests, 0, 1'000'000},
      {"max_concurrent_streams_per_connection", config.max_concurrent_streams_per_connection,
       1, 1'000'000},
      // Millisecond gRPC arguments are ints: every duration stays below 2^31 ms.
      {"max_deadline_seconds", max_deadline_seconds, 0, 86400 * 7},
      {"grpc_answer_timeout_seconds", answer_timeout_seconds, 0, 86400},
      {"keepalive_time_seconds", absl::GetFlag(FLAGS_keepalive_time_seconds), 1, 86400 * 7},
      {"keepalive_timeout_seconds", absl::GetFlag(FLAGS_keepalive_timeout_seconds), 1, 86400},
      {"keepalive_min_client_ping_interval_seconds",
       absl::GetFlag(FLAGS_keepalive_min_client_ping_interval_seconds), 0, 86400 * 7},
      {"http_request_timeout_ms", config.http_request_timeout_ms, 100, 3'600'000},
      {"http_max_request_bytes", config.http_max_request_bytes, 1024, 1 << 20},
      {"http_max_json_bytes", config.http_max_json_bytes, 1024, int64_t{1} << 30},
      {"max_message_bytes", limits.max_message_bytes, 1024, 2147483647},
      {"max_total_tokens", limits.max_total_tokens, 1, 2147483647},
      {"max_head_dim", limits.max_head_dim, 1, 1024},
      {"max_num_heads", limits.max_num_heads, 1, 65536},
      {"max_batch", limits.max_batch, 1, 2147483646},
      {"max_batch_tokens", config.engine.batching.max_batch_tokens, 1, 2147483647},
      {"max_queue_delay_us", absl::GetFlag(FLAGS_max_queue_delay_us), 0, 60'000'000},
      {"max_queue_size", config.engine.max_queue_size, 1, 1'000'000},
      {"device_memory_bytes", config.engine.device_memory_bytes, 0, int64_t{1} << 50},
      {"priority_aging_ms", absl::GetFlag(FLAGS_priority_aging_ms), 1, 3'600'000},
      {"context_memory_bytes", config.engine.contexts.memory_bytes, 0, int64_t{1} << 50},
      {"context_ttl_seconds", absl::GetFlag(FLAGS_context_ttl_seconds), 1, 86400},
      {"cpu_lanes", config.engine.cpu_lanes, 1, 256},
      {"cuda_lanes", config.engine.cuda_lanes, 1, 16},
      {"answer_threads_per_lane", config.engine.answer_threads_per_lane, 1, 16},
      {"stage_threads_per_lane", config.engine.stage_threads_per_lane, 1, 16},
      {"pinned_host_cache_bytes", absl::GetFlag(FLAGS_pinned_host_cache_bytes), -1,
       int64_t{1} << 44},
  };
  for (const Range& r : ranges) {
    if (r.value < r.min || r.value > r.max) {
      return absl::InvalidArgumentError(absl::StrCat("--", r.flag, "=", r.value,
                                                     " is out of range [", r.min, ", ", r.max,
                                                     "]"));
    }
  }
  return config;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "attnserve: serves varlen attention forward and backward over gRPC, with health, "
      "readiness, metrics and server info over HTTP.");
  absl::ParseCommandLine(argc, argv);
  attnserve::ConfigureAllocator();
  const absl::StatusOr<attnserve::DescriptorLimit> descriptors =
      attnserve::RaiseDescriptorLimit();
  absl::StatusOr<attnserve::ServerConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    std::fprintf(stderr, "attnserve: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }

  // Block the shutdown signals (and SIGHUP, which reloads the tokens file) before any thread
  // starts, so only sigwait below sees them.
  sigset_t shutdown_signals;
  sigemptyset(&shutdown_signals);
  sigaddset(&shutdown_signals, SIGTERM);
  sigaddset(&shutdown_signals, SIGINT);
  sigaddset(&shutdown_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &shutdown_signals, nullptr);

  absl::StatusOr<std::unique_ptr<attnserve::ServerApp>> app =
      attnserve::ServerApp::Start(*config, kListGpus);
  if (!app.ok()) {
    std::fprintf(stderr, "attnserve: %s\n", app.status().ToString().c_str());
    return 1;
  }
  std::vector<std::string> device_names;
  for (const auto& device : (*app)->engine().Devices()) {
    device_names.push_back(absl::StrCat(device.name, " (", device.model, ")"));
  }
  std::fprintf(stderr, "attnserve %s: gRPC on %s:%d, HTTP on %s:%d, devices: %s\n",
               ATTNSERVE_VERSION, config->host.c_str(), (*app)->grpc_port(), config->host.c_str(),
               (*app)->http_port(), absl::StrJoin(device_names, ", ").c_str());

  std::fprintf(stderr, "attnserve: %s\n", (*app)->SecuritySummary().c_str());
  std::fprintf(stderr, "attnserve: %s\n", attnserve::DescribeDescriptorLimit(descriptors).c_str());
  std::fprintf(stderr, "attnserve: %s\n", (*app)->DataChannelSummary().c_str());
  if (!config->engine.injected_faults.empty()) {
    std::fprintf(stderr, "attnserve: WARNING: --inject_device_fault=%s: launches will fail on "
                 "purpose (tests only)\n", absl::GetFlag(FLAGS_inject_device_fault).c_str());
  }
  if (config->transport_ceiling) {
    std::fprintf(stderr, "attnserve: WARNING: --transport_ceiling: every answer is zeros, "
                         "nothing is computed (benchmarks only)\n");
  }

  int signal_number = 0;
  while (sigwait(&shutdown_signals, &signal_number) == 0 && signal_number == SIGHUP) {
    (*app)->ReloadTokens();
  }
  std::fprintf(stderr, "attnserve: %s received, draining %lld in-flight requests\n",
               strsignal(signal_number), static_cast<long long>((*app)->engine().InflightCount()));
  (*app)->Shutdown();
  std::fprintf(stderr, "attnserve: stopped\n");
  return 0;
}

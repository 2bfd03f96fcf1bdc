#include "tools/load_report.h"

#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace attnserve::load {
namespace {

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// JSON has no NaN or infinity.
std::string JsonNumber(double value) {
  return std::isfinite(value) ? absl::StrFormat("%.6g", value) : "null";
}

double MeanTokens(const std::vector<WorkItem>& pool) {
  double tokens = 0;
  for (const WorkItem& item : pool) tokens += item.tokens;
  return pool.empty() ? 0 : tokens / pool.size();
}

std::string RangeText(IntRange range) {
  return range.min == range.max ? absl::StrCat(range.min) : absl::StrCat(range.min, "-", range.max);
}

std::string RunLabel(const RunResult& run) {
  if (run.target_rate > 0) {
    return absl::StrFormat("open loop, %g req/s %s arrivals", run.target_rate, run.arrival);
  }
  return absl::StrCat("closed loop, concurrency ", run.concurrency);
}

std::string RunToJson(const RunResult& run) {
  const LatencySummary l = run.latency.Summarize();
  std::vector<std::string> codes;
  for (const auto& [code, count] : run.errors_by_code) {
    codes.push_back(absl::StrCat(JsonString(code), ": ", count));
  }
  std::vector<std::string> messages;
  for (const auto& [code, message] : run.first_error) {
    messages.push_back(absl::StrCat(JsonString(code), ": ", JsonString(message)));
  }
  return absl::StrCat(
      "    {\"transport\": ", JsonString(run.transport), ", \"concurrency\": ", run.concurrency, ", \"target_rate\": ", JsonNumber(run.target_rate),
      ", \"arrival\": ", JsonString(run.arrival),
      ",\n     \"elapsed_s\": ", JsonNumber(run.elapsed_s), ", \"requests\": ", run.requests,
      ", \"ok\": ", run.requests - run.errors, ", \"errors\": ", run.errors,
      ", \"error_rate\": ", JsonNumber(run.error_rate()), ", \"forward\": ", run.forward,
      ", \"backward\": ", run.backward, ", \"checked\": ", run.checked,
      ", \"mismatches\": ", run.mismatches,
      ",\n     \"throughput_rps\": ", JsonNumber(run.throughput()),
      ", \"tokens_per_s\": ", JsonNumber(run.tokens_per_s()),
      ", \"tflops\": ", JsonNumber(run.tflops()), ", \"payload_bytes\": ", run.payload_bytes,
      ", \"payload_gbps\": ", JsonNumber(run.payload_gbps()),
      ",\n     \"latency_ms\": {\"min\": ", JsonNumber(l.min), ", \"mean\": ", JsonNumber(l.mean),
      ", \"p50\": ", JsonNumber(l.p50), ", \"p90\": ", JsonNumber(l.p90),
      ", \"p95\": ", JsonNumber(l.p95), ", \"p99\": ", JsonNumber(l.p99),
      ", \"p999\": ", JsonNumber(l.p999), ", \"max\": ", JsonNumber(l.max), "}",
      ",\n     \"errors_by_code\": {", absl::StrJoin(codes, ", "), "}",
      ",\n     \"first_error\": {", absl::StrJoin(messages, ", "), "}}");
}

}  // namespace

std::string DescribeLoad(const LoadConfig& config, const std::vector<WorkItem>& pool,
                         const v1::ServerInfo& server, const std::string& transport) {
  std::vector<std::string> devices;
  for (const v1::DeviceInfo& device : server.devices()) devices.push_back(device.name());
  const std::string shape =
      config.seqlens.empty() ? absl::StrCat(config.shape.uniform ? "uniform" : "fixed", " batch ",
                                            RangeText(config.shape.batch), ", seqlen_q ",
                                            RangeText(config.shape.seqlen_q), ", seqlen_k ",
                                            RangeText(config.shape.seqlen_k))
                             : absl::StrCat(config.seqlens.size(), " requests from --seqlens_file");
  return absl::StrFormat(
      "attnload: %s %s%s over %s to %s (attnserve %s on %s)\n"
      "  workload: %s; %d heads (%d kv), head_dim %d, %s%s; pool of %d requests, "
      "%.0f query tokens each on average\n",
      RpcMixName(config.rpc),
      config.rpc == RpcMix::kMixed
          ? absl::StrFormat("(%.0f%% backward)", 100 * config.backward_fraction)
          : std::string("calls"),
      config.keep_context ? " (each a forward keeping its context, then dout only)" : "",
      transport, config.target, server.version(), absl::StrJoin(devices, ", "), shape,
      config.heads, config.heads_k, config.head_dim, DTypeShortName(config.dtype),
      config.causal ? ", causal" : "", pool.size(), MeanTokens(pool));
}

std::string FormatRun(const RunResult& run) {
  const LatencySummary l = run.latency.Summarize();
  std::string text = absl::StrFormat(
      "%s: %lld requests in %.2f s (%lld forward, %lld backward), %lld errors (%.2f%%)\n"
      "  throughput  %.1f req/s, %.0f tokens/s, %.4g TFLOP/s\n"
      "  payload     %.4g GB/s over %s (%.4g MB of request and answer tensors per request)\n"
      "  latency ms  min %.3f  mean %.3f  p50 %.3f  p90 %.3f  p95 %.3f  p99 %.3f  "
      "p99.9 %.3f  max %.3f\n",
      RunLabel(run), static_cast<long long>(run.requests), run.elapsed_s,
      static_cast<long long>(run.forward), static_cast<long long>(run.backward),
      static_cast<long long>(run.errors), 100 * run.error_rate(), run.throughput(),
      run.tokens_per_s(), run.tflops(), run.payload_gbps(), run.transport,
      run.requests > run.errors ? run.payload_bytes / 1e6 / (run.requests - run.errors) : 0.0,
      l.min, l.mean, l.p50, l.p90, l.p95, l.p99, l.p999, l.max);
  if (run.checked > 0) {
    absl::StrAppendFormat(
        &text, "  checked     %lld responses against the local reference, %lld mismatched\n",
        static_cast<long long>(run.checked), static_cast<long long>(run.mismatches));
  }
  for (const auto& [code, count] : run.errors_by_code) {
    absl::StrAppendFormat(&text, "  error       %s x%lld, first: %s\n", code,
                          static_cast<long long>(count), run.first_error.at(code));
  }
  return text;
}

std::string FormatRawSocket(const RawSocketResult& raw, const std::vector<RunResult>& runs) {
  std::string text = absl::StrFormat(
      "raw socket (loopback TCP, %.4g MB one way): %.4g GB/s on 1 connection, %.4g GB/s on %d\n",
      raw.bytes / 1e6, raw.gbps_one, raw.gbps_many, raw.connections);
  for (const RunResult& run : runs) {
    if (raw.gbps_one <= 0 || raw.gbps_many <= 0) break;
    absl::StrAppendFormat(&text,
                          "  %s: payload %.4g GB/s = %.2fx raw socket (1 connection), %.2fx "
                          "(%d connections)\n",
                          RunLabel(run), run.payload_gbps(), run.payload_gbps() / raw.gbps_one,
                          run.payload_gbps() / raw.gbps_many, raw.connections);
  }
  return text;
}

std::string RunsToJson(const LoadConfig& config, const std::vector<RunResult>& runs,
                       const std::optional<RawSocketResult>& raw) {
  std::vector<std::string> run_objects;
  for (const RunResult& run : runs) run_objects.push_back(RunToJson(run));
  return absl::StrCat(
      "{\"target\": ", JsonString(config.target),
      ", \"rpc\": ", JsonString(std::string(RpcMixName(config.rpc))),
      ", \"connections\": ", config.connections,
      ", \"transport\": ", JsonString(runs.empty() ? "" : runs.front().transport),
      ", \"data_connections\": ", config.data_connections,
      ", \"keep_context\": ", config.keep_context ? "true" : "false",
      ", \"mode\": ", JsonString(config.rate > 0 ? "open" : "closed"),
      ",\n \"dtype\": ", JsonString(std::string(DTypeShortName(config.dtype))),
      ", \"heads\": ", config.heads, ", \"heads_k\": ", config.heads_k,
      ", \"head_dim\": ", config.head_dim, ", \"causal\": ", config.causal ? "true" : "false",
      ", \"pool_size\": ", config.pool_size, ", \"check_every\": ", config.check_every,
      raw ? absl::StrCat(",\n \"raw_socket\": {\"bytes\": ", raw->bytes,
                         ", \"gbps_one_connection\": ", JsonNumber(raw->gbps_one),
                         ", \"connections\": ", raw->connections,
                         ", \"gbps\": ", JsonNumber(raw->gbps_many), "}")
          : "",
      ",\n \"runs\": [\n", absl::StrJoin(run_objects, ",\n"), "\n ]}\n");
}

std::string RunsToCsv(const std::vector<RunResult>& runs) {
  std::string csv =
      "concurrency,target_rate,elapsed_s,requests,errors,error_rate,throughput_rps,"
      "tokens_per_s,tflops,min_ms,mean_ms,p50_ms,p90_ms,p95_ms,p99_ms,p999_ms,max_ms,"
      "checked,mismatches,transport,payload_bytes,payload_gbps\n";
  for (const RunResult& run : runs) {
    const LatencySummary l = run.latency.Summarize();
    absl::StrAppendFormat(&csv, "%d,%g,%.4f,%lld,%lld,%.6g,%.6g,%.6g,%.6g,", run.concurrency,
                          run.target_rate, run.elapsed_s, static_cast<long long>(run.requests),
                          static_cast<long long>(run.errors), run.error_rate(), run.throughput(),
                          run.tokens_per_s(), run.tflops());
    absl::StrAppendFormat(&csv, "%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%lld,%lld,", l.min,
                          l.mean, l.p50, l.p90, l.p95, l.p99, l.p999, l.max,
                          static_cast<long long>(run.checked),
                          static_cast<long long>(run.mismatches));
    absl::StrAppendFormat(&csv, "%s,%lld,%.6g\n", run.transport,
                          static_cast<long long>(run.payload_bytes), run.payload_gbps());
  }
  return csv;
}

std::string RunsToMarkdown(const std::vector<RunResult>& runs) {
  std::string table =
      "| concurrency | req/s | tokens/s | TFLOP/s | p50 ms | p90 ms | p99 ms | p99.9 ms | "
      "errors | payload GB/s |\n"
      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const RunResult& run : runs) {
    const LatencySummary l = run.latency.Summarize();
    absl::StrAppendFormat(&table,
                          "| %d | %.1f | %.0f | %.4g | %.3f | %.3f | %.3f | %.3f | %lld | %.4g |\n",
                          run.concurrency, run.throughput(), run.tokens_per_s(), run.tflops(),
                          l.p50, l.p90, l.p99, l.p999, static_cast<long long>(run.errors),
                          run.payload_gbps());
  }
  return table;
}

absl::Status WriteTextFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace attnserve::load

#include "tools/load_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace attnserve::load {
namespace {

// cu_seqlens are int32 on the wire, so a request's total tokens must fit one.
constexpr int64_t kMaxTotalTokens = (int64_t{1} << 31) - 1;
// Times are added to clock readings; beyond these they would overflow the clocks' int64.
constexpr absl::Duration kMaxTime = absl::Hours(24 * 365);
constexpr double kMinRate = 1e-3;  // one call per 1000 s

absl::StatusOr<int> ParsePositive(absl::string_view text, absl::string_view what) {
  int value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", text, "' is not a positive integer"));
  }
  return value;
}

absl::StatusOr<IntRange> ParseRange(absl::string_view text, bool allow_range,
                                    absl::string_view what) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, '-');
  if (parts.size() == 1) {
    absl::StatusOr<int> v = ParsePositive(parts[0], what);
    if (!v.ok()) return v.status();
    return IntRange{*v, *v};
  }
  if (parts.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", text, "' is not N or MIN-MAX"));
  }
  absl::StatusOr<int> low = ParsePositive(parts[0], what);
  if (!low.ok()) return low.status();
  absl::StatusOr<int> high = ParsePositive(parts[1], what);
  if (!high.ok()) return high.status();
  if (!allow_range) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": a fixed shape takes single values, not '", text, "' (use uniform: for ranges)"));
  }
  if (*low > *high) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": range '", text, "' is empty"));
  }
  return IntRange{*low, *high};
}

}  // namespace

absl::StatusOr<ShapeSpec> ParseShapeSpec(absl::string_view text) {
  const absl::string_view usage =
      "expected fixed:batch=B,seqlen=S or uniform:batch=B1-B2,seqlen=S1-S2 "
      "(keys: batch, seqlen, seqlen_q, seqlen_k)";
  std::pair<absl::string_view, absl::string_view> kind_rest =
      absl::StrSplit(text, absl::MaxSplits(':', 1));
  ShapeSpec spec;
  if (kind_rest.first == "uniform") {
    spec.uniform = true;
  } else if (kind_rest.first != "fixed") {
    return absl::InvalidArgumentError(
        absl::StrCat("--shape=", text, ": unknown kind '", kind_rest.first, "'; ", usage));
  }
  bool has_batch = false, has_q = false, has_k = false, has_seqlen = false;
  for (absl::string_view item : absl::StrSplit(kind_rest.second, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(item, absl::MaxSplits('=', 1));
    const std::string what = absl::StrCat("--shape ", kv.first);
    absl::StatusOr<IntRange> range = ParseRange(kv.second, spec.uniform, what);
    if (!range.ok()) return range.status();
    bool duplicate = false;
    if (kv.first == "batch") {
      duplicate = has_batch;
      has_batch = true;
      spec.batch = *range;
    } else if (kv.first == "seqlen") {
      duplicate = has_seqlen || has_q;
      has_seqlen = true;
      spec.seqlen_q = *range;
      if (!has_k) spec.seqlen_k = *range;
    } else if (kv.first == "seqlen_q") {
      duplicate = has_seqlen || has_q;
      has_q = true;
      spec.seqlen_q = *range;
    } else if (kv.first == "seqlen_k") {
      duplicate = has_k;
      has_k = true;
      spec.seqlen_k = *range;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--shape=", text, ": unknown key '", kv.first, "'; ", usage));
    }
    if (duplicate) {
      return absl::InvalidArgumentError(
          absl::StrCat("--shape=", text, ": '", kv.first, "' given twice"));
    }
  }
  if (!has_seqlen && !has_q) {
    return absl::InvalidArgumentError(absl::StrCat("--shape=", text, ": no seqlen; ", usage));
  }
  spec.separate_k = has_k;
  if (has_q && !has_k) spec.seqlen_k = spec.seqlen_q;
  const int64_t max_seqlen = std::max(spec.seqlen_q.max, spec.seqlen_k.max);
  if (int64_t{spec.batch.max} * max_seqlen > kMaxTotalTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shape=", text, ": batch * seqlen exceeds 2^31-1 tokens"));
  }
  return spec;
}

absl::StatusOr<std::vector<SequenceLengths>> ParseSeqlensText(absl::string_view text) {
  std::vector<SequenceLengths> requests;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = line.substr(0, line.find('#'));
    SequenceLengths lengths;
    int64_t total_q = 0, total_k = 0;
    for (absl::string_view item :
         absl::StrSplit(line, absl::ByAnyChar(", \t\r"), absl::SkipEmpty())) {
      const std::string what = absl::StrCat("line ", line_number);
      std::pair<absl::string_view, absl::string_view> qk =
          absl::StrSplit(item, absl::MaxSplits(':', 1));
      absl::StatusOr<int> q = ParsePositive(qk.first, what);
      if (!q.ok()) return q.status();
      absl::StatusOr<int> k =
          item.find(':') == absl::string_view::npos ? q : ParsePositive(qk.second, what);
      if (!k.ok()) return k.status();
      lengths.q.push_back(*q);
      lengths.k.push_back(*k);
      total_q += *q;
      total_k += *k;
    }
    if (lengths.q.empty()) continue;
    if (std::max(total_q, total_k) > kMaxTotalTokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_number, ": more than 2^31-1 tokens"));
    }
    requests.push_back(std::move(lengths));
  }
  if (requests.empty()) return absl::InvalidArgumentError("no sequence lengths in the file");
  return requests;
}

absl::StatusOr<std::vector<SequenceLengths>> ReadSeqlensFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--seqlens_file=", path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::vector<SequenceLengths>> parsed = ParseSeqlensText(text.str());
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seqlens_file=", path, ": ", parsed.status().message()));
  }
  return parsed;
}

absl::StatusOr<std::vector<int>> ParseSweepLevels(absl::string_view text) {
  std::vector<int> levels;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    absl::StatusOr<int> level = ParsePositive(absl::StripAsciiWhitespace(item), "--sweep");
    if (!level.ok()) return level.status();
    levels.push_back(*level);
  }
  return levels;
}

absl::StatusOr<v1::DType> ParseDType(absl::string_view name) {
  if (name == "fp16" || name == "float16") return v1::DTYPE_FLOAT16;
  if (name == "bf16" || name == "bfloat16") return v1::DTYPE_BFLOAT16;
  if (name == "fp32" || name == "float32") return v1::DTYPE_FLOAT32;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype must be fp16, bf16 or fp32, not '", name, "'"));
}

absl::string_view DTypeShortName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT16:
      return "fp16";
    case v1::DTYPE_BFLOAT16:
      return "bf16";
    case v1::DTYPE_FLOAT32:
      return "fp32";
    default:
      return "unspecified";
  }
}

absl::StatusOr<RpcMix> ParseRpcMix(absl::string_view name) {
  if (name == "forward") return RpcMix::kForward;
  if (name == "backward") return RpcMix::kBackward;
  if (name == "mixed") return RpcMix::kMixed;
  return absl::InvalidArgumentError(
      absl::StrCat("--rpc must be forward, backward or mixed, not '", name, "'"));
}

absl::string_view RpcMixName(RpcMix rpc) {
  switch (rpc) {
    case RpcMix::kForward:
      return "forward";
    case RpcMix::kBackward:
      return "backward";
    case RpcMix::kMixed:
      return "mixed";
  }
  return "";
}

absl::StatusOr<Arrival> ParseArrival(absl::string_view name) {
  if (name == "constant") return Arrival::kConstant;
  if (name == "poisson") return Arrival::kPoisson;
  return absl::InvalidArgumentError(
      absl::StrCat("--arrival must be constant or poisson, not '", name, "'"));
}

absl::string_view ArrivalName(Arrival arrival) {
  return arrival == Arrival::kPoisson ? "poisson" : "constant";
}

absl::Status ValidateConfig(const LoadConfig& c) {
  auto invalid = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (c.target.empty()) return invalid("--target must not be empty");
  if (c.connections < 1) return invalid("--connections must be >= 1, not ", c.connections);
  if (c.data_connections < 1) {
    return invalid("--data_connections must be >= 1, not ", c.data_connections);
  }
  if (c.keep_context && c.rpc != RpcMix::kBackward) {
    return invalid("--keep_context measures training steps (a forward, then the backward on its "
                   "context): it needs --rpc=backward");
  }
  if (c.raw_socket_peer_bytes < 0) {
    return invalid("--raw_socket_peer_bytes must be >= 0 (0 = off), not ", c.raw_socket_peer_bytes);
  }
  if (c.concurrency < 1) return invalid("--concurrency must be >= 1, not ", c.concurrency);
  if (!(c.rate >= 0) || std::isinf(c.rate)) {
    return invalid("--rate must be finite and >= 0 (0 = closed loop), not ", c.rate);
  }
  if (c.requests < 0) return invalid("--requests must be >= 0, not ", c.requests);
  if (c.rate > 0 && c.rate < kMinRate) {
    return invalid("--rate must be 0 (closed loop) or at least ", kMinRate, ", not ", c.rate);
  }
  if (c.requests == 0 && c.duration <= absl::ZeroDuration()) {
    return invalid("--duration must be positive (or give --requests)");
  }
  if (c.duration > kMaxTime) return invalid("--duration must be at most a year");
  if (c.warmup < absl::ZeroDuration()) return invalid("--warmup must not be negative");
  if (c.warmup > kMaxTime) return invalid("--warmup must be at most a year");
  if (c.timeout <= absl::ZeroDuration()) return invalid("--timeout must be positive");
  if (c.timeout > kMaxTime) return invalid("--timeout must be at most a year");
  if (c.max_inflight < 1) return invalid("--max_inflight must be >= 1");
  if (c.heads < 1 || c.heads_k < 1 || c.head_dim < 1) {
    return invalid("--heads, --heads_k and --head_dim must be >= 1");
  }
  if (c.heads % c.heads_k != 0) {
    return invalid("--heads (", c.heads, ") must be a multiple of --heads_k (", c.heads_k, ")");
  }
  if (!(c.backward_fraction >= 0 && c.backward_fraction <= 1)) {
    return invalid("--backward_fraction must be in [0, 1], not ", c.backward_fraction);
  }
  if (c.pool_size < 1) return invalid("--pool_size must be >= 1, not ", c.pool_size);
  if (c.check_every < 0) return invalid("--check must be >= 0 (0 = off), not ", c.check_every);
  if (!(c.max_error_rate >= 0 && c.max_error_rate <= 1)) {
    return invalid("--max_error_rate must be in [0, 1], not ", c.max_error_rate);
  }
  if (!c.sweep.empty() && c.rate > 0) {
    return invalid("--sweep varies closed-loop concurrency; it cannot be combined with --rate");
  }
  if (!c.sweep.empty() && c.sweep_prefix.empty()) return invalid("--sweep_prefix is empty");
  return absl::OkStatus();
}

}  // namespace attnserve::load

#include "server/engine/work_estimate.h"

#include <algorithm>

namespace attnserve::engine {
namespace {

// What a FlashAttention-2-class kernel reaches on each architecture's tensor cores: on sm90 our
// flash kernels measured 300-370 TFLOP/s (bench/RESULTS.md, H100); sm80 is A100-class (FA2
// reaches ~190 there); sm86/sm89 consumer Ampere/Ada about half of that; sm75 Turing (a T4
// peaks at 65 dense fp16); sm70 Volta (V100 peaks at 125, FA1-class kernels reach ~60).
double FlashClassRate(int compute_capability) {
  if (compute_capability >= 90) return 300e12;
  if (compute_capability >= 86) return 90e12;
  if (compute_capability >= 80) return 180e12;
  if (compute_capability >= 75) return 30e12;
  if (compute_capability >= 70) return 50e12;
  return 0;
}
// The tiled sm70+ fallback kernels run 3-5x slower than flash on the same GPU.
constexpr double kFallbackShare = 0.25;
// cuBLAS GEMMs with the scores materialized in device memory: bandwidth-bound softmax passes.
constexpr double kCublasShare = 0.15;
// A score's softmax runs on a GPU's FP32 and special-function units, not its tensor cores: an
// H100 does ~3.6e12 exps per second against ~300e12 tensor-core FLOPs, so a score costs about
// as much as 64-128 FLOPs of the matrix products (head_dim 16-32's worth).
constexpr double kGpuFlopsPerScore = 64;
// The exact reference kernels on the host CPU, per thread, measured on the 2-core CI machine
// (2026-11-26, one thread, float32 forward): 34 ns per score at head_dim 1, and 0.125 ns more
// per FLOP at head_dim 64 and 128 (65 and 97 ns per score). A backward runs ~2x its forward
// there, inside the 2.5x the cost model charges it.
constexpr double kHostFlopsPerThread = 8e9;
constexpr double kHostScoresPerThread = 30e6;
// Bytes per second a GPU request's tensors move between host and device: staging into pinned
// memory (one host memcpy) and PCIe, in series within a lane.
constexpr double kHostLinkBytesPerSecond = 10e9;

}  // namespace

bool RunsOnGpu(const std::string& family, int compute_capability) {
  return compute_capability > 0 && !family.empty() && family != "reference";
}

Throughput FamilyThroughput(const std::string& family, int compute_capability, int host_threads) {
  const double threads = std::max(host_threads, 1);
  const Throughput host{kHostFlopsPerThread * threads, kHostScoresPerThread * threads, 0};
  if (!RunsOnGpu(family, compute_capability)) return host;
  double share;
  if (family == "flash") {
    share = 1;
  } else if (family == "fallback") {
    share = kFallbackShare;
  } else if (family == "cublas") {
    share = kCublasShare;
  } else {
    // A family this table does not know yet: assume the slowest.
    return {host.flops, host.scores, kHostLinkBytesPerSecond};
  }
  const double flops = share * FlashClassRate(compute_capability);
  return {flops, flops / kGpuFlopsPerScore, kHostLinkBytesPerSecond};
}

double EstimatedSeconds(const RequestProfile& request, const std::string& family,
                        int compute_capability, int host_threads) {
  const Throughput rate = FamilyThroughput(family, compute_capability, host_threads);
  double seconds = request.flops / rate.flops + request.scores / rate.scores;
  if (rate.link_bytes > 0) seconds += static_cast<double>(request.device_bytes) / rate.link_bytes;
  return seconds;
}

}  // namespace attnserve::engine

// What a request costs: attention FLOPs by the convention every benchmark of ours uses
// (DESIGN.md: 4·Σ sq·sk·d·heads forward, halved when causal, 2.5× that backward; feeds
// attnserve_flops_total, from which dashboards derive TFLOP/s), and the device memory it
// occupies while it runs (for admission control).
#pragma once

#include "server/engine/attention_request.h"

namespace attnserve::engine {

double AttentionFlops(const ForwardInputs& in);
double AttentionFlops(const BackwardInputs& in);

// Bytes of device memory a request occupies while it runs: its inputs, its outputs and the
// float32 scratch a backward keeps per query row and head.
int64_t DeviceBytes(const ForwardInputs& in);
int64_t DeviceBytes(const BackwardInputs& in);

}  // namespace attnserve::engine

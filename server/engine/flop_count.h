// Attention FLOPs by the convention every benchmark of ours uses (DESIGN.md): 4·Σ sq·sk·d·heads
// for a forward, halved when causal, and 2.5× that for a backward. Feeds attnserve_flops_total,
// from which dashboards derive TFLOP/s.
#pragma once

#include "server/engine/attention_request.h"

namespace attnserve::engine {

double AttentionFlops(const ForwardInputs& in);
double AttentionFlops(const BackwardInputs& in);

}  // namespace attnserve::engine

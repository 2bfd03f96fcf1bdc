// A minimal fork-join loop over independent work items on std::thread. Items are handed out
// dynamically (uneven causal/varlen work balances itself); results never depend on which worker
// ran an item, so kernels stay bitwise deterministic for any thread count.
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/attention_params.h"

namespace attnserve::kernels::reference {

// Workers to use for `items` work items: ctx.num_threads (0 or less = all hardware threads),
// never more than there are items, at least 1.
int ResolveWorkers(const ExecutionContext& ctx, int64_t items);

// Calls fn(item, worker) once for every item in [0, items), with worker in [0, workers). The
// calling thread is worker 0. An exception from fn (e.g. std::bad_alloc) stops handing out
// items and comes back as an error instead of terminating the process. `should_stop`, when
// set, is asked before each item; true stops handing out items (KernelStatus::Stopped()).
KernelStatus ParallelFor(int64_t items, int workers,
                         const std::function<void(int64_t item, int worker)>& fn,
                         const std::function<bool()>& should_stop = nullptr);

}  // namespace attnserve::kernels::reference

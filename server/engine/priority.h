// Optional request priority levels. A client asks for one with the gRPC metadata key
// `x-attnserve-priority` (high, normal or low; absent = normal). Within a device queue a higher
// level launches first; waiting ages a job up one level per `aging` interval, so a low-priority
// job waits at most two intervals before it competes as high, and then by arrival: no level
// starves.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace attnserve::engine {

enum class Priority { kHigh = 0, kNormal = 1, kLow = 2 };

inline constexpr char kPriorityMetadataKey[] = "x-attnserve-priority";

// "high", "normal" or "low" (case-insensitive); anything else is INVALID_ARGUMENT naming the key.
absl::StatusOr<Priority> ParsePriority(absl::string_view value);

const char* PriorityName(Priority priority);  // "high", "normal", "low"

// The level a job competes at after waiting `waited`: 0 (high) .. 2 (low), one level better per
// whole `aging` interval waited. `aging` must be positive.
int EffectiveLevel(Priority priority, absl::Duration waited, absl::Duration aging);

}  // namespace attnserve::engine

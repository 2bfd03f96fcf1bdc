#include "server/engine/priority.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "server/engine/error_text.h"

namespace attnserve::engine {

absl::StatusOr<Priority> ParsePriority(absl::string_view value) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  if (lower == "high") return Priority::kHigh;
  if (lower == "normal") return Priority::kNormal;
  if (lower == "low") return Priority::kLow;
  return absl::InvalidArgumentError(absl::StrCat("metadata ", kPriorityMetadataKey, ": expected ",
                                                 "high, normal or low; got '", QuoteString(value), "'"));
}

const char* PriorityName(Priority priority) {
  switch (priority) {
    case Priority::kHigh:
      return "high";
    case Priority::kNormal:
      return "normal";
    case Priority::kLow:
      return "low";
  }
  return "normal";
}

int EffectiveLevel(Priority priority, absl::Duration waited, absl::Duration aging) {
  const int64_t promotions = absl::IDivDuration(waited, aging, &waited);
  return static_cast<int>(std::max<int64_t>(0, static_cast<int>(priority) - promotions));
}

}  // namespace attnserve::engine

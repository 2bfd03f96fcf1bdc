#include "server/engine/fault_injection.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/ascii.h"

namespace attnserve::engine {

absl::StatusOr<std::map<std::string, InjectedFault>> ParseInjectedFaults(absl::string_view spec) {
  std::map<std::string, InjectedFault> faults;
  for (absl::string_view entry : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    const auto bad = [&] {
      return absl::InvalidArgumentError(absl::StrCat(
          "--inject_device_fault: '", entry.substr(0, 64),
          "' is not DEVICE@LAUNCH[+EVERY][/FAILED_RESETS] (e.g. cpu@3, cuda:0@5/2 or "
          "cuda:0@50+400)"));
    };
    const std::vector<absl::string_view> at = absl::StrSplit(entry, '@');
    if (at.size() != 2 || at[0].empty()) return bad();
    const std::vector<absl::string_view> slash = absl::StrSplit(at[1], '/');
    InjectedFault fault;
    if (slash.size() > 2) return bad();
    const std::vector<absl::string_view> plus = absl::StrSplit(slash[0], '+');
    if (plus.size() > 2 || !absl::SimpleAtoi(plus[0], &fault.launch) || fault.launch < 1) {
      return bad();
    }
    if (plus.size() == 2 && (!absl::SimpleAtoi(plus[1], &fault.every) || fault.every < 1)) {
      return bad();
    }
    if (slash.size() == 2 &&
        (!absl::SimpleAtoi(slash[1], &fault.failed_resets) || fault.failed_resets < 0)) {
      return bad();
    }
    faults[std::string(at[0])] = fault;
  }
  return faults;
}

}  // namespace attnserve::engine

#include "server/devices/device_registry.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace attnserve::devices {
namespace {

std::string CpuModelName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (absl::StartsWith(line, "model name")) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
    }
  }
  return "cpu";
}

}  // namespace

std::vector<DeviceDescription> ListNoGpus() { return {}; }

DeviceDescription DescribeCpu() {
  DeviceDescription cpu;
  cpu.kind = DeviceKind::kCpu;
  cpu.name = "cpu";
  cpu.model = CpuModelName();
  const int64_t page = sysconf(_SC_PAGESIZE);
  cpu.memory_total_bytes = page * sysconf(_SC_PHYS_PAGES);
  cpu.memory_free_bytes = page * sysconf(_SC_AVPHYS_PAGES);
  return cpu;
}

absl::StatusOr<std::vector<DeviceDescription>> ResolveDevices(absl::string_view spec,
                                                             const GpuLister& list_gpus) {
  const std::string value(absl::StripAsciiWhitespace(spec));
  if (value == "cpu") return std::vector<DeviceDescription>{DescribeCpu()};
  std::vector<DeviceDescription> gpus = list_gpus();
  if (value == "auto") {
    if (gpus.empty()) return std::vector<DeviceDescription>{DescribeCpu()};
    return gpus;
  }
  std::vector<DeviceDescription> chosen;
  std::set<int> seen;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    int ordinal = -1;
    if (!absl::SimpleAtoi(part, &ordinal) || ordinal < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--devices=", value, ": expected auto, cpu or CUDA ordinals like 0,1; got '", part, "'"));
    }
    if (!seen.insert(ordinal).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--devices=", value, ": ordinal ", ordinal, " listed twice"));
    }
    auto it = std::find_if(gpus.begin(), gpus.end(),
                           [&](const DeviceDescription& d) { return d.ordinal == ordinal; });
    if (it == gpus.end()) {
      return absl::NotFoundError(absl::StrCat("--devices=", value, ": no CUDA device ", ordinal,
                                              " (this process sees ", gpus.size(), ")"));
    }
    chosen.push_back(*it);
  }
  return chosen;
}

}  // namespace attnserve::devices

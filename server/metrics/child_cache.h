// The children of a prometheus family (one per label-value combination), each found once and
// then looked up by its label values. prometheus::Family::Add builds a std::map of its labels
// (and a histogram's caller a vector of bucket bounds) on every call; the lanes record several
// labelled metrics per request, which cost small requests measurable throughput.
#pragma once

#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace attnserve::metrics {

template <typename Metric>
class ChildCache {
 public:
  // The child for these label values (in the family's label order); `add` makes it on the
  // first call and must return a reference the family keeps (children are never removed).
  template <typename Add>
  Metric& Get(std::initializer_list<absl::string_view> values, Add&& add) {
    const std::string key = absl::StrJoin(values, "\x1f");
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, inserted] = children_.try_emplace(key, nullptr);
    if (inserted) it->second = &add();
    return *it->second;
  }

 private:
  std::mutex mu_;
  absl::flat_hash_map<std::string, Metric*> children_;
};

}  // namespace attnserve::metrics

// Error messages that quote what a client sent stay short: a field of a million entries (or a
// megabyte-long id) is summarised, so an answer never grows with the input (a 3 MB message
// once came back and the client saw it as a metadata-size error instead of the real one).
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace attnserve::engine {

// Most list entries an error quotes (a rank-3 shape and short offset lists fit whole).
inline constexpr size_t kMaxQuotedEntries = 8;
// Most characters of a client's string an error quotes.
inline constexpr size_t kMaxQuotedChars = 64;
// Most bytes of any error message sent to a client, whatever produced it.
inline constexpr size_t kMaxErrorMessageBytes = 1024;

// "[a, b, c]", or "[a, b, ..., z] (N entries)" past kMaxQuotedEntries.
template <typename T>
std::string QuoteList(absl::Span<const T> values) {
  if (values.size() <= kMaxQuotedEntries) return absl::StrCat("[", absl::StrJoin(values, ", "), "]");
  return absl::StrCat("[", absl::StrJoin(values.subspan(0, kMaxQuotedEntries - 1), ", "), ", ..., ",
                      values.back(), "] (", values.size(), " entries)");
}

// The value whole, or its first kMaxQuotedChars characters and how long it was.
inline std::string QuoteString(absl::string_view value) {
  if (value.size() <= kMaxQuotedChars) return std::string(value);
  return absl::StrCat(value.substr(0, kMaxQuotedChars), "... (", value.size(), " bytes)");
}

// The message cut to kMaxErrorMessageBytes: the last line of defence at each transport.
inline std::string BoundedErrorMessage(absl::string_view message) {
  if (message.size() <= kMaxErrorMessageBytes) return std::string(message);
  return absl::StrCat(message.substr(0, kMaxErrorMessageBytes - 32), "... (message truncated)");
}

}  // namespace attnserve::engine

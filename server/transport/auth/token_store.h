// The bearer tokens the server accepts: parsed from a tokens file, held as SHA-256 digests, and
// checked in constant time. Replace() swaps the whole set at once, so a reload never leaves a
// half-read file in force.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnserve::transport {

// A tokens file: one token per line; surrounding whitespace is trimmed, blank lines and lines
// starting with '#' are skipped. A token is printable ASCII without spaces (RFC 6750's
// b64token is narrower); anything else fails with the line number (never the line's text, which
// may be a secret).
absl::StatusOr<std::vector<std::string>> ParseTokens(absl::string_view text);

class TokenStore {
 public:
  using Digest = std::array<unsigned char, 32>;

  // Replaces the accepted set.
  void Replace(const std::vector<std::string>& tokens);
  // Whether `token` is in the set. Its time depends on the number of tokens only, not on how
  // much of a token matches: every digest is compared in full.
  bool Contains(absl::string_view token) const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const std::vector<Digest>> digests_ = std::make_shared<std::vector<Digest>>();
};

}  // namespace attnserve::transport

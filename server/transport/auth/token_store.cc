#include "server/transport/auth/token_store.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace attnserve::transport {
namespace {

TokenStore::Digest Sha256(absl::string_view text) {
  TokenStore::Digest digest;
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest.data());
  return digest;
}

bool IsTokenChar(char c) { return c > 0x20 && c < 0x7f; }

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseTokens(absl::string_view text) {
  std::vector<std::string> tokens;
  // Editors on some systems start UTF-8 files with a byte-order mark; it is no part of the
  // first token (left in, it made the whole file unparseable).
  constexpr absl::string_view kUtf8Bom = "\xEF\xBB\xBF";
  absl::ConsumePrefix(&text, kUtf8Bom);
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    for (char c : line) {
      if (!IsTokenChar(c)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "line ", line_number,
            ": a token must be one word of printable ASCII (no spaces or control characters)"));
      }
    }
    tokens.emplace_back(line);
  }
  return tokens;
}

void TokenStore::Replace(const std::vector<std::string>& tokens) {
  auto digests = std::make_shared<std::vector<Digest>>();
  digests->reserve(tokens.size());
  for (const std::string& token : tokens) digests->push_back(Sha256(token));
  std::lock_guard<std::mutex> lock(mu_);
  digests_ = std::move(digests);
}

bool TokenStore::Contains(absl::string_view token) const {
  std::shared_ptr<const std::vector<Digest>> digests;
  {
    std::lock_guard<std::mutex> lock(mu_);
    digests = digests_;
  }
  // Digests have one length whatever the token's, and CRYPTO_memcmp never stops early, so
  // neither the presented token's length nor a matching prefix shows in the time taken.
  const Digest presented = Sha256(token);
  bool found = false;
  for (const Digest& digest : *digests) {
    found |= CRYPTO_memcmp(digest.data(), presented.data(), digest.size()) == 0;
  }
  return found;
}

size_t TokenStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return digests_->size();
}

}  // namespace attnserve::transport

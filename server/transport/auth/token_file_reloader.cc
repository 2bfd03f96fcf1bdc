#include "server/transport/auth/token_file_reloader.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace attnserve::transport {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read tokens file ", path, ": ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading tokens file ", path));
  return text.str();
}

absl::StatusOr<std::vector<std::string>> ReadTokens(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<std::string>> tokens = ParseTokens(*text);
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens file ", path, ": ", tokens.status().message()));
  }
  return tokens;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenFileReloader>> TokenFileReloader::Start(
    std::string path, TokenStore* store, absl::Duration poll_interval) {
  std::unique_ptr<TokenFileReloader> reloader(
      new TokenFileReloader(std::move(path), store, poll_interval));
  reloader->loaded_version_ = reloader->CurrentVersion();
  absl::StatusOr<std::vector<std::string>> tokens = ReadTokens(reloader->path_);
  if (!tokens.ok()) return tokens.status();
  if (tokens->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokens file ", reloader->path_, " holds no token: every call would be refused"));
  }
  store->Replace(*tokens);
  reloader->poller_ = std::thread([r = reloader.get()] { r->Poll(); });
  return reloader;
}

TokenFileReloader::TokenFileReloader(std::string path, TokenStore* store,
                                     absl::Duration poll_interval)
    : path_(std::move(path)), store_(store), poll_interval_(poll_interval) {}

TokenFileReloader::~TokenFileReloader() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (poller_.joinable()) poller_.join();
}

TokenFileReloader::FileVersion TokenFileReloader::CurrentVersion() const {
  struct stat st {};
  FileVersion version;
  // stat follows symlinks, so a Kubernetes secret update (an atomic symlink swap) shows as a
  // new inode.
  if (stat(path_.c_str(), &st) != 0) return version;
  version.device = st.st_dev;
  version.inode = st.st_ino;
  version.size = st.st_size;
  version.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
  version.ctime_ns = int64_t{st.st_ctim.tv_sec} * 1'000'000'000 + st.st_ctim.tv_nsec;
  return version;
}

absl::Status TokenFileReloader::Reload() {
  std::lock_guard<std::mutex> lock(reload_mu_);
  // Noted before reading: a write that lands during the read shows as a change next poll.
  loaded_version_ = CurrentVersion();
  absl::StatusOr<std::vector<std::string>> tokens = ReadTokens(path_);
  if (!tokens.ok()) {
    // Fail closed: a deleted or unreadable file is how an operator revokes in a hurry, and
    // keeping old tokens in force would let a revoked one work on.
    store_->Replace({});
    std::fprintf(stderr, "attnserve: tokens file not loaded, every token is revoked until it "
                 "is fixed: %s\n", std::string(tokens.status().message()).c_str());
    return tokens.status();
  }
  store_->Replace(*tokens);
  if (tokens->empty()) {
    std::fprintf(stderr, "attnserve: tokens file %s is empty: every authenticated call is "
                 "refused until tokens are added\n", path_.c_str());
  } else {
    std::fprintf(stderr, "attnserve: reloaded %zu tokens from %s\n", tokens->size(),
                 path_.c_str());
  }
  return absl::OkStatus();
}

void TokenFileReloader::Poll() {
  std::unique_lock<std::mutex> lock(stop_mu_);
  while (!stop_cv_.wait_for(lock, absl::ToChronoNanoseconds(poll_interval_),
                            [this] { return stopping_; })) {
    bool changed;
    {
      std::lock_guard<std::mutex> reload_lock(reload_mu_);
      changed = !(CurrentVersion() == loaded_version_);
    }
    if (changed) (void)Reload();
  }
}

}  // namespace attnserve::transport

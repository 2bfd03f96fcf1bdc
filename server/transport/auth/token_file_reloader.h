// Keeps a TokenStore in step with its tokens file: reads it at start, again whenever the file
// changes (polled, so edits, renames and Kubernetes secret updates are all seen), and on
// request (SIGHUP). A reload that fails (file deleted, unreadable or malformed) revokes every
// token until the file is fixed, and says why on stderr: revocation fails closed.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/transport/auth/token_store.h"

namespace attnserve::transport {

class TokenFileReloader {
 public:
  // Fails when the file cannot be read or parsed or holds no token: a server that would refuse
  // every call is a configuration error at startup. `store` must outlive the reloader.
  static absl::StatusOr<std::unique_ptr<TokenFileReloader>> Start(
      std::string path, TokenStore* store, absl::Duration poll_interval = absl::Seconds(1));
  ~TokenFileReloader();

  // Reads the file now. On failure the store is emptied (every call refused) until a later
  // reload succeeds. An empty file is accepted (it revokes every token) with a warning.
  absl::Status Reload();

 private:
  // What identifies one version of the file; any change triggers a reload.
  struct FileVersion {
    dev_t device = 0;
    ino_t inode = 0;
    off_t size = -1;
    int64_t mtime_ns = -1;
    int64_t ctime_ns = -1;
    bool operator==(const FileVersion& o) const {
      return device == o.device && inode == o.inode && size == o.size &&
             mtime_ns == o.mtime_ns && ctime_ns == o.ctime_ns;
    }
  };

  TokenFileReloader(std::string path, TokenStore* store, absl::Duration poll_interval);
  FileVersion CurrentVersion() const;
  void Poll();

  const std::string path_;
  TokenStore* const store_;
  const absl::Duration poll_interval_;
  std::mutex reload_mu_;  // one reload at a time (poll thread and SIGHUP)
  FileVersion loaded_version_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread poller_;
};

}  // namespace attnserve::transport

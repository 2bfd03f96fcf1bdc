// Throwaway certificates for TLS end-to-end tests, made with the openssl command line: a CA, a
// server certificate for 127.0.0.1 and attnserve.test, a client certificate it signed, an
// unrelated CA, and a server certificate that names only another host.
#pragma once

#include <string>

namespace attnserve::testing {

class TestCertificates {
 public:
  // Makes them in a fresh directory; fails the current test on error (Path() then names
  // files that do not exist).
  TestCertificates();
  ~TestCertificates();  // removes the directory
  TestCertificates(const TestCertificates&) = delete;
  TestCertificates& operator=(const TestCertificates&) = delete;

  // A file in the directory: ca.crt, other_ca.crt, server.crt/.key, client.crt/.key,
  // elsewhere.crt/.key (signed by ca, for DNS:elsewhere.test only).
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

 private:
  std::string dir_;
};

// Writes `text` to `path`.
void WriteFile(const std::string& path, const std::string& text);

}  // namespace attnserve::testing

#include "test_certificates.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "gtest/gtest.h"
#include "subprocess.h"

namespace attnserve::testing {
namespace {

// Runs the openssl command line; fails the test on error.
void OpenSsl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  const ProcessResult result = RunProcess(argv, 60);
  ASSERT_EQ(result.exit_code, 0) << result.output;
}

}  // namespace

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TestCertificates::TestCertificates() {
  // One directory per process: ctest runs each test of a suite as its own process, in
  // parallel, and a shared directory would be deleted under the others by the first to end.
  dir_ = ::testing::TempDir() + "/attnserve_certificates.XXXXXX";
  if (mkdtemp(dir_.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << dir_ << ": " << std::strerror(errno);
    return;
  }
  for (const char* ca : {"ca", "other_ca"}) {
    OpenSsl({"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             std::string("/CN=attnserve e2e ") + ca, "-keyout", Path(ca) + ".key", "-out",
             Path(ca) + ".crt"});
  }
  WriteFile(Path("server.ext"), "subjectAltName=IP:127.0.0.1,DNS:attnserve.test\n");
  WriteFile(Path("client.ext"), "extendedKeyUsage=clientAuth\n");
  WriteFile(Path("elsewhere.ext"), "subjectAltName=DNS:elsewhere.test\n");
  for (const char* leaf : {"server", "client", "elsewhere"}) {
    OpenSsl({"req", "-newkey", "rsa:2048", "-nodes", "-subj", std::string("/CN=") + leaf,
             "-keyout", Path(leaf) + ".key", "-out", Path(leaf) + ".csr"});
    OpenSsl({"x509", "-req", "-in", Path(leaf) + ".csr", "-days", "2", "-CA", Path("ca.crt"),
             "-CAkey", Path("ca.key"), "-CAcreateserial", "-extfile", Path(leaf) + ".ext",
             "-out", Path(leaf) + ".crt"});
  }
}

TestCertificates::~TestCertificates() { RunProcess({"/bin/rm", "-rf", dir_}); }

}  // namespace attnserve::testing

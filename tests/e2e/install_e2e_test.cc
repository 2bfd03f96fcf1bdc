// End-to-end: the installed C++ client package. Installs this build into a temporary prefix,
// builds examples/cpp_client (a separate project calling find_package(attnserve)) against it,
// and runs the example against the real server.
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server_process.h"
#include "subprocess.h"

namespace attnserve::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// The example's configure step runs a compiler check, its build compiles one file against
// gRPC's headers: tens of seconds on two cores.
constexpr int kStepTimeoutSeconds = 240;

class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "/attnserve_install_XXXXXX";
    path_ = mkdtemp(pattern.data()) ? pattern : "";
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void ExpectSucceeds(const std::vector<std::string>& argv) {
  const ProcessResult result = RunProcess(argv, kStepTimeoutSeconds);
  ASSERT_EQ(result.exit_code, 0) << argv[0] << " " << argv[1] << ":\n" << result.output;
}

TEST(InstallE2eTest, ExampleBuiltAgainstTheInstalledPackageTalksToTheServer) {
  TempDir root;
  ASSERT_FALSE(root.path().empty());
  const std::string prefix = root.path() + "/prefix";
  const std::string build = root.path() + "/build";

  ASSERT_NO_FATAL_FAILURE(ExpectSucceeds({ATTN_CMAKE_COMMAND, "--install", ATTN_BUILD_DIR,
                                          "--prefix", prefix}));
  for (const char* file : {"include/attnserve/client.h", "include/attnserve/tensor_codec.h",
                           "include/attnserve/v1/attention.pb.h",
                           "include/attnserve/v1/attention.grpc.pb.h",
                           "lib/libattn_client.a", "lib/libattn_proto.a",
                           "lib/cmake/attnserve/attnserveConfig.cmake",
                           "lib/cmake/attnserve/attnserveConfigVersion.cmake"}) {
    EXPECT_TRUE(fs::exists(prefix + "/" + file)) << file;
  }

  ASSERT_NO_FATAL_FAILURE(ExpectSucceeds(
      {ATTN_CMAKE_COMMAND, "-S", EXAMPLE_DIR, "-B", build, "-G", CMAKE_GENERATOR_NAME,
       "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_CXX_COMPILER=" CXX_COMPILER,
       "-DCMAKE_PREFIX_PATH=" + prefix}));
  ASSERT_NO_FATAL_FAILURE(ExpectSucceeds({ATTN_CMAKE_COMMAND, "--build", build}));

  auto server = ServerProcess::Start();
  ASSERT_NE(server, nullptr);
  const ProcessResult run = RunProcess({build + "/attnserve_example", server->target()}, 60);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("out matches"));
  EXPECT_EQ(server->Terminate(), 0) << server->Log();
}

}  // namespace
}  // namespace attnserve::testing

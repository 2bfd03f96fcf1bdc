// The cublas family opens cuBLAS at run time (kernels/cublas/cublas_loader.h). Built only with
// CUDA, where the toolkit it was built with is on the machine (CI's too).
#include "kernels/cublas/cublas_loader.h"

#include <pthread.h>

#include <string>

#include "gtest/gtest.h"

namespace attnserve::kernels::cublas {
namespace {

TEST(CublasLoaderTest, ResolvesEveryEntryPoint) {
  std::string error;
  const CublasApi* api = Cublas(&error);
  ASSERT_NE(api, nullptr) << error;
  EXPECT_NE(api->create, nullptr);
  EXPECT_NE(api->set_stream, nullptr);
  EXPECT_NE(api->set_workspace, nullptr);
  EXPECT_NE(api->gemm_strided_batched_ex, nullptr);
  ASSERT_NE(api->status_string, nullptr);
  EXPECT_STRNE(api->status_string(CUBLAS_STATUS_SUCCESS), "");
}

// Why cuBLAS is not linked: this test binary holds every kernel family, as the server does, and
// a thread with the 100 KB stack Debian's civetweb asks for must still start. Linking cuBLAS
// (libcublasLt's ~94 KB of TLS) made pthread_create fail here with EINVAL.
TEST(CublasLoaderTest, SmallStackThreadsStillStartAfterLoadingIt) {
  std::string error;
  ASSERT_NE(Cublas(&error), nullptr) << error;
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 100 * 1024), 0);
  pthread_t thread;
  const int created = pthread_create(
      &thread, &attr, [](void*) -> void* { return nullptr; }, nullptr);
  pthread_attr_destroy(&attr);
  ASSERT_EQ(created, 0) << "pthread_create with a 100 KB stack failed: " << created;
  pthread_join(thread, nullptr);
}

}  // namespace
}  // namespace attnserve::kernels::cublas

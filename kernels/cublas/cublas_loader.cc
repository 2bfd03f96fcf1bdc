#include "kernels/cublas/cublas_loader.h"

#include <dlfcn.h>

namespace attnserve::kernels::cublas {
namespace {

#define ATTN_STRINGIFY_(x) #x
#define ATTN_STRINGIFY(x) ATTN_STRINGIFY_(x)
// The major version the headers describe: its ABI is what the pointers below assume.
constexpr const char* kLibraryName = "libcublas.so." ATTN_STRINGIFY(CUBLAS_VER_MAJOR);

struct Loaded {
  CublasApi api{};
  std::string error;  // empty when api is usable
};

template <typename Fn>
bool Resolve(void* library, const char* name, Fn* fn, std::string* error) {
  *fn = reinterpret_cast<Fn>(dlsym(library, name));
  if (*fn == nullptr) *error = std::string(kLibraryName) + " has no symbol " + name;
  return *fn != nullptr;
}

Loaded Load() {
  Loaded loaded;
  // The loader's search path first (LD_LIBRARY_PATH, ld.so.cache), then the toolkit this was
  // built with, which is often not on the search path. RTLD_LOCAL: its symbols stay out of the
  // process's global lookup scope.
  void* library = dlopen(kLibraryName, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const std::string first_error = dlerror();
#ifdef ATTN_CUDA_TOOLKIT_LIBRARY_DIR
    library = dlopen((std::string(ATTN_CUDA_TOOLKIT_LIBRARY_DIR) + "/" + kLibraryName).c_str(),
                     RTLD_NOW | RTLD_LOCAL);
#endif
    if (library == nullptr) {
      loaded.error = std::string("cannot load ") + kLibraryName + ": " + first_error;
      return loaded;
    }
  }
  CublasApi& api = loaded.api;
  std::string& error = loaded.error;
  // Never dlclose'd: handles made from it live for the process.
  if (Resolve(library, "cublasCreate_v2", &api.create, &error) &&
      Resolve(library, "cublasSetStream_v2", &api.set_stream, &error) &&
      Resolve(library, "cublasSetWorkspace_v2", &api.set_workspace, &error) &&
      Resolve(library, "cublasGetStatusString", &api.status_string, &error) &&
      Resolve(library, "cublasGemmStridedBatchedEx", &api.gemm_strided_batched_ex, &error)) {
    error.clear();
  }
  return loaded;
}

}  // namespace

const CublasApi* Cublas(std::string* error) {
  static const Loaded loaded = Load();
  if (!loaded.error.empty()) {
    *error = loaded.error;
    return nullptr;
  }
  return &loaded.api;
}

}  // namespace attnserve::kernels::cublas

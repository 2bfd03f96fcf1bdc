#include "server/main/allocator_config.h"

#include <cstdlib>

#ifdef ATTN_TCMALLOC
#include <gperftools/malloc_extension.h>
#endif

namespace attnserve {

void ConfigureAllocator() {
#ifdef ATTN_TCMALLOC
  if (std::getenv("TCMALLOC_MAX_TOTAL_THREAD_CACHE_BYTES") == nullptr) {
    MallocExtension::instance()->SetNumericProperty("tcmalloc.max_total_thread_cache_bytes",
                                                    kThreadCacheBytes);
  }
#endif
}

}  // namespace attnserve

// Bounds the allocator's caches when the server runs on tcmalloc (ATTN_TCMALLOC in the top-level
// CMakeLists.txt). Its per-thread caches of small objects may hold up to 32 MB by default; with
// gRPC's, the lanes' and the answer threads' dozens of threads they filled to that over the first
// seconds under load, which reads as memory growth in the soak's RSS check and buys nothing for
// the large tensor buffers (those come from tcmalloc's page heap, not the thread caches).
#pragma once

namespace attnserve {

// Total bytes tcmalloc's thread caches may hold, unless the operator set
// TCMALLOC_MAX_TOTAL_THREAD_CACHE_BYTES. A no-op without tcmalloc.
inline constexpr long long kThreadCacheBytes = 4 << 20;
void ConfigureAllocator();

}  // namespace attnserve

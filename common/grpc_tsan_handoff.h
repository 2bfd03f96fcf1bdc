// Happens-before edges that pass through gRPC's core, told to ThreadSanitizer by hand.
// Debian's gRPC is not TSan-built, so in a TSan build of ours (ATTN_SANITIZE=thread) TSan does
// not see what gRPC guarantees about callbacks: a client call's completion callback runs after
// the call was started, and a server reactor's On* reactions run after the handler that
// created the reactor returned it. TSan then reports the callback's use of state set up before
// the hand-off as a race. Releasing a token when handing the call (or reactor) to gRPC and
// acquiring it first thing in each callback states exactly that guarantee and nothing more.
// Outside TSan builds both are no-ops. Used by client/cpp and server/transport.
#pragma once

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ATTN_TSAN_HANDOFF 1
#endif
#endif
#if !defined(ATTN_TSAN_HANDOFF) && defined(__SANITIZE_THREAD__)
#define ATTN_TSAN_HANDOFF 1
#endif

#ifdef ATTN_TSAN_HANDOFF
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace attnserve {

// Everything this thread wrote before handing `token`'s call or reactor to gRPC ...
inline void HandOffToGrpc([[maybe_unused]] void* token) {
#ifdef ATTN_TSAN_HANDOFF
  __tsan_release(token);
#endif
}

// ... is visible to the gRPC callback thread that takes it back.
inline void TakeBackFromGrpc([[maybe_unused]] void* token) {
#ifdef ATTN_TSAN_HANDOFF
  __tsan_acquire(token);
#endif
}

}  // namespace attnserve

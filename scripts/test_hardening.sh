#!/usr/bin/env bash
# Hardening CI (run by scripts/test.sh): the CPU build under ASan+UBSan (LeakSanitizer on) with
# every C++ unit and end-to-end test, bounded libFuzzer runs, then the server's unit tests
# under TSan. Any sanitizer report fails the run; there are no suppressions. Builds go to
# build-asan/ and build-tsan/ (clang, no CUDA).
#   FUZZ_SECONDS (default 45) per fuzz target; HARDENING_STAGES (default "asan fuzz tsan").
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS="${FUZZ_SECONDS:-45}"
STAGES="${HARDENING_STAGES:-asan fuzz tsan}"

configure() {  # build_dir, extra cmake args...
  local dir="$1"
  shift
  CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DATTN_WITH_CUDA=OFF "$@" >/dev/null
}

# UBSan and ASan abort on the first report (-fno-sanitize-recover); the server processes the
# e2e tests start inherit these, so a report in the server fails the test that caused it.
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"

if [[ " $STAGES " == *" asan "* || " $STAGES " == *" fuzz "* ]]; then
  configure build-asan -DATTN_SANITIZE=address,undefined -DATTN_BUILD_FUZZERS=ON
  cmake --build build-asan
fi
if [[ " $STAGES " == *" asan "* ]]; then
  # InstallE2eTest links an outside project against the installed static libraries without
  # the sanitizer runtimes, which cannot work in an instrumented build; the normal CI runs it.
  ctest --test-dir build-asan --output-on-failure -j "$(nproc)" -E 'InstallE2eTest'
fi
if [[ " $STAGES " == *" fuzz "* ]]; then
  scripts/fuzz.sh build-asan "$FUZZ_SECONDS"
fi
if [[ " $STAGES " == *" tsan "* ]]; then
  # The server's unit tests: the engine, its per-device queue workers, batching and metrics,
  # where our own threads meet, repeated for more interleavings. The end-to-end tests are not
  # run under TSan: Debian's gRPC and absl are not built with it, so TSan cannot see the
  # synchronization inside gRPC and reports every request/response handoff between gRPC's
  # threads and ours as a race; that needs a TSan-built gRPC.
  configure build-tsan -DATTN_SANITIZE=thread
  cmake --build build-tsan --target attn_server_unit_tests
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" \
    build-tsan/bin/attn_server_unit_tests --gtest_repeat=20 --gtest_brief=1
fi

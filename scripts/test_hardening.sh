#!/usr/bin/env bash
# Hardening CI (run by scripts/test.sh): the CPU build under ASan+UBSan (LeakSanitizer on) with
# every C++ unit and end-to-end test, bounded libFuzzer runs, then under TSan the server's unit
# tests, the C++ end-to-end tests and the Python end-to-end suite. Any sanitizer report fails
# the run; ASan and UBSan have no suppressions, TSan only the gRPC hand-offs and gRPC-made
# threads that its stage explains.
# Builds go to build-asan/ and build-tsan/ (clang, no CUDA).
#   FUZZ_SECONDS (default 45) per fuzz target; HARDENING_STAGES (default "asan fuzz tsan").
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/timed.sh
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
  timed "asan build" cmake --build build-asan
fi
if [[ " $STAGES " == *" asan "* ]]; then
  # InstallE2eTest links an outside project against the installed static libraries without
  # the sanitizer runtimes, which cannot work in an instrumented build; the normal CI runs it.
  timed "asan ctest" ctest --test-dir build-asan --output-on-failure -j "$(nproc)" \
    -E 'InstallE2eTest'
fi
if [[ " $STAGES " == *" fuzz "* ]]; then
  timed fuzz scripts/fuzz.sh build-asan "$FUZZ_SECONDS"
fi
if [[ " $STAGES " == *" tsan "* ]]; then
  # The server's unit tests (the engine, its queue workers, batching, placement, metrics, auth
  # reloading), repeated for more interleavings (the compute-heavy split-backward ones once),
  # then the C++ end-to-end tests and the Python end-to-end suite against the TSan-built
  # server. Debian's gRPC, protobuf and absl are not TSan-built:
  # tests/sanitizers/tsan_third_party.ignorelist leaves their header and generated code
  # uninstrumented like their libraries, ignore_noninstrumented_modules keeps TSan's
  # interceptors quiet inside them, and tests/sanitizers/tsan_grpc.supp names the few gRPC
  # hand-off functions whose ordering lives in gRPC's core and the threads gRPC's core makes and
  # joins after exit can begin (each entry says why). Our own code is instrumented throughout.
  # Every process writes its reports under $tsan_logs, and any report fails the stage, whichever
  # process it came from.
  configure build-tsan -DATTN_SANITIZE=thread
  timed "tsan build" cmake --build build-tsan --target attn_server_unit_tests attnserve attnctl \
    attnload attn_e2e_tests attn_client_e2e_tests attn_security_e2e_tests \
    attn_data_channel_e2e_tests
  tsan_logs="$PWD/build-tsan/tsan-reports"
  rm -rf "$tsan_logs" && mkdir -p "$tsan_logs"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$PWD/tests/sanitizers/tsan_grpc.supp:log_path=$tsan_logs/report"
  tsan_failed=0
  timed "tsan unit tests x20" build-tsan/bin/attn_server_unit_tests --gtest_repeat=20 \
    --gtest_brief=1 --gtest_filter='-SplitBackwardTest.*' || tsan_failed=1
  # The split-backward tests compute whole backwards on the CPU engine: 32 s under TSan on a
  # 2-core machine, where one pass of every other test takes 4 (a minute and a half with their
  # earlier, larger problems; 20 repeats made this stage 20 minutes). Their threads are the
  # reference kernels' work items, which one pass covers.
  build-tsan/bin/attn_server_unit_tests --gtest_brief=1 --gtest_filter='SplitBackwardTest.*' ||
    tsan_failed=1
  for e2e in attn_e2e_tests attn_client_e2e_tests attn_security_e2e_tests \
             attn_data_channel_e2e_tests; do
    timed "tsan $e2e" "build-tsan/bin/$e2e" --gtest_brief=1 || tsan_failed=1
  done
  # Without the compute_timed tests (pytest.ini): their blockers and deadlines assume CPU
  # kernels ~10x faster than TSan's.
  ATTNSERVE_BIN="$PWD/build-tsan/bin/attnserve" timed "tsan pytest" .venv/bin/python -m pytest \
    tests/python -q -p no:cacheprovider -m "not compute_timed" --durations=10 || tsan_failed=1
  if compgen -G "$tsan_logs/report*" >/dev/null; then
    echo "ThreadSanitizer reports:" >&2
    cat "$tsan_logs"/report* >&2
    tsan_failed=1
  fi
  [ "$tsan_failed" = 0 ]
fi

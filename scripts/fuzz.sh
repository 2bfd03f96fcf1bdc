#!/usr/bin/env bash
# Runs every libFuzzer target for a bounded time on its committed seed corpus.
#   scripts/fuzz.sh [build_dir=build-asan] [seconds_per_target=45]
# The targets run side by side (one per core). New inputs go to a scratch corpus, so the
# committed one only changes by hand; a crash, leak or hang leaves its input in
# $FUZZ_ARTIFACTS (default build_dir/fuzz-artifacts) and fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build-asan}"
SECONDS_PER_TARGET="${2:-45}"
ARTIFACTS="${FUZZ_ARTIFACTS:-$BUILD_DIR/fuzz-artifacts}"
TARGETS=(request_fuzzer http_fuzzer data_frame_fuzzer rest_body_fuzzer)
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

mkdir -p "$ARTIFACTS"
pids=()
for target in "${TARGETS[@]}"; do
  work="$BUILD_DIR/fuzz-corpus/$target"
  mkdir -p "$work"
  dict=()
  [ -f "tests/fuzz/${target%_fuzzer}.dict" ] && dict=(-dict="tests/fuzz/${target%_fuzzer}.dict")
  # -timeout: one input taking longer is a finding (the request fuzzer caps its work per
  # input); -rss_limit_mb: leaves room for ASan's shadow while catching runaway allocations.
  "$BUILD_DIR/bin/$target" "$work" "tests/fuzz/corpus/$target" "${dict[@]}" \
    -max_total_time="$SECONDS_PER_TARGET" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$ARTIFACTS/$target-" >"$ARTIFACTS/$target.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!TARGETS[@]}"; do
  if wait "${pids[$i]}"; then
    echo "fuzz: ${TARGETS[$i]}: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' \
      "$ARTIFACTS/${TARGETS[$i]}.log" | grep -o '[0-9]*$') inputs, no findings"
  else
    echo "fuzz: ${TARGETS[$i]} FAILED; log and input in $ARTIFACTS/" >&2
    tail -n 60 "$ARTIFACTS/${TARGETS[$i]}.log" >&2
    status=1
  fi
done
exit $status

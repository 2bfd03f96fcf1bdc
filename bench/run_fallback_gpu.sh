#!/usr/bin/env bash
# The fallback family on the GPU machine in one call: build the kernels standalone (sm_90 only
# for speed: the sm70/sm75 code paths run on it through ExecutionContext::compute_capability),
# run the fallback GPU tests, then the forward and backward benchmarks against PyTorch's
# memory-efficient kernel. Logs and tables go to $OUT (default /tmp/attn_gpu_out).
#
#   bench/run_fallback_gpu.sh [--skip-tests] [--skip-bench] [--quick-tests]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/attn_gpu_out}"
mkdir -p "$OUT"
run_tests=1
run_bench=1
pytest_filter=()
for arg in "$@"; do
  case "$arg" in
    --skip-tests) run_tests=0 ;;
    --skip-bench) run_bench=0 ;;
    --quick-tests) pytest_filter=(-k "not long_sequences") ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done
export PYTHONUNBUFFERED=1

{
  nvidia-smi -L
  nvcc --version | tail -2
  python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
} 2>&1 | tee "$OUT/env.log"

start=$(date +%s)
if ! { cmake -S kernels -B build-gpu -G Ninja -DATTN_BUILD_TESTS=OFF \
         -DCMAKE_CUDA_ARCHITECTURES=90 -DATTN_FALLBACK_PTXAS_VERBOSE=ON &&
       cmake --build build-gpu -j "$(nproc)" --target attn_capi; } >"$OUT/build.log" 2>&1; then
  grep -E "error|Error" "$OUT/build.log" | head -40
  tail -30 "$OUT/build.log"
  echo "BUILD FAILED"
  exit 1
fi
echo "build: $(( $(date +%s) - start )) s"
grep -E "spill stores" "$OUT/build.log" | grep fallback | sort | uniq -c | head -40

status=0
export ATTN_CAPI="$PWD/build-gpu/lib/libattn_capi.so"
if ((run_tests)); then
  start=$(date +%s)
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest tests/kernels/gpu/test_fallback_forward.py \
    tests/kernels/gpu/test_fallback_backward.py -q -rfE -p no:cacheprovider \
    --maxfail=50 "${pytest_filter[@]}" 2>&1 | tee "$OUT/pytest.log" | grep -vE "^\.|^$" | tail -80
  status=${PIPESTATUS[0]}
  echo "tests: $(( $(date +%s) - start )) s"
fi
if ((run_bench)); then
  timeout "${BENCH_TIMEOUT:-240}" python3 bench/bench_fallback.py --markdown "$OUT/bench_fwd.md" \
    2>&1 | tee "$OUT/bench_fwd.log" | tail -3
  timeout "${BENCH_TIMEOUT:-240}" python3 bench/bench_fallback.py --backward \
    --markdown "$OUT/bench_bwd.md" 2>&1 | tee "$OUT/bench_bwd.log" | tail -3
  cat "$OUT/bench_fwd.md" "$OUT/bench_bwd.md" 2>/dev/null
fi
if ((run_tests)); then
  echo "pytest: $(tail -1 "$OUT/pytest.log")"
fi
exit "$status"

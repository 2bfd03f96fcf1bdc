#!/usr/bin/env bash
# Everything the GPU machine does in one call: build the kernels standalone with its nvcc and
# cmake, run the GPU correctness tests, run the forward and backward benchmarks. Logs and results go to $OUT
# (default /tmp/attn_gpu_out); the last lines printed are the test summary and the table.
#
#   bench/run_gpu.sh [--skip-tests] [--skip-bench] [--skip-fwd-bench] [--skip-bwd-bench]
#                    [--bwd-variant NAME=FLAGS]... [--fwd-variant NAME=FLAGS]... [--tests PATH]
#                    [--bwd-head-dims LIST] [--head-dims LIST] [--bwd-path-column NAME=OFF]...
#                    [--bwd-atomic-only] [--bwd-variant-tests EXPR] [--ref-tree DIR]
#
# --tests PATH runs only that part of tests/kernels/gpu (a file or a pytest node id);
# --bwd-head-dims LIST (default 64,128,192,256) limits the backward benchmark's rows.
# --head-dims LIST (e.g. "192;256") builds only those head dims (ATTN_HEAD_DIMS; a shorter build).
# --bwd-path-column NAME=OFF (repeatable) adds a backward benchmark column NAME: the same
# build with code path OFF disabled (bench_flash.py --lib; e.g. ours-sm80bwd=no-sm90-bwd).
# --bwd-variant NAME=FLAGS (repeatable) builds the kernels once more (hdim 64/128, or --head-dims) with FLAGS
# added to the C++ and CUDA flags (e.g. "-DATTN_FLASH_SM90_FWD_STAGES=3", a knob of
# kernels/flash/tuning.h) and adds NAME as columns of the backward benchmark;
# --fwd-variant NAME=FLAGS (repeatable) the same for a forward knob: its build (also in
# build-gpu-bwd-NAME/) becomes columns of the forward benchmark.
# --bwd-atomic-only times the atomic-dQ mode only (no NAME-det columns), for a variant of the
# dQ work that only the atomic mode does (dQ by tile in the dK/dV kernel).
# --bwd-variant-tests EXPR runs, after the benchmarks, the --tests PATH cases selected by
# pytest -k EXPR against each --bwd-variant and --fwd-variant build (all at once, the backward
# tests in the device path's atomic mode only, each within $VARIANT_TEST_TIMEOUT seconds if
# set; logs $OUT/pytest-NAME.log).
# --ref-tree DIR builds another checkout of the project (e.g. `git archive main` unpacked into
# the ignored .ref-tree/, sent with the run tool's carry) with the same head dims and adds it as
# the column `ref` to both benchmarks: a change measured side by side with what it replaces.
# TEST_TIMEOUT=SECONDS bounds the main test run (a kernel that hangs on a barrier fails it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/attn_gpu_out}"
mkdir -p "$OUT"
run_tests=1
run_bench=1
run_fwd_bench=1
run_bwd_bench=1
bwd_variants=()
fwd_variants=()
test_path=tests/kernels/gpu
bwd_head_dims=64,128,192,256
build_head_dims=()
variant_head_dims="64;128"
bwd_path_columns=()
bwd_bench_flags=()
variant_tests=""
ref_tree=""
# Options that take a value need one.
value_of() {  # option, remaining argument count
  if (($2 < 2)); then echo "$1 needs a value" >&2; exit 2; fi
}
while (($#)); do
  case "$1" in
    --bwd-variant) value_of "$1" $#; bwd_variants+=("$2"); shift ;;
    --fwd-variant) value_of "$1" $#; fwd_variants+=("$2"); shift ;;
    --tests) value_of "$1" $#; test_path="$2"; shift ;;
    --bwd-head-dims) value_of "$1" $#; bwd_head_dims="$2"; shift ;;
    --head-dims)
      value_of "$1" $#
      build_head_dims=("-DATTN_HEAD_DIMS=$2")
      variant_head_dims="$2"
      shift
      ;;
    --bwd-path-column) value_of "$1" $#; bwd_path_columns+=("$2"); shift ;;
    --bwd-variant-tests) value_of "$1" $#; variant_tests="$2"; shift ;;
    --ref-tree) value_of "$1" $#; ref_tree="$2"; shift ;;
    --bwd-atomic-only) bwd_bench_flags+=("--no-deterministic") ;;
    --skip-tests) run_tests=0 ;;
    --skip-bench) run_bench=0 ;;
    --skip-fwd-bench) run_fwd_bench=0 ;;
    --skip-bwd-bench) run_bwd_bench=0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
JOBS="$(nproc)"
export PYTHONUNBUFFERED=1

{
  nvidia-smi -L
  nvcc --version | tail -2
  python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
} 2>&1 | tee "$OUT/env.log"

configure_and_build() {  # build_dir log [extra cmake args...]
  local dir="$1" log="$2"
  shift 2
  # SOURCE_TREE: another checkout to build (--ref-tree); this one by default.
  { cmake -S "${SOURCE_TREE:-.}/kernels" -B "$dir" -G Ninja -DATTN_BUILD_TESTS=OFF \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DATTN_FLASH_PTXAS_VERBOSE=ON "$@" &&
      cmake --build "$dir" -j "$JOBS"; } >"$log" 2>&1
}

start=$(date +%s)
if ! configure_and_build build-gpu "$OUT/build.log" "${build_head_dims[@]}"; then
  tail -50 "$OUT/build.log"
  echo "BUILD FAILED"
  exit 1
fi
echo "build: $(( $(date +%s) - start )) s"
grep -E "spill stores" "$OUT/build.log" | sort | uniq -c

ref_libs=()
if [[ -n "$ref_tree" ]]; then
  SOURCE_TREE="$ref_tree" configure_and_build build-gpu-ref "$OUT/build-ref.log" \
    "${build_head_dims[@]}" &
  ref_libs=("--lib" "ref=$PWD/build-gpu-ref/lib/libattn_capi.so")
fi

bwd_variant_libs=()
fwd_variant_libs=()
for spec in "${bwd_variants[@]}" "${fwd_variants[@]}"; do
  name="${spec%%=*}"
  flags="${spec#*=}"
  dir="build-gpu-bwd-$name"
  configure_and_build "$dir" "$OUT/build-bwd-variant.log.$name" -DATTN_HEAD_DIMS="$variant_head_dims" \
    "-DCMAKE_CUDA_FLAGS=$flags" "-DCMAKE_CXX_FLAGS=$flags" &
done
for spec in "${bwd_variants[@]}"; do
  bwd_variant_libs+=("--lib" "${spec%%=*}=build-gpu-bwd-${spec%%=*}/lib/libattn_capi.so")
done
for spec in "${fwd_variants[@]}"; do
  fwd_variant_libs+=("--lib" "${spec%%=*}=build-gpu-bwd-${spec%%=*}/lib/libattn_capi.so")
done

status=0
export ATTN_CAPI="$PWD/build-gpu/lib/libattn_capi.so"
for spec in "${bwd_path_columns[@]}"; do
  bwd_variant_libs+=("--lib" "${spec%%=*}=$ATTN_CAPI+${spec#*=}")
done
if ((run_tests)); then
  timeout "${TEST_TIMEOUT:-0}" python3 -m pytest "$test_path" -q -rfE -p no:cacheprovider 2>&1 |
    tee "$OUT/pytest.log"
  status=${PIPESTATUS[0]}
fi
wait
for log in "$OUT"/build-bwd-variant.log.*; do
  [[ -e "$log" ]] && grep -E "spill stores|error" "$log" | sort | uniq -c
done

if ((run_bench && run_fwd_bench)); then
  python3 bench/bench_flash.py --lib "ours=$ATTN_CAPI" "${fwd_variant_libs[@]}" "${ref_libs[@]}" \
    --markdown "$OUT/bench.md" 2>&1 | tee "$OUT/bench.log"
fi
if ((run_bench && run_bwd_bench)); then
  python3 bench/bench_flash.py --backward --head-dims "$bwd_head_dims" --lib "ours=$ATTN_CAPI" \
    "${bwd_variant_libs[@]}" "${ref_libs[@]}" "${bwd_bench_flags[@]}" \
    --markdown "$OUT/bench_bwd.md" 2>&1 |
    tee "$OUT/bench_bwd.log"
fi
if [[ -n "$variant_tests" ]]; then
  for spec in "${bwd_variants[@]}" "${fwd_variants[@]}"; do
    name="${spec%%=*}"
    ATTN_CAPI="$PWD/build-gpu-bwd-$name/lib/libattn_capi.so" ATTN_TEST_BWD_DEVICE_ATOMIC_ONLY=1 \
      timeout "${VARIANT_TEST_TIMEOUT:-0}" python3 -m pytest "$test_path" -q -rfE \
      -p no:cacheprovider -k "$variant_tests" >"$OUT/pytest-$name.log" 2>&1 &
  done
  wait
  for spec in "${bwd_variants[@]}" "${fwd_variants[@]}"; do
    name="${spec%%=*}"
    echo "pytest $name: $(tail -1 "$OUT/pytest-$name.log")"
  done
fi
if ((run_tests)); then
  echo "pytest: $(tail -1 "$OUT/pytest.log")"
fi
exit "$status"

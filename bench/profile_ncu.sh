#!/usr/bin/env bash
# Nsight Compute profile of one benchmark row on the GPU machine: builds the kernels (as
# run_gpu.sh does, only the head dims asked for), profiles the first launch of the kernels whose
# name matches KERNEL_REGEX while bench_flash.py times that row, and writes the report, its
# details page and the per-instruction SASS page (stall samples) under $OUT.
#
#   bench/profile_ncu.sh KERNEL_REGEX HEAD_DIM SEQS CAUSAL(yes|no) [--backward]
#
# e.g. bench/profile_ncu.sh FlashBackwardDkDvSm90 64 1x16384 yes --backward
# Clocks are left alone (--clock-control none), as device/METHOD.md asks.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/attn_gpu_out}"
mkdir -p "$OUT"
if (($# < 4)); then sed -n 2,10p "$0"; exit 2; fi
regex="$1" head_dim="$2" seqs="$3" causal="$4"
shift 4
bench/run_gpu.sh --skip-tests --skip-bench --head-dims "$head_dim" >"$OUT/profile-build.log" 2>&1 ||
  { tail -30 "$OUT/profile-build.log"; exit 1; }
report="$OUT/profile"
ncu --clock-control none -k "regex:$regex" -c 1 --set full --import-source no -f -o "$report" \
  python3 bench/bench_flash.py --lib ours=build-gpu/lib/libattn_capi.so --head-dims "$head_dim" \
  --seqs "$seqs" --causal "$causal" --warmup 0 --repeats 1 --no-deterministic "$@" \
  >"$OUT/profile-run.log" 2>&1 || { tail -30 "$OUT/profile-run.log"; exit 1; }
ncu --import "$report.ncu-rep" --page details >"$OUT/profile-details.txt" 2>&1
ncu --import "$report.ncu-rep" --page source --print-source sass --csv \
  >"$OUT/profile-sass.csv" 2>&1
tail -5 "$OUT/profile-run.log"
grep -E "Duration|Throughput|Pipe|Stall|Issue Slot|Warp Cycles|Eligible|Active Warps" \
  "$OUT/profile-details.txt" | head -60

#!/usr/bin/env bash
# Nsight Compute profile of one benchmark row on the GPU machine: builds the kernels (as
# run_gpu.sh does, only the head dims asked for; PROFILE_SKIP_BUILD=1 keeps the build-gpu of an
# earlier call), profiles the first launch of the kernels whose name matches KERNEL_REGEX while
# bench_flash.py times that row, and writes the report, its details page, the per-instruction
# SASS page (stall samples) and that page's summary (bench/ncu_stalls.py) as one tarball under
# $OUT.
#
#   bench/profile_ncu.sh KERNEL_REGEX HEAD_DIM SEQS CAUSAL(yes|no) [--backward]
#
# e.g. bench/profile_ncu.sh FlashBackwardDkDvSm90Kernel 64 1x16384 yes --backward
# Clocks are left alone (--clock-control none), as device/METHOD.md asks.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/attn_gpu_out}"
if (($# < 4)); then sed -n 2,11p "$0"; exit 2; fi
regex="$1" head_dim="$2" seqs="$3" causal="$4"
shift 4
name="profile-$head_dim-$seqs-causal-$causal"
dir="$OUT/$name"
mkdir -p "$dir"
if [[ "${PROFILE_SKIP_BUILD:-0}" != 1 ]]; then
  bench/run_gpu.sh --skip-tests --skip-bench --head-dims "$head_dim" >"$dir/build.log" 2>&1 ||
    { tail -30 "$dir/build.log"; exit 1; }
fi
ncu --clock-control none -k "regex:$regex" -c 1 --set full --import-source no -f -o "$dir/report" \
  python3 bench/bench_flash.py --lib ours=build-gpu/lib/libattn_capi.so --head-dims "$head_dim" \
  --seqs "$seqs" --causal "$causal" --warmup 0 --repeats 1 --no-deterministic "$@" \
  >"$dir/run.log" 2>&1 || { tail -30 "$dir/run.log"; exit 1; }
ncu --import "$dir/report.ncu-rep" --page details >"$dir/details.txt" 2>&1
ncu --import "$dir/report.ncu-rep" --page source --print-source sass --csv >"$dir/sass.csv" 2>&1
python3 bench/ncu_stalls.py "$dir/sass.csv" --top 25 >"$dir/stalls.txt" 2>&1
grep -E "Duration|Issue Slots Busy|Eligible Warps|Registers Per" "$dir/details.txt"
tar czf "$dir.tgz" -C "$OUT" "$name" && rm -rf "$dir"

#!/usr/bin/env bash
# Two GPUs against one, on a host with (at least) two: the server built here (carried in a
# bundle folder, default .gpu-bundle/ from scripts/make_gpu_bundle.sh; ATTN_BUNDLE=<folder> picks
# another) serves the same closed-loop attnload mix first with --devices=0, then with
# --devices=auto (every GPU; placement spreads requests by estimated finish time), one after the
# other in this run. Mixes (forward and backward, bf16, head_dim 128, one sequence per request;
# MIXES="long very_long compute_bound" by default):
#   long           16 heads, 8k-16k tokens
#   very_long      8 heads, 32k-48k tokens (4x the FLOPs per byte of long)
#   compute_bound  2 heads, 128k-256k tokens (16x; a backward request is ~650 MB, under the
#                  1 GiB message limit)
# Why three: attention's FLOPs per byte moved grow only with sequence length (about S/2 FLOP per
# byte forward), so at 12k tokens one H100 running flash (~300 TFLOP/s) would need ~50 GB/s of
# tensors to stay busy, while loopback gRPC and the host copies move a few GB/s: the long mix
# measures the transport, not the GPUs. At 128k-256k tokens a GPU needs only ~1-2 GB/s, so the
# compute_bound mix is the one where a second GPU can double the throughput; very_long sits in
# between. KERNEL=fallback (or another family) forces that family on every GPU.
# Each configuration also reports the GPUs' mean utilization and the server's CPU use.
# DEVICES (default "0 auto") lists the configurations' --devices; SERVER_ENV sets environment
# variables for the server alone (e.g. LD_PRELOAD=... to try another allocator).
# Prints a table (req/s, TFLOP/s, p50/p99, two-GPU speed-up per mix); JSON and logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/attnserve-multi-gpu}"
BUNDLE="${ATTN_BUNDLE:-.gpu-bundle}"
DURATION="${DURATION:-30s}"  # long requests: few per second, so measure long enough
CONCURRENCY="${CONCURRENCY:-16}"
KERNEL="${KERNEL:-}"
MIXES="${MIXES:-long very_long compute_bound}"
SERVER_FLAGS="${SERVER_FLAGS:-}"  # more attnserve flags for every configuration, e.g. --cuda_lanes=4
ATTNLOAD_FLAGS="${ATTNLOAD_FLAGS:-}"  # more attnload flags, e.g. --data_connections=8
MIN_GPUS="${MIN_GPUS:-2}"  # MIN_GPUS=1: a dry run of the script itself on a one-GPU host
DEVICES="${DEVICES:-0 auto}"  # the --devices of each configuration, in order
SERVER_ENV="${SERVER_ENV:-}"  # environment for the server alone, e.g. LD_PRELOAD=...
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
bin=$BUNDLE/bin

gpus=$(nvidia-smi -L | wc -l)
nproc; nvidia-smi -L
if [ "$gpus" -lt "$MIN_GPUS" ]; then
  echo "multi_gpu_bench: this host has $gpus GPU(s); it needs $MIN_GPUS" >&2
  exit 1
fi

declare -A MIX_FLAGS=(
  [long]="--heads=16 --shape=uniform:batch=1,seqlen=8192-16384 --pool_size=8"
  [very_long]="--heads=8 --shape=uniform:batch=1,seqlen=32768-49152 --pool_size=8"
  # Two pooled requests: attnload draws ~1.8 G random values for a pool of 8 at these sizes,
  # about a minute before the load starts.
  [compute_bound]="--heads=2 --shape=uniform:batch=1,seqlen=131072-262144 --pool_size=2"
)

run() {  # mix, devices
  local mix=$1 devices=$2 name="$1_devices_${2//,/_}"
  local server_flags=(--devices="$devices" --grpc_port=8111 --http_port=8110)
  [ -n "$KERNEL" ] && server_flags+=(--kernel="$KERNEL")
  # shellcheck disable=SC2206
  server_flags+=($SERVER_FLAGS)
  # shellcheck disable=SC2086
  env $SERVER_ENV "$bin/attnserve" "${server_flags[@]}" >"$OUT/server_$name.log" 2>&1 &
  local server=$!
  for _ in $(seq 1 150); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8110/readyz')" \
      2>/dev/null && break
    sleep 0.2
  done
  # GPU utilization (sampled every 0.5 s, warm-up included) and the server's CPU time over the
  # attnload run say which side is the limit: busy GPUs, or a busy host with idle GPUs.
  nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader,nounits -lms 500 \
    >"$OUT/gpu_util_$name.csv" 2>/dev/null &
  local sampler=$!
  # Each device's queue, estimated queued work and reserved memory (nonzero while a job runs),
  # every 0.25 s: a GPU idle with jobs queued is the lanes' fault, one idle with none is
  # placement's or the clients'.
  (while kill -0 "$server" 2>/dev/null; do
    echo "t $(date +%s.%N)"
    curl -s http://127.0.0.1:8110/metrics |
      grep -E '^attnserve_(queue_depth|device_queued_work_seconds|device_memory_reserved_bytes)[{]'
    sleep 0.25
  done) >"$OUT/queues_$name.txt" 2>/dev/null &
  local queue_sampler=$!
  local cpu_before wall_before
  cpu_before=$(awk '{print $14 + $15}' "/proc/$server/stat")
  wall_before=$(date +%s.%N)
  # 8 gRPC channels and 8 data connections: 4 left the GPUs without a running job a quarter
  # of the time on this mix (bench/RESULTS.md, two GPUs).
  # shellcheck disable=SC2086
  "$bin/attnload" --target=localhost:8111 --concurrency="$CONCURRENCY" --connections=8 \
    --data_connections=8 --duration="$DURATION" --warmup=3s ${MIX_FLAGS[$mix]} --head_dim=128 --dtype=bf16 \
    --rpc=mixed --backward_fraction=0.5 --check=0 --progress=false $ATTNLOAD_FLAGS \
    --output_json="$OUT/$name.json" >"$OUT/$name.txt" 2>&1
  local cpu_after wall_after
  cpu_after=$(awk '{print $14 + $15}' "/proc/$server/stat")
  wall_after=$(date +%s.%N)
  kill "$sampler" "$queue_sampler" 2>/dev/null; wait "$sampler" "$queue_sampler" 2>/dev/null
  python3 bench/host_load_summary.py "$OUT/gpu_util_$name.csv" "$cpu_before" "$cpu_after" \
    "$wall_before" "$wall_after" "$(getconf CLK_TCK)" "${DURATION%s}" >"$OUT/host_$name.txt"
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8110/metrics').read().decode())" \
    >"$OUT/metrics_$name.txt"
  kill -TERM "$server"; wait "$server"
  echo "== $name"
  cat "$OUT/$name.txt" "$OUT/host_$name.txt"
  python3 bench/queue_timeline.py "$OUT/queues_$name.txt"
  # Where each request's time went: placements per GPU, kernel time, time queued, and the
  # lanes' phases (gathering into pinned memory, device work and copies, cutting answers out).
  grep -E '^attnserve_(placements_total|compute_duration_seconds_(sum|count)|queue_duration_seconds_(sum|count)|launch_phase_duration_seconds_(sum|count))' \
    "$OUT/metrics_$name.txt" || true
}

for mix in $MIXES; do
  for devices in $DEVICES; do
    run "$mix" "$devices"
  done
done

python3 - "$OUT" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
runs = {}
MIXES = ("long", "very_long", "compute_bound")
for mix in MIXES:
    for devices in ("0", "auto"):
        path = out / f"{mix}_devices_{devices}.json"
        if path.exists():
            runs[(mix, devices)] = json.loads(path.read_text())["runs"][0]
print("\n| mix | devices | req/s | TFLOP/s | p50 ms | p99 ms | errors |")
print("|---|---|---|---|---|---|---|")
for (mix, devices), run in runs.items():
    latency = run["latency_ms"]
    print(f"| {mix} | {devices} | {run['throughput_rps']:.2f} | {run['tflops']:.1f} | "
          f"{latency['p50']:.1f} | {latency['p99']:.1f} | {run['errors']} |")
speedup = {}
for mix in MIXES:
    if (mix, "0") in runs and (mix, "auto") in runs:
        speedup[mix] = runs[(mix, "auto")]["throughput_rps"] / runs[(mix, "0")]["throughput_rps"]
        print(f"{mix}: two GPUs / one GPU throughput = {speedup[mix]:.2f}x (target >= 1.8x)")
(out / "multi_gpu_summary.json").write_text(json.dumps(
    {"speedup": speedup, "runs": {f"{m}/{d}": r for (m, d), r in runs.items()}}, indent=2))
EOF

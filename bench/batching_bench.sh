#!/usr/bin/env bash
# Dynamic batching on the GPU machine, in one go: the server built here (carried in a bundle
# folder, default .gpu-bundle/ from scripts/make_gpu_bundle.sh; ATTN_BUNDLE=<folder> picks
# another) loaded by attnload with 64 concurrent clients sending small forwards (one 512-token
# sequence, 16 heads, head_dim 128, bf16) over loopback, in several server configurations one
# after the other: batching off and on, with 2 and 4 lanes per GPU, and a transport ceiling
# (every request refused right after it is received and parsed, so nothing but gRPC moves), and
# a forward/backward mix with batching on whose answers are checked.
# Prints one block per configuration, with where the server's launch time went (the
# attnserve_launch_phase_duration_seconds sums); JSON and logs under $OUT.
# RUNS="batching_off transport_ceiling" runs only the named configurations; SERVER_ENV sets
# environment variables for the server alone, e.g. SERVER_ENV="LD_PRELOAD=/path/lib.so";
# SHAPE replaces the request shape (attnload --shape, default fixed:batch=1,seqlen=512), e.g.
# SHAPE=fixed:batch=1,seqlen=64 for requests whose cost is the launch rather than the bytes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/attnserve-batching}"
BUNDLE="${ATTN_BUNDLE:-.gpu-bundle}"
DURATION="${DURATION:-10s}"
RUNS="${RUNS:-}"  # empty: every configuration
SERVER_ENV="${SERVER_ENV:-}"
SHAPE="${SHAPE:-fixed:batch=1,seqlen=512}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
bin=$BUNDLE/bin

metrics() {
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8100/metrics').read().decode())"
}

run() {  # name, attnload --check value, server flags...
  local name=$1 check=$2; shift 2
  [ -z "$RUNS" ] || [[ " $RUNS " == *" $name "* ]] || return 0
  # shellcheck disable=SC2086
  env $SERVER_ENV "$bin/attnserve" --devices=auto --grpc_port=8101 --http_port=8100 "$@" >"$OUT/server_$name.log" 2>&1 &
  local server=$!
  for _ in $(seq 1 150); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8100/readyz')" \
      2>/dev/null && break
    sleep 0.2
  done
  "$bin/attnload" --target=localhost:8101 --concurrency=64 --connections=8 --duration="$DURATION" \
    --warmup=2s --shape="$SHAPE" --heads=16 --head_dim=128 --dtype=bf16 \
    --pool_size=64 --check="$check" --progress=false --output_json="$OUT/$name.json" \
    ${LOAD_EXTRA:-} >"$OUT/$name.txt" 2>&1
  echo "== $name ($*)"
  cat "$OUT/$name.txt"
  metrics >"$OUT/metrics_$name.txt"
  grep -E '^attnserve_(batch_requests_(sum|count)|launch_phase_duration_seconds_(sum|count)|queue_duration_seconds_(sum|count)|rejections_total)' \
    "$OUT/metrics_$name.txt" || true
  kill -TERM "$server"; wait "$server"
}

nproc; nvidia-smi -L
run batching_off 50 --batching=false
run batching_on 50 --batching=true --max_queue_delay_us=500
# Two answer threads per lane against the default one: a batched launch posts all its answers at
# once, an unbatched lane one at a time.
run batching_on_2answer 50 --batching=true --max_queue_delay_us=500 --answer_threads_per_lane=2
run batching_off_2answer 50 --batching=false --answer_threads_per_lane=2
# Inputs gathered into pinned memory by the lane's own thread alone, against four (the default).
run batching_off_1stage 50 --batching=false --stage_threads_per_lane=1
run batching_off_4lanes 50 --batching=false --cuda_lanes=4
run batching_on_4lanes 50 --batching=true --max_queue_delay_us=500 --cuda_lanes=4
# Every request is over --max_total_tokens (CEILING_MAX_TOKENS: below the shape's tokens, e.g. 32
# with SHAPE=fixed:batch=1,seqlen=64): it crosses gRPC and is parsed, then refused; what this
# reaches is the transport's ceiling for the inbound tensors alone (6 MB at the default shape).
run transport_ceiling 0 --max_total_tokens="${CEILING_MAX_TOKENS:-256}"
# Correctness of batched backward too (gathered lse, split dq/dk/dv): every 5th response of a
# forward/backward mix checked against the local reference.
LOAD_EXTRA="--rpc=mixed --duration=5s" run batching_on_mixed_check 5 --batching=true \
  --max_queue_delay_us=500

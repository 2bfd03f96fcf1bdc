#!/usr/bin/env bash
# Dynamic batching on the GPU machine, in one go: the server built here (carried in
# .gpu-bundle/, see scripts/make_gpu_bundle.sh) with batching on and then off, each loaded by
# attnload with 64 concurrent clients sending small forwards (one 512-token sequence, 16 heads,
# head_dim 128, bf16) over loopback. Prints one table row per configuration; JSON under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/attnserve-batching}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.gpu-bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
bin=.gpu-bundle/bin

run() {  # name, server flags...
  local name=$1; shift
  "$bin/attnserve" --devices=auto --grpc_port=8101 --http_port=8100 "$@" >"$OUT/server_$name.log" 2>&1 &
  local server=$!
  for _ in $(seq 1 150); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8100/readyz')" \
      2>/dev/null && break
    sleep 0.2
  done
  "$bin/attnload" --target=localhost:8101 --concurrency=64 --connections=8 --duration=10s \
    --warmup=2s --shape=fixed:batch=1,seqlen=512 --heads=16 --head_dim=128 --dtype=bf16 \
    --pool_size=64 --check=50 --progress=false --output_json="$OUT/$name.json" >"$OUT/$name.txt" 2>&1
  echo "== $name ($*)"
  cat "$OUT/$name.txt"
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8100/metrics').read().decode())" \
    | grep -E '^attnserve_batch_requests_(sum|count)' || true
  kill -TERM "$server"; wait "$server"
}

nproc; nvidia-smi -L
run batching_on --batching=true --max_queue_delay_us=500
run batching_off --batching=false

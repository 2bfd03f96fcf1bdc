#!/usr/bin/env bash
# Sets up, builds, starts attnserve --devices=auto (all GPUs, else the CPU) on the default
# ports, and runs the demo client: forward and backward on random packed sequences, printing
# where each ran and its error against the local reference. Stops the server at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh

GRPC_PORT="${GRPC_PORT:-8001}"
HTTP_PORT="${HTTP_PORT:-8000}"
build/bin/attnserve --devices=auto --grpc_port="$GRPC_PORT" --http_port="$HTTP_PORT" &
server_pid=$!
trap 'kill -TERM "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null || true' EXIT

for _ in $(seq 1 100); do
  if .venv/bin/python - "$HTTP_PORT" <<'PY' 2>/dev/null; then break; fi
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/readyz", timeout=1)
PY
  kill -0 "$server_pid" 2>/dev/null || { echo "demo: attnserve exited during startup" >&2; exit 1; }
  sleep 0.1
done

target="localhost:$GRPC_PORT"
echo "== attnctl info"
build/bin/attnctl --target="$target" info
echo "== attnctl forward --check (4 sequences, bf16, causal, GQA 8:2)"
build/bin/attnctl --target="$target" forward --check --batch=4 --seqlen_q=256 --seqlen_k=256 \
  --heads=8 --heads_k=2 --head_dim=64 --dtype=bf16 --causal
echo "== attnctl backward --check (4 sequences, fp16, sliding window)"
build/bin/attnctl --target="$target" backward --check --batch=4 --seqlen_q=192 --seqlen_k=256 \
  --heads=8 --head_dim=64 --dtype=fp16 --window_left=64 --window_right=0
echo "== demo finished; stopping attnserve"

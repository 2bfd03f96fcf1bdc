#!/usr/bin/env bash
# Grouped data channel calls on the GPU machine (issue 24 item 3): starts the server built here
# (a bundle folder, default .gpu-bundle/ from scripts/make_gpu_bundle.sh; ATTN_BUNDLE=<folder>
# picks another) and runs bench/overlap_gpu.py against it: grouped forward and backward (plain
# and by a kept context) against gRPC, bitwise or within bf16 tolerance, then the torch drop-in
# step and a large numpy forward with the clients' group_chunks on and off. Exits non-zero when
# a check fails; the server log goes under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/attnserve-overlap}"
BUNDLE="${ATTN_BUNDLE:-.gpu-bundle}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
"$BUNDLE/bin/attnserve" --devices=auto --grpc_port=8101 --http_port=8100 --data_port=8102 \
  >"$OUT/server.log" 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server' EXIT
for _ in $(seq 1 150); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8100/readyz')" \
    2>/dev/null && break
  sleep 0.2
done
PYTHONPATH="$PWD/client/python:$PWD/bench:${PYTHONPATH:-}" python3 bench/overlap_gpu.py \
  --target=localhost:8101 "$@"
status=$?
curl -s http://127.0.0.1:8100/metrics | grep -E '^attnserve_data_(overlap_seconds_(sum|count)|engine_seconds_total)'
exit $status

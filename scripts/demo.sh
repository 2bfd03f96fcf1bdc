#!/usr/bin/env bash
# Sets up, builds, starts attnserve --devices=auto (all GPUs, else the CPU) on the default
# ports, and runs the demo client: forward and backward on random packed sequences, printing
# where each ran and its error against the local reference. Stops the server at the end.
# Quick on a fresh machine: it installs only the build's packages (setup.sh --demo), builds only
# attnserve and attnctl into build-demo/ (build/ stays scripts/test.sh's full build), and compiles
# CUDA kernels only for the GPUs present (none without one).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --demo

# With GPUs, CUDA code for their architectures only (compute_cap 9.0 -> 90); ATTN_WITH_CUDA then
# follows whether CMake finds nvcc. Flash starts at sm_75, so an older GPU adds 75 to keep the
# configuration valid (the fallback family serves sm_70). Without a GPU, no CUDA code at all.
cuda_args=(-DATTN_WITH_CUDA=OFF)
caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d '. ' | sort -nu) || caps=""
if [ -n "$caps" ]; then
  archs=$(paste -sd';' <<<"$caps")
  [ "$(head -1 <<<"$caps")" -lt 75 ] && archs="$archs;75"
  cuda_args=(-UATTN_WITH_CUDA "-DCMAKE_CUDA_ARCHITECTURES=$archs")
fi
BUILD_DIR=build-demo BUILD_TARGETS="attnserve attnctl" scripts/build.sh -DATTN_BUILD_TESTS=OFF "${cuda_args[@]}"

GRPC_PORT="${GRPC_PORT:-8001}"
HTTP_PORT="${HTTP_PORT:-8000}"
build-demo/bin/attnserve --devices=auto --grpc_port="$GRPC_PORT" --http_port="$HTTP_PORT" &
server_pid=$!
trap 'kill -TERM "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null || true' EXIT

# Ready when /readyz answers 200; bash's /dev/tcp, so the demo needs no Python or curl.
ready() {
  exec 3<>"/dev/tcp/127.0.0.1/$HTTP_PORT" || return 1
  printf 'GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
  local status
  read -r _ status _ <&3 || true
  exec 3<&-
  [ "$status" = 200 ]
}
for _ in $(seq 1 100); do
  if ready 2>/dev/null; then break; fi
  kill -0 "$server_pid" 2>/dev/null || { echo "demo: attnserve exited during startup" >&2; exit 1; }
  sleep 0.1
done

target="localhost:$GRPC_PORT"
echo "== attnctl info"
build-demo/bin/attnctl --target="$target" info
echo "== attnctl forward --check (4 sequences, bf16, causal, GQA 8:2)"
build-demo/bin/attnctl --target="$target" forward --check --batch=4 --seqlen_q=256 --seqlen_k=256 \
  --heads=8 --heads_k=2 --head_dim=64 --dtype=bf16 --causal
echo "== attnctl backward --check (4 sequences, fp16, sliding window)"
build-demo/bin/attnctl --target="$target" backward --check --batch=4 --seqlen_q=192 --seqlen_k=256 \
  --heads=8 --head_dim=64 --dtype=fp16 --window_left=64 --window_right=0
echo "== demo finished; stopping attnserve"

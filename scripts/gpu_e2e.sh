#!/usr/bin/env bash
# End-to-end on the GPU machine, in one go: start the servers built here (carried in
# .gpu-bundle/, see make_gpu_bundle.sh) with --devices=auto, check one with attnctl, run the
# Python client's GPU tests against them, stop them with SIGTERM. Logs go to $OUT when set.
# Arguments, if any, replace the test selection (default tests/gpu: 101 tests, about 5 minutes on
# an H100, test_launch_split_gpu.py 4.5 of them), e.g.
#   scripts/gpu_e2e.sh tests/gpu/test_server_gpu.py
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/attnserve-gpu-e2e}"
mkdir -p "$OUT"
. scripts/gpu_env.sh

# The GPU as itself; the same GPU routed as a Turing (sm75) one and as an RTX 30xx (sm86, 99 KB
# of shared memory per block); every request forced onto cuBLAS. tests/gpu/test_routing_gpu.py
# checks each.
servers=()
start_server() {  # name grpc_port http_port flags...
  local name=$1 grpc=$2 http=$3
  shift 3
  .gpu-bundle/bin/attnserve --devices=auto --grpc_port="$grpc" --http_port="$http" "$@" \
    >"$OUT/server_$name.log" 2>&1 &
  servers+=($!)
  for _ in $(seq 1 150); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$http/readyz')" \
      2>/dev/null && return 0
    sleep 0.2
  done
  echo "server $name did not become ready"; cat "$OUT/server_$name.log"
}
start_server native 8001 8000 --max_head_dim=512
start_server sm75 8011 8010 --emulate_compute_capability=7.5
start_server sm86 8031 8030 --emulate_compute_capability=8.6
start_server cublas 8021 8020 --kernel=cublas --max_head_dim=512
# Its third launch traps (a real sticky error) and the first reset after it fails:
# tests/gpu/test_device_faults_gpu.py.
start_server faults 8041 8040 --data_port=8042 --inject_device_fault=cuda:0@3/1 \
  --device_reset_interval_seconds=0.2
# CUDA shared memory: tests/gpu/test_cuda_shared_memory_gpu.py registers device memory by IPC.
start_server shm 8051 8050 --data_port=8052 --allow_shared_memory
# Launches of about 2 ms on one lane: tests/gpu/test_launch_split_gpu.py compares its answers
# (CUDA shared memory's too) with the native server's single launches and stops a 2M-token
# request at its deadline.
start_server split 8061 8060 --data_port=8062 --max_launch_seconds=0.002 --cuda_lanes=1 \
  --max_total_tokens=4194304 --allow_shared_memory

status=0
ctl=.gpu-bundle/bin/attnctl
$ctl --target=localhost:8001 info || status=1
$ctl --target=localhost:8001 forward --check --batch=8 --seqlen_q=1024 --seqlen_k=1024 \
  --heads=16 --head_dim=128 --dtype=bf16 --causal || status=1
$ctl --target=localhost:8001 forward --check --batch=3 --seqlen_q=300 --seqlen_k=500 \
  --heads=8 --heads_k=2 --head_dim=64 --dtype=fp16 || status=1
$ctl --target=localhost:8001 backward --check --batch=2 --seqlen_q=64 --seqlen_k=64 \
  --heads=4 --head_dim=64 --dtype=bf16 || status=1
ATTNSERVE_GPU_TARGET=localhost:8001 ATTNSERVE_GPU_EMULATED_TARGET=localhost:8011 \
  ATTNSERVE_GPU_SM86_TARGET=localhost:8031 ATTNSERVE_GPU_CUBLAS_TARGET=localhost:8021 \
  ATTNSERVE_GPU_FAULT_TARGET=localhost:8041 ATTNSERVE_GPU_FAULT_HTTP=http://127.0.0.1:8040 \
  ATTNSERVE_GPU_SHM_TARGET=localhost:8051 ATTNSERVE_GPU_SHM_HTTP=http://127.0.0.1:8050 \
  ATTNSERVE_GPU_HTTP=http://127.0.0.1:8000 ATTNSERVE_GPU_SPLIT_TARGET=localhost:8061 \
  ATTNSERVE_GPU_SPLIT_HTTP=http://127.0.0.1:8060 \
  python3 -m pytest -q -p no:cacheprovider "${@:-tests/gpu}" \
  2>&1 | tee "$OUT/pytest_gpu.log" || status=1
python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/metrics').read().decode())" \
  | grep -E '^attnserve_(requests_total|device_info|compute_duration_seconds_count|device_memory)' || true

for pid in "${servers[@]}"; do
  kill -TERM "$pid"
  wait "$pid"; echo "attnserve (pid $pid) exit code: $?"
done
tail -n 20 "$OUT"/server_*.log
exit $status

#!/usr/bin/env bash
# The fault-injecting soak (tests/soak/soak.py). Arguments go to soak.py and override the
# defaults (e.g. --duration 600 --workers 4).
#
# scripts/soak.sh: builds attnserve if needed and runs 5 minutes of mixed, reference-checked
# client load on the CPU device with cancellations, expiring deadlines, malformed requests,
# killed clients and a SIGTERM + restart half way. Figures: $BUILD_DIR/soak/soak.{json,md}.
#
# scripts/soak.sh --gpu: the GPU soak on the GPU machine, building nothing and needing no venv:
# the server prebuilt in .gpu-bundle/ (make_gpu_bundle.sh; --binary to use another), plain
# python3 (numpy, ml_dtypes, pytest and grpcio; the carried protobuf wheel in .whl/ is
# installed into /tmp/site when needed, see gpu_env.sh). About 9 minutes (510 s of load) on
# --devices=auto in three server lifetimes: the CPU soak's faults plus a small device memory
# budget exceeded by groups of large requests, clients that stop reading, saved contexts
# expiring under load, fp16/bf16 mostly, and a kernel that traps (--inject_device_fault) in
# the second lifetime. Figures: $OUT/soak.{json,md} (OUT defaults to build/soak-gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--gpu" ]; then
  . scripts/gpu_env.sh
  OUT="${OUT:-build/soak-gpu}"
  exec python3 tests/soak/soak.py --binary .gpu-bundle/bin/attnserve --out "$OUT" "$@"
fi
[ -x .venv/bin/python ] || scripts/setup.sh
BUILD_DIR="${BUILD_DIR:-build}"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$BUILD_DIR" --target attnserve
exec .venv/bin/python tests/soak/soak.py --binary "$BUILD_DIR/bin/attnserve" --duration 300 \
  --out "$BUILD_DIR/soak" "$@"

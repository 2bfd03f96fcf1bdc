#!/usr/bin/env bash
# Configures and builds attnserve (Release) into build/ (or $BUILD_DIR); binaries land in bin/
# there. Arguments go to CMake's configure step; $BUILD_TARGETS (space-separated) limits the
# build to those targets (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "$@"
targets=()
for t in ${BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$BUILD_DIR" "${targets[@]}"

#!/usr/bin/env bash
# Builds attnserve if needed and runs the fault-injecting soak (tests/soak/soak.py): 5 minutes
# of mixed, reference-checked client load with cancellations, expiring deadlines, malformed
# requests, killed clients and a SIGTERM + restart half way. Arguments go to soak.py and
# override the defaults (e.g. --duration 600 --workers 4). Figures: $BUILD_DIR/soak/soak.{json,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || scripts/setup.sh
BUILD_DIR="${BUILD_DIR:-build}"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$BUILD_DIR" --target attnserve
exec .venv/bin/python tests/soak/soak.py --binary "$BUILD_DIR/bin/attnserve" --duration 300 \
  --out "$BUILD_DIR/soak" "$@"

#!/usr/bin/env bash
# Sets up, builds and runs every test: C++ unit, kernel and end-to-end tests (ctest), the
# hardening suite (sanitizers, fuzzing), then the Python client's and the deployment assets'
# tests (pytest) against the freshly built server.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/timed.sh
timed setup scripts/setup.sh
timed build scripts/build.sh
timed ctest ctest --test-dir build --output-on-failure -j "$(nproc)"
# ASan+UBSan and TSan builds with the C++ tests, and bounded fuzzing (HARDENING=0 skips it).
if [ "${HARDENING:-1}" != 0 ]; then scripts/test_hardening.sh; fi
ATTNSERVE_BIN="$PWD/build/bin/attnserve" timed pytest .venv/bin/python -m pytest tests/python \
  tests/deploy tests/soak tests/kernels/index_maps -q --durations=10
echo "[timed] scripts/test.sh in all: $SECONDS s" >&2

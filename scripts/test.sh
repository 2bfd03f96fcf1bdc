#!/usr/bin/env bash
# Sets up, builds and runs every test: C++ unit, kernel and end-to-end tests (ctest), then the
# Python client's and the deployment assets' tests (pytest) against the freshly built server.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
ATTNSERVE_BIN="$PWD/build/bin/attnserve" .venv/bin/python -m pytest tests/python tests/deploy -q

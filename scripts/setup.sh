#!/usr/bin/env bash
# Installs every dependency attnserve needs on a fresh Debian 12 machine, idempotently:
# Debian packages for the C++ build, and a project virtualenv (.venv) with the Python ones.
# `scripts/setup.sh --demo` installs only what scripts/demo.sh needs (the compiler and the
# libraries of attnserve and attnctl; no test tools, no virtualenv), so a first run is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
demo_only=0
[ "${1:-}" = "--demo" ] && demo_only=1

# Building attnserve and attnctl (scripts/demo.sh needs nothing more).
APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libcivetweb-dev
  nlohmann-json3-dev  # JSON of the Open Inference Protocol's REST API (transport/http/rest_json.h)
  libssl-dev  # OpenSSL headers; and libssl.so/libcrypto.so, which civetweb opens for HTTPS
  libgoogle-perftools-dev  # tcmalloc: the server's allocator (CMakeLists.txt, ATTN_TCMALLOC)
)
# Testing and benchmarking (scripts/test.sh).
if ((!demo_only)); then
  APT_PACKAGES+=(
    libgtest-dev libgmock-dev libbenchmark-dev
    gnuplot-nox  # draws attnload --sweep's latency/throughput PNG
    prometheus  # prometheus and promtool for tests/deploy (rule checks, rule unit tests, e2e scrape)
    clang libclang-rt-14-dev  # sanitizer and libFuzzer builds (scripts/test_hardening.sh)
    openssl  # the tests make throwaway TLS certificates with it
  )
fi

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ((demo_only)); then
  echo "setup: done (demo only)"
  exit 0
fi

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r scripts/requirements-dev.txt
.venv/bin/python -m pip install -q -e client/python
# An editable install leaves out the start-up hook that a regular one puts into site-packages
# (client/python/setup.py): ATTNSERVE_FLASH_ATTN_SHIM=1 installs the flash_attn shim at start.
cp client/python/attnserve_flash_attn_shim.pth \
  "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
echo "setup: done"

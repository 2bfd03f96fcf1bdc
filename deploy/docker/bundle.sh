#!/usr/bin/env bash
# Packs the built server, attnctl and attnload, with every shared library they load, into one
# prefix:
#   deploy/docker/bundle.sh BUILD_DIR PREFIX -> PREFIX/bin/{attnserve,attnctl,attnload}, PREFIX/lib
# The Dockerfile's builder stage runs it (BUILD_DIR=build, PREFIX=/opt/attnserve) and the runtime
# stage copies PREFIX whole, so the runtime image needs no Debian gRPC/protobuf/abseil packages.
# tests/deploy runs it against the local build to check that what the image copies exists.
#
# Left out, because the runtime base image must provide its own: the C library family (libc,
# libm, libpthread, libdl, librt, ld-linux), which has to match the loader, and libcuda, the
# driver library that the NVIDIA container toolkit mounts from the host.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 BUILD_DIR PREFIX" >&2
  exit 2
fi
BUILD_DIR=$1
PREFIX=$2
mkdir -p "$PREFIX/bin" "$PREFIX/lib"
for binary in attnserve attnctl attnload; do
  cp "$BUILD_DIR/bin/$binary" "$PREFIX/bin/$binary"
done
skip='^(linux-vdso|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|ld-linux|libcuda\.so)'
for binary in "$PREFIX"/bin/*; do
  # ldd prints "name => /path (address)"; a library it cannot find prints "not found", which
  # fails here rather than at the container's start.
  libraries=$(ldd "$binary")
  if grep -q "not found" <<<"$libraries"; then
    echo "bundle: $binary has unresolved libraries:" >&2
    grep "not found" <<<"$libraries" >&2
    exit 1
  fi
  awk '$3 ~ /^\// {print $1, $3}' <<<"$libraries" | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    cp -L "$path" "$PREFIX/lib/$name"
  done
done
# civetweb (HTTPS) opens OpenSSL at run time by its unversioned names; libssl.so resolves to the
# server binary itself (server/transport/http/civetweb_openssl3_compat.cc), libcrypto.so must be
# a file next to the bundled libcrypto.so.3.
if [ -e "$PREFIX/lib/libcrypto.so.3" ]; then
  ln -sf libcrypto.so.3 "$PREFIX/lib/libcrypto.so"
fi

#!/usr/bin/env bash
# Packs the built server and attnctl with every shared library they need into .gpu-bundle/, a
# git-ignored folder that travels to the GPU machine, which has no Debian gRPC libraries (the
# same packing the container image uses: deploy/docker/bundle.sh). Run there with
#   LD_LIBRARY_PATH=.gpu-bundle/lib:/usr/local/cuda/lib64 .gpu-bundle/bin/attnserve
#
#   scripts/make_gpu_bundle.sh [BUILD_DIR]   (default: build)
# A build of every head dim for the H100 alone (cmake -S . -B build-full
# -DCMAKE_CUDA_ARCHITECTURES=90) bundles to about 61 MB with its binaries stripped of symbols,
# as they are here: the device's carry is limited (64 MiB with the working tree; a gzipped
# tarball of the bundle is about half).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
rm -rf .gpu-bundle
deploy/docker/bundle.sh "$build_dir" .gpu-bundle
strip --strip-unneeded .gpu-bundle/bin/*
du -sh .gpu-bundle

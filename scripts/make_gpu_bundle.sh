#!/usr/bin/env bash
# Packs the built server and attnctl with every shared library they need into .gpu-bundle/, a
# git-ignored folder that travels to the GPU machine, which has no Debian gRPC libraries (the
# same packing the container image uses: deploy/docker/bundle.sh). Run there with
#   LD_LIBRARY_PATH=.gpu-bundle/lib:/usr/local/cuda/lib64 .gpu-bundle/bin/attnserve
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu-bundle
deploy/docker/bundle.sh build .gpu-bundle
du -sh .gpu-bundle

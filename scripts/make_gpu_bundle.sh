#!/usr/bin/env bash
# Packs the built server and attnctl with every shared library they need (ldd, less the C
# library family and the driver) into .gpu-bundle/, a git-ignored folder that travels to the
# GPU machine, which has no Debian gRPC libraries. Run there with
#   LD_LIBRARY_PATH=.gpu-bundle/lib:/usr/local/cuda/lib64 .gpu-bundle/bin/attnserve
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=.gpu-bundle
rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
cp build/bin/attnserve build/bin/attnctl "$BUNDLE/bin/"
skip='^(linux-vdso|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|ld-linux|libcuda\.so)'
for binary in "$BUNDLE"/bin/*; do
  ldd "$binary" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    cp -L "$path" "$BUNDLE/lib/$name"
  done
done
du -sh "$BUNDLE"

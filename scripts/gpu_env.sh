# Sourced by the scripts that run on the GPU machine (gpu_e2e.sh, soak.sh --gpu) from the
# repository root: the carried server's libraries, and a python3 that can import the client
# (no venv there).
export LD_LIBRARY_PATH="$PWD/.gpu-bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"

# The committed stubs need grpcio >= 1.76 and protobuf >= 6.31.1; carried wheels fill the gap.
if ! python3 - <<'PY'
import grpc, google.protobuf as pb
from packaging.version import Version as V
raise SystemExit(0 if V(grpc.__version__) >= V("1.76") and V(pb.__version__) >= V("6.31.1") else 1)
PY
then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD/client/python:${PYTHONPATH:-}"

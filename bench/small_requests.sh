#!/usr/bin/env bash
# Small requests against the transports' own ceiling (issue 24 item 6), on the GPU machine in one
# go: 64 concurrent attnload clients send one-sequence forwards of 64 and of 512 tokens (16
# heads, head_dim 128, bf16) over loopback, through gRPC and through the data channel, to the
# server built here (a bundle folder, default .gpu-bundle/; ATTN_BUNDLE=<folder> picks another)
# with batching off, batching on, and --transport_ceiling (valid requests answered with zeros at
# once: what the transport alone sustains). Prints a table of req/s and each configuration's
# ratio to the ceiling of its transport and shape; attnload's JSON, the server's lane-phase
# metrics and the logs go under $OUT.
#   DURATION (default 10s per configuration), SHAPES (default "64 512"), TRANSPORTS ("grpc data"),
#   CONFIGS: name:flags pairs, flags comma-separated (default below; the first must be the
#   ceiling), e.g. CONFIGS="ceiling:--transport_ceiling lanes4:--batching=false,--cuda_lanes=4";
#   ROUNDS (default 1): the configurations take turns this many times; medians are reported.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/attnserve-small}"
BUNDLE="${ATTN_BUNDLE:-.gpu-bundle}"
DURATION="${DURATION:-10s}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
bin=$BUNDLE/bin

run() {  # name, seqlen, transport, server flags...
  local name=$1 seqlen=$2 transport=$3
  shift 3
  "$bin/attnserve" --devices=auto --grpc_port=8101 --http_port=8100 --data_port=8102 "$@" \
    >"$OUT/server_$name.log" 2>&1 &
  local server=$!
  for _ in $(seq 1 150); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8100/readyz')" \
      2>/dev/null && break
    sleep 0.2
  done
  "$bin/attnload" --target=localhost:8101 --transport="$transport" --data_connections=8 \
    --concurrency=64 --connections=8 --duration="$DURATION" --warmup=2s \
    --shape="fixed:batch=1,seqlen=$seqlen" --heads=16 --head_dim=128 --dtype=bf16 \
    --pool_size=64 --progress=false --output_json="$OUT/$name.json" >"$OUT/$name.txt" 2>&1
  # Where the server's time went (lane phases, answers): what to shave next.
  curl -s http://127.0.0.1:8100/metrics | grep -E '^attnserve_launch_phase_duration_seconds_(sum|count)' \
    >"$OUT/$name.phases" 2>&1
  kill -INT "$server"
  wait "$server"
}

CONFIGS="${CONFIGS:-ceiling:--transport_ceiling batching_off:--batching=false batching_on:--batching=true,--max_queue_delay_us=500}"
# Configurations take turns ROUNDS times (the ceiling itself moved 12% between two runs of one
# call), and the table gives each one's median over the rounds.
ROUNDS="${ROUNDS:-1}"
for seqlen in ${SHAPES:-64 512}; do
  for transport in ${TRANSPORTS:-grpc data}; do
    for round in $(seq 1 "$ROUNDS"); do
      for config in $CONFIGS; do
        # shellcheck disable=SC2046
        run "${seqlen}_${transport}_${config%%:*}_r${round}" "$seqlen" "$transport" \
          $(tr , ' ' <<<"${config#*:}")
      done
    done
  done
done

python3 - "$OUT" $CONFIGS <<'PY'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
configs = [c.split(":", 1)[0] for c in sys.argv[2:]]
def rps(name):
    values = [json.loads(p.read_text())["runs"][-1]["throughput_rps"]
              for p in sorted(out.glob(f"{name}_r*.json"))]
    return (statistics.median(values), values) if values else (None, [])
print("| tokens | transport | configuration | req/s (median) | rounds | / ceiling |")
print("|---|---|---|---|---|---|")
cases = sorted({tuple(p.stem.split("_", 2)[:2])
                for p in out.glob(f"*_{configs[0]}_r*.json")})
for seqlen, transport in cases:
    ceiling, _ = rps(f"{seqlen}_{transport}_{configs[0]}")
    for config in configs:
        value, values = rps(f"{seqlen}_{transport}_{config}")
        ratio = f"{value / ceiling:.2f}" if value and ceiling else "-"
        shown = "-" if value is None else round(value, 1)
        print(f"| {seqlen} | {transport} | {config.replace('_', ' ')} | {shown} | "
              f"{' '.join(str(round(v)) for v in values)} | {ratio} |")
PY

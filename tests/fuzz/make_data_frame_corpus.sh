#!/usr/bin/env bash
# Writes data_frame_fuzzer's seeds (corpus/data_frame_fuzzer/): a 32-byte frame header, then
# its payload; REQUEST payloads are DataRequest messages encoded by protoc from text.
#   tests/fuzz/make_data_frame_corpus.sh   (from the repository root)
set -euo pipefail
out=tests/fuzz/corpus/data_frame_fuzzer
mkdir -p "$out"

# header TYPE REQUEST_ID OFFSET LENGTH: the little-endian frame header on stdout.
header() {
  python3 -c 'import struct,sys; a=[int(x) for x in sys.argv[1:]]
sys.stdout.buffer.write(struct.pack("<IHHQQQ", 0x31504441, a[0], 0, a[1], a[2], a[3]))' "$@"
}
# request NAME TEXT: a REQUEST frame carrying the DataRequest written in text format.
request() {
  local body
  body=$(mktemp)
  printf '%s' "$2" | protoc -Iproto --encode=attnserve.v1.DataRequest \
    proto/attnserve/v1/data_channel.proto >"$body"
  { header 3 1 0 "$(stat -c %s "$body")"; cat "$body"; } >"$out/$1"
  rm "$body"
}

request forward_fp16 'forward { q { dtype: DTYPE_FLOAT16 shape: [10, 4, 8] }
  k { dtype: DTYPE_FLOAT16 shape: [6, 2, 8] } v { dtype: DTYPE_FLOAT16 shape: [6, 2, 8] }
  cu_seqlens_q: [0, 4, 10] cu_seqlens_k: [0, 3, 6] options { causal: true } }
  payload_bytes: 1024 chunk_bytes: 65536 timeout_ms: 1000 priority: "high"'
request forward_large 'forward { q { dtype: DTYPE_FLOAT32 shape: [256, 8, 64] }
  k { dtype: DTYPE_FLOAT32 shape: [256, 8, 64] } v { dtype: DTYPE_FLOAT32 shape: [256, 8, 64] }
  cu_seqlens_q: [0, 100, 256] cu_seqlens_k: [0, 128, 256] }
  payload_bytes: 1572864 chunk_bytes: 100003'
request backward_fp32 'backward { dout { dtype: DTYPE_FLOAT32 shape: [3, 2, 4] }
  q { dtype: DTYPE_FLOAT32 shape: [3, 2, 4] } k { dtype: DTYPE_FLOAT32 shape: [5, 2, 4] }
  v { dtype: DTYPE_FLOAT32 shape: [5, 2, 4] } out { dtype: DTYPE_FLOAT32 shape: [3, 2, 4] }
  lse { dtype: DTYPE_FLOAT32 shape: [2, 3] } cu_seqlens_q: [0, 3] cu_seqlens_k: [0, 5]
  deterministic: true }
  payload_bytes: 632 chunk_bytes: 65536'
request backward_dout_only 'backward { dout { dtype: DTYPE_BFLOAT16 shape: [3, 2, 4] }
  cu_seqlens_q: [0, 3] cu_seqlens_k: [0, 5] context_id: "ctx-1" }
  payload_bytes: 48 chunk_bytes: 65536'
header 5 1 65536 65536 >"$out/chunk_header"
header 8 7 0 0 >"$out/cancel"

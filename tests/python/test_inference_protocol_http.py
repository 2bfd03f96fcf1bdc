"""tritonclient's HTTP client against the /v2 REST API on the CPU device: health, metadata,
forward and backward in FP32/FP16/BF16 as JSON and as binary tensors, checked against the float64
reference, statistics and metrics, authentication, and bad requests (malformed JSON, wrong
shapes, unknown models, bodies over the limit or shorter than they say) answered with the
protocol's status codes and errors that name the field."""
import json
import select
import socket
import time

import numpy as np
import pytest
from ml_dtypes import bfloat16

tritonclient_http = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

from attnserve import reference  # noqa: E402
from oip_helpers import (BACKWARD_INPUTS, FORWARD_INPUTS, check_backward,  # noqa: E402,F401
                         check_close, check_forward, error_of, inputs_for, make_problem,
                         oip_server, post, triton_http)
from server_process import MAIN_LIMITS, SMALL_LIMITS, run_server  # noqa: E402


def json_request(arrays, names):
    return {"inputs": [{"name": n, "shape": list(arrays[n].shape),
                        "datatype": "INT32" if arrays[n].dtype == np.int32 else "FP32",
                        "data": arrays[n].tolist()} for n in names]}


def test_health_and_metadata(triton_http):
    assert triton_http.is_server_live() and triton_http.is_server_ready()
    assert triton_http.is_model_ready("attention_forward")
    assert triton_http.is_model_ready("attention_backward", "1")
    assert not triton_http.is_model_ready("attention_sideways")
    assert not triton_http.is_model_ready("attention_forward", "2")
    metadata = triton_http.get_server_metadata()
    assert metadata["name"] == "attnserve"
    assert {"binary_tensor_data", "statistics", "system_shared_memory"} <= set(
        metadata["extensions"])
    model = triton_http.get_model_metadata("attention_backward", "1")
    assert model["versions"] == ["1"] and model["platform"] == "attnserve"
    assert [t["name"] for t in model["inputs"]] == BACKWARD_INPUTS
    assert [t["name"] for t in model["outputs"]] == ["dq", "dk", "dv"]
    assert model["inputs"][0]["shape"] == [-1, -1, -1]


# BF16 only as binary: tritonclient refuses to send it as JSON (so does Triton).
@pytest.mark.parametrize("dtype,binary", [(np.float32, True), (np.float16, True),
                                          (bfloat16, True), (np.float32, False),
                                          (np.float16, False)],
                         ids=["fp32-binary", "fp16-binary", "bf16-binary", "fp32-json",
                              "fp16-json"])
def test_forward_and_backward_match_reference(triton_http, dtype, binary, rng):
    arrays = make_problem(rng, dtype)
    options = {"causal": True, "softmax_scale": 0.3}

    def outputs(names):
        return [tritonclient_http.InferRequestedOutput(n, binary_data=binary) for n in names]

    result = triton_http.infer("attention_forward",
                               inputs_for(tritonclient_http, arrays, FORWARD_INPUTS, binary),
                               outputs=outputs(["out", "lse"]), parameters=options,
                               request_id="fwd-1")
    assert result.get_response()["id"] == "fwd-1"
    out, lse = check_forward(result, arrays, dtype, options)

    arrays.update(out=out, lse=lse)
    result = triton_http.infer("attention_backward",
                               inputs_for(tritonclient_http, arrays, BACKWARD_INPUTS, binary),
                               outputs=outputs(["dq", "dk", "dv"]),
                               parameters=dict(options, deterministic=True))
    check_backward(result, arrays, dtype, options)


def test_nested_json_and_binary_outputs_by_default(oip_server, rng):
    """Shaped (nested) JSON lists, BF16 in JSON, and binary_data_output for every output."""
    arrays = make_problem(rng, bfloat16, causal=False)
    request = json_request({n: arrays[n] if n.startswith("cu") else arrays[n].astype(np.float32)
                            for n in FORWARD_INPUTS}, FORWARD_INPUTS)
    for tensor in request["inputs"][:3]:
        tensor["datatype"] = "BF16"  # values are bf16 already, so exact
    request["parameters"] = {"binary_data_output": True}
    status, headers, body = post(oip_server, "/v2/models/attention_forward/infer",
                                 json.dumps(request))
    assert status == 200, body
    json_length = int(headers["Inference-Header-Content-Length"])
    answer = json.loads(body[:json_length])
    binary = body[json_length:]
    (out_meta, lse_meta) = answer["outputs"]
    out_size = out_meta["parameters"]["binary_data_size"]
    assert out_meta["datatype"] == "BF16" and len(binary) == out_size + \
        lse_meta["parameters"]["binary_data_size"]
    out = np.frombuffer(binary[:out_size], bfloat16).reshape(out_meta["shape"])
    lse = np.frombuffer(binary[out_size:], np.float32).reshape(lse_meta["shape"])
    ref_out, ref_lse = reference.attention_forward(arrays["q"], arrays["k"], arrays["v"],
                                                   arrays["cu_seqlens_q"], arrays["cu_seqlens_k"])
    check_close(out, ref_out, bfloat16, "out")
    check_close(lse, ref_lse, np.float32, "lse")


def test_errors_name_the_field(triton_http, rng):
    arrays = make_problem(rng, np.float32)
    good = inputs_for(tritonclient_http, arrays, FORWARD_INPUTS, True)
    error = error_of(triton_http, "attention_sideways", good)
    assert error.status() == "404" and "model_name" in error.message()
    error = error_of(triton_http, "attention_forward", good, model_version="2")
    assert error.status() == "404" and "model_version" in error.message()
    error = error_of(triton_http, "attention_forward", good[:4])
    assert error.status() == "400" and "inputs[cu_seqlens_k]: missing" in error.message()
    error = error_of(triton_http, "attention_forward", good, parameters={"casual": True})
    assert "parameters.casual: unknown parameter" in error.message()
    error = error_of(triton_http, "attention_forward", good, parameters={"causal": 1})
    assert "parameters.causal: must be a bool" in error.message()
    bad = dict(arrays, cu_seqlens_q=np.array([0, 7, 15], np.int32))
    error = error_of(triton_http, "attention_forward",
                     inputs_for(tritonclient_http, bad, FORWARD_INPUTS, True))
    assert error.status() == "400" and "cu_seqlens_q" in error.message()
    wrong_shape = dict(arrays, k=arrays["k"][:, :, :8].copy())
    error = error_of(triton_http, "attention_forward",
                     inputs_for(tritonclient_http, wrong_shape, FORWARD_INPUTS, True))
    assert error.status() == "400" and "k" in error.message()
    error = error_of(triton_http, "attention_forward", inputs_for(
        tritonclient_http, dict(arrays, q=arrays["q"].astype(np.float64)), FORWARD_INPUTS, True))
    assert "inputs[q].datatype: must be FP16, BF16 or FP32" in error.message()
    error = error_of(triton_http, "attention_forward", good,
                     headers={"x-attnserve-priority": "urgent"})
    assert error.status() == "400" and "x-attnserve-priority" in error.message()
    triton_http.infer("attention_forward", good, headers={"x-attnserve-priority": "low"})


@pytest.mark.parametrize("body,headers,message", [
    (b"{\"inputs\": [", {}, "request body: not valid JSON"),
    (b"[" * 100000, {}, "JSON nested deeper than"),
    (b"{\"inputs\": 3}", {}, "request.inputs: must be a list"),
    (b"{\"inputs\": []}", {"Inference-Header-Content-Length": "99"},
     "Inference-Header-Content-Length"),
    (b"{\"inputs\": []}", {"Inference-Header-Content-Length": "x"},
     "Inference-Header-Content-Length: must be a byte count"),
    (b"{\"inputs\": []}", {"Content-Encoding": "gzip"}, "Content-Encoding"),
], ids=["truncated", "deep", "inputs-kind", "header-length", "header-nan", "encoding"])
def test_malformed_bodies_are_400(oip_server, body, headers, message):
    status, _, answer = post(oip_server, "/v2/models/attention_forward/infer", body, headers)
    assert status == 400, answer
    assert message in json.loads(answer)["error"]


def test_json_data_that_does_not_fit_its_shape_is_400(oip_server, rng):
    arrays = make_problem(rng, np.float32)
    request = json_request(arrays, FORWARD_INPUTS)
    request["inputs"][0]["shape"][0] += 1
    status, _, answer = post(oip_server, "/v2/models/attention_forward/infer",
                             json.dumps(request))
    assert status == 400 and "inputs[q].data:" in json.loads(answer)["error"]


def raw_exchange(server, head, body=b"", read_timeout=15):
    """Sends a request head and body on a plain socket; the status code of the answer."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=read_timeout) as s:
        s.sendall(head.encode() + b"\r\n" + body)
        answer = b""
        while b"\r\n" not in answer:
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
    return int(answer.split(b" ")[1]) if answer else None


def test_bodies_over_the_limit_or_short_are_refused(small_server):
    path = "POST /v2/models/attention_forward/infer HTTP/1.1\r\nHost: x\r\n"
    limit = SMALL_LIMITS["max_message_bytes"]
    # Refused from the declared length, before any byte of the body is read.
    assert raw_exchange(small_server, path + f"Content-Length: {limit + 1}\r\n") == 413
    # A chunked body (no length declared) is cut off once it passes the limit.
    chunk = b"%x\r\n" % 4096 + b" " * 4096 + b"\r\n"
    chunks = chunk * (limit // 4096 + 1) + b"0\r\n\r\n"
    assert raw_exchange(small_server, path + "Transfer-Encoding: chunked\r\n", chunks) == 413
    # A body that stops short of its Content-Length (the connection times out).
    assert raw_exchange(small_server, path + "Content-Length: 100\r\n", b"{\"inputs\"") == 400


def test_chunked_json_body_is_served(oip_server, rng):
    arrays = make_problem(rng, np.float32)
    body = json.dumps(json_request(arrays, FORWARD_INPUTS)).encode()
    pieces = [body[i:i + 1000] for i in range(0, len(body), 1000)]
    status, _, answer = post(oip_server, "/v2/models/attention_forward/infer", iter(pieces),
                             {"Transfer-Encoding": "chunked"})
    assert status == 200, answer
    outputs = {o["name"]: o for o in json.loads(answer)["outputs"]}
    ref_out, _ = reference.attention_forward(arrays["q"], arrays["k"], arrays["v"],
                                             arrays["cu_seqlens_q"], arrays["cu_seqlens_k"])
    out = np.array(outputs["out"]["data"], np.float32).reshape(outputs["out"]["shape"])
    check_close(out, ref_out, np.float32, "out")


def test_unknown_paths_are_404(oip_server):
    assert oip_server.http_status("/v2/models/attention_forward/sideways") == 404
    assert oip_server.http_status("/v2x") == 404
    status, _, answer = post(oip_server, "/v2/models/attention_forward/ready", b"")
    assert status == 404 and "no POST endpoint" in json.loads(answer)["error"]


def test_statistics_and_metrics_count_inferences(oip_server, triton_http, rng):
    series = 'code="OK",model="attention_forward",protocol="http",shared_memory="none"'
    counted = oip_server.metric("attnserve_inference_protocol_requests_total", series)
    before = triton_http.get_inference_statistics("attention_forward")["model_stats"][0]
    arrays = make_problem(rng, np.float32)
    triton_http.infer("attention_forward",
                      inputs_for(tritonclient_http, arrays, FORWARD_INPUTS, True))
    after = triton_http.get_inference_statistics("attention_forward", "1")["model_stats"][0]
    assert after["inference_count"] == before["inference_count"] + 1
    assert after["inference_stats"]["success"]["count"] == \
        before["inference_stats"]["success"]["count"] + 1
    assert after["last_inference"] > 0
    assert oip_server.metric("attnserve_inference_protocol_requests_total",
                             series) == counted + 1
    everything = triton_http.get_inference_statistics()
    assert {s["name"] for s in everything["model_stats"]} == {"attention_forward",
                                                              "attention_backward"}


def test_a_passed_timeout_is_504(triton_http, rng):
    """Triton's `timeout` parameter (microseconds) becomes the call's deadline."""
    arrays = make_problem(rng, np.float32)
    error = error_of(triton_http, "attention_forward",
                     inputs_for(tritonclient_http, arrays, FORWARD_INPUTS, True), timeout=1)
    assert error.status() == "504", error


def test_tokens_are_required_when_configured(tmp_path, rng):
    tokens = tmp_path / "tokens"
    tokens.write_text("token-alice\n")
    arrays = make_problem(rng, np.float32)
    for server in run_server(dict(MAIN_LIMITS, auth_tokens_file=str(tokens))):
        with tritonclient_http.InferenceServerClient(f"127.0.0.1:{server.http_port}") as client:
            inputs = inputs_for(tritonclient_http, arrays, FORWARD_INPUTS, True)
            error = error_of(client, "attention_forward", inputs)
            assert error.status() == "401"
            error = error_of(client, "attention_forward", inputs,
                             headers={"Authorization": "Bearer token-mallory"})
            assert error.status() == "401"
            with pytest.raises(InferenceServerException) as raised:
                client.get_server_metadata()
            assert raised.value.status() == "401"
            # Probes need no token (--auth_open_health_and_metrics), as on gRPC.
            assert client.is_server_live() and client.is_model_ready("attention_forward")
            alice = {"Authorization": "Bearer token-alice"}
            result = client.infer("attention_forward", inputs, headers=alice)
            assert result.as_numpy("out").shape == arrays["q"].shape
            assert client.get_server_metadata(headers=alice)["name"] == "attnserve"


def _answered_with(connection):
    """The status line a connection has been answered with so far, or None."""
    if not select.select([connection], [], [], 0)[0]:
        return None
    return connection.recv(4096).split(b"\r\n", 1)[0].decode()


def test_inferences_hold_at_most_half_the_http_threads(rng):
    """With --http_threads=2 one inference may wait on a thread: while a client trickles its
    body, another inference is refused with 429 and the probes still answer."""
    arrays = make_problem(rng, np.float32)
    body = json.dumps(json_request(arrays, FORWARD_INPUTS))
    for server in run_server(dict(MAIN_LIMITS, http_threads=2, http_request_timeout_ms=5000)):
        # Which of two inferences holds the thread is a race: about one run in ten the other
        # connection's handler counted first, and the trickled request was the one refused
        # (its answer the 429, the others passing). Then a new trickled request is sent.
        refused = None
        for _ in range(10):
            with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as slow:
                slow.sendall(b"POST /v2/models/attention_forward/infer HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Length: 100\r\n\r\n{\"inputs\"")
                deadline = time.monotonic() + 8
                while time.monotonic() < deadline:
                    status, _, answer = post(server, "/v2/models/attention_forward/infer", body)
                    if status == 429:
                        refused = json.loads(answer)["error"]
                        break
                    assert status == 200, answer
                    slow_answer = _answered_with(slow)
                    if slow_answer is not None:
                        assert slow_answer == "HTTP/1.1 429 Too Many Requests", slow_answer
                        break
                if refused is not None:
                    assert _answered_with(slow) is None, "both inferences were refused"
                    assert server.http_status("/healthz") == 200
                    break
        assert refused is not None and "too many HTTP inferences" in refused, refused

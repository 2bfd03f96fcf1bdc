"""tritonclient's gRPC client against inference.GRPCInferenceService on the CPU device:
health, metadata, forward and backward in FP32/FP16/BF16 (raw and typed contents) checked
against the float64 reference, statistics, and errors that name their field."""
import grpc
import numpy as np
import pytest
from ml_dtypes import bfloat16

tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402

from attnserve import reference  # noqa: E402
from oip_helpers import (BACKWARD_INPUTS, FORWARD_INPUTS, check_backward,  # noqa: E402,F401
                         check_close, check_forward, error_of, inputs_for, make_problem,
                         oip_server, triton)



def test_health_and_metadata(triton):
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("attention_forward")
    assert triton.is_model_ready("attention_backward", "1")
    metadata = triton.get_server_metadata()
    assert metadata.name == "attnserve"
    assert {"binary_tensor_data", "statistics", "system_shared_memory"} <= set(
        metadata.extensions)
    model = triton.get_model_metadata("attention_backward")
    assert list(model.versions) == ["1"]
    assert [t.name for t in model.inputs] == BACKWARD_INPUTS
    assert [t.name for t in model.outputs] == ["dq", "dk", "dv"]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, bfloat16], ids=["fp32", "fp16", "bf16"])
def test_forward_and_backward_match_reference(triton, dtype, rng):
    arrays = make_problem(rng, dtype)
    options = {"causal": True, "softmax_scale": 0.3}
    result = triton.infer("attention_forward", inputs_for(tritonclient_grpc, arrays,
                                                          FORWARD_INPUTS, None),
                          parameters=options, request_id="fwd-1")
    assert result.get_response().id == "fwd-1"
    out, lse = check_forward(result, arrays, dtype, options)

    arrays.update(out=out, lse=lse)
    result = triton.infer("attention_backward", inputs_for(tritonclient_grpc, arrays,
                                                           BACKWARD_INPUTS, None),
                          parameters=dict(options, deterministic=True))
    check_backward(result, arrays, dtype, options)


def test_typed_contents_and_requested_outputs(oip_server, rng):
    """fp32_contents and int_contents instead of raw bytes; only lse asked for."""
    arrays = make_problem(rng, np.float32, causal=False)
    request = service_pb2.ModelInferRequest(model_name="attention_forward")
    for name in FORWARD_INPUTS:
        array = arrays[name]
        tensor = request.inputs.add(name=name, shape=list(array.shape),
                                    datatype="INT32" if array.dtype == np.int32 else "FP32")
        if array.dtype == np.int32:
            tensor.contents.int_contents.extend(array.ravel().tolist())
        else:
            tensor.contents.fp32_contents.extend(array.ravel().tolist())
    request.outputs.add(name="lse")
    with grpc.insecure_channel(oip_server.target) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert [o.name for o in response.outputs] == ["lse"]
    lse = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(
        response.outputs[0].shape)
    _, ref_lse = reference.attention_forward(arrays["q"], arrays["k"], arrays["v"],
                                             arrays["cu_seqlens_q"], arrays["cu_seqlens_k"])
    check_close(lse, ref_lse, np.float32, "lse")


def test_errors_name_the_field(triton, rng):
    arrays = make_problem(rng, np.float32)
    good = inputs_for(tritonclient_grpc, arrays, FORWARD_INPUTS, None)
    error = error_of(triton, "attention_sideways", good)
    assert error.status() == "StatusCode.NOT_FOUND" and "model_name" in error.message()
    error = error_of(triton, "attention_forward", good, model_version="2")
    assert error.status() == "StatusCode.NOT_FOUND" and "model_version" in error.message()
    error = error_of(triton, "attention_forward", good[:4])
    assert "inputs[cu_seqlens_k]: missing" in error.message()
    error = error_of(triton, "attention_forward", good, parameters={"casual": True})
    assert "parameters.casual: unknown parameter" in error.message()
    error = error_of(triton, "attention_forward", good, parameters={"causal": 1})
    assert "parameters.causal: must be a bool" in error.message()
    # Offsets that do not end at total_q: the engine's validation, naming the field.
    bad = dict(arrays, cu_seqlens_q=np.array([0, 7, 15], np.int32))
    error = error_of(triton, "attention_forward",
                     inputs_for(tritonclient_grpc, bad, FORWARD_INPUTS, None))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "cu_seqlens_q" in error.message()
    error = error_of(triton, "attention_forward", inputs_for(
        tritonclient_grpc, dict(arrays, q=arrays["q"].astype(np.float64)), FORWARD_INPUTS, None))
    assert "inputs[q].datatype: must be FP16, BF16 or FP32" in error.message()
    # The native API's priority metadata applies here too.
    error = error_of(triton, "attention_forward", good, headers={"x-attnserve-priority": "urgent"})
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "x-attnserve-priority" in error.message()
    triton.infer("attention_forward", good, headers={"x-attnserve-priority": "low"})


def test_statistics_and_metrics_count_inferences(oip_server, triton, rng):
    series = ('code="OK",model="attention_forward",protocol="grpc",shared_memory="none"')
    counted = oip_server.metric("attnserve_inference_protocol_requests_total", series)
    before = triton.get_inference_statistics("attention_forward").model_stats[0]
    arrays = make_problem(rng, np.float32)
    triton.infer("attention_forward", inputs_for(tritonclient_grpc, arrays, FORWARD_INPUTS, None))
    after = triton.get_inference_statistics("attention_forward").model_stats[0]
    assert after.inference_count == before.inference_count + 1
    assert after.inference_stats.success.count == before.inference_stats.success.count + 1
    assert after.last_inference > 0
    assert oip_server.metric("attnserve_inference_protocol_requests_total",
                             series) == counted + 1
    everything = triton.get_inference_statistics()
    assert {s.name for s in everything.model_stats} == {"attention_forward",
                                                        "attention_backward"}


@pytest.mark.parametrize("seed", [12345, -5], ids=["positive", "negative_int64"])
def test_dropout_with_the_caller_s_seed_matches_reference(triton, seed, rng):
    arrays = make_problem(rng, np.float32)
    parameters = {"causal": True, "dropout_p": 0.25, "dropout_seed": seed}
    # The int64 parameter carries the uint64 seed's bits.
    options = {"causal": True, "dropout_p": 0.25, "dropout_seed": seed % (1 << 64)}
    result = triton.infer("attention_forward", inputs_for(tritonclient_grpc, arrays,
                                                          FORWARD_INPUTS, None),
                          parameters=parameters)
    out, lse = check_forward(result, arrays, np.float32, options)
    arrays.update(out=out, lse=lse)
    result = triton.infer("attention_backward", inputs_for(tritonclient_grpc, arrays,
                                                           BACKWARD_INPUTS, None),
                          parameters=parameters)
    check_backward(result, arrays, np.float32, options)


@pytest.mark.parametrize("parameters,field", [({"dropout_p": 0.1}, "dropout_seed"),
                                              ({"dropout_p": 1.0, "dropout_seed": 3}, "dropout_p"),
                                              ({"dropout_p": -0.5, "dropout_seed": 3},
                                               "dropout_p")],
                         ids=["no_seed", "one", "negative"])
def test_bad_dropout_parameters_name_the_field(triton, parameters, field, rng):
    inputs = inputs_for(tritonclient_grpc, make_problem(rng, np.float32), FORWARD_INPUTS, None)
    error = error_of(triton, "attention_forward", inputs, parameters=parameters)
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and field in error.message()

"""attnserve.flash_attn, FlashAttention 2's Python API, against torch's own attention through the
real server: signatures as flash-attn 2.6-2.8 (and 1.x for the unpadded names), padded and packed
calls, gradients into packed tensors, return_attn_probs' lse shapes, refused options."""
import inspect
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attnserve import flash_attn as fa  # noqa: E402
from torch_reference import attention_varlen  # noqa: E402
from torch_threads import one_torch_thread  # noqa: E402,F401  (autouse fixture)

_V2_TAIL = ["dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
            "deterministic", "return_attn_probs"]
_V2_DEFAULTS = {"dropout_p": 0.0, "softmax_scale": None, "causal": False,
                "window_size": (-1, -1), "softcap": 0.0, "alibi_slopes": None,
                "deterministic": False, "return_attn_probs": False, "block_table": None}
_V1_TAIL = ["dropout_p", "softmax_scale", "causal", "return_attn_probs", "deterministic"]
_V1_DEFAULTS = {"softmax_scale": None, "causal": False, "return_attn_probs": False,
                "deterministic": False}
# flash-attn's positional parameters, in order (flash_attn/flash_attn_interface.py).
SIGNATURES = {
    "flash_attn_func": (["q", "k", "v", *_V2_TAIL], _V2_DEFAULTS),
    "flash_attn_qkvpacked_func": (["qkv", *_V2_TAIL], _V2_DEFAULTS),
    "flash_attn_kvpacked_func": (["q", "kv", *_V2_TAIL], _V2_DEFAULTS),
    "flash_attn_varlen_func": (["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                                "max_seqlen_k", *_V2_TAIL, "block_table"], _V2_DEFAULTS),
    "flash_attn_varlen_qkvpacked_func": (["qkv", "cu_seqlens", "max_seqlen", *_V2_TAIL],
                                         _V2_DEFAULTS),
    "flash_attn_varlen_kvpacked_func": (["q", "kv", "cu_seqlens_q", "cu_seqlens_k",
                                         "max_seqlen_q", "max_seqlen_k", *_V2_TAIL],
                                        _V2_DEFAULTS),
    "flash_attn_unpadded_func": (["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                                  "max_seqlen_k", *_V1_TAIL], _V1_DEFAULTS),
    "flash_attn_unpadded_qkvpacked_func": (["qkv", "cu_seqlens", "max_seqlen", *_V1_TAIL],
                                           _V1_DEFAULTS),
    "flash_attn_unpadded_kvpacked_func": (["q", "kv", "cu_seqlens_q", "cu_seqlens_k",
                                           "max_seqlen_q", "max_seqlen_k", *_V1_TAIL],
                                          _V1_DEFAULTS),
}



def _rel(actual, expected):
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-300))


def _cu(lengths):
    return torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)


def _leaf(*shape):
    return torch.randn(*shape, dtype=torch.float64).float().requires_grad_()


def _check_grads(leaves, outputs, reference_outputs, tolerance=1e-5):
    """Same values, and the same gradients into every leaf for a random dout."""
    douts = [torch.randn_like(out) for out in outputs]
    grads = torch.autograd.grad(outputs, leaves, douts)
    ref_grads = torch.autograd.grad(reference_outputs, leaves, douts)
    for out, ref in zip(outputs, reference_outputs):
        assert _rel(out, ref) <= tolerance
    for grad, ref_grad in zip(grads, ref_grads):
        assert _rel(grad, ref_grad) <= tolerance


def _padded_reference(q, k, v, **options):
    """Torch's attention of [batch, seqlen, heads, dim] tensors, sequence by sequence."""
    batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
    out = attention_varlen(q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]),
                           v.reshape(-1, *v.shape[2:]), _cu([seqlen_q] * batch),
                           _cu([seqlen_k] * batch), **options)
    return out.view(q.shape)


@pytest.mark.parametrize("name", SIGNATURES)
def test_signature_is_flash_attn_s(name):
    positional, defaults = SIGNATURES[name]
    parameters = inspect.signature(getattr(fa, name)).parameters
    ordered = [p.name for p in parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert ordered == positional
    for parameter in ordered:
        expected = defaults.get(parameter, inspect.Parameter.empty)
        assert parameters[parameter].default == expected, parameter
    # attnserve's own extras are keyword-only, so positional calls bind as in flash-attn.
    extras = [p.name for p in parameters.values() if p.kind == p.KEYWORD_ONLY]
    assert extras == ["client", "timeout"]


def test_flash_attn_func_gqa_causal_with_shorter_queries(client):
    q, k, v = _leaf(2, 5, 4, 16), _leaf(2, 9, 2, 16), _leaf(2, 9, 2, 16)
    out = fa.flash_attn_func(q, k, v, causal=True, client=client)
    assert out.shape == q.shape
    _check_grads([q, k, v], [out], [_padded_reference(q, k, v, causal=True)])


def test_flash_attn_func_returns_lse_per_batch_head_and_position(client):
    q, k, v = _leaf(3, 6, 2, 8), _leaf(3, 6, 2, 8), _leaf(3, 6, 2, 8)
    out, lse, probs = fa.flash_attn_func(q, k, v, 0.0, 0.5, False, (2, 1), 0.0, None, False, True,
                                         client=client)
    assert probs is None and lse.shape == (3, 2, 6) and lse.dtype == torch.float32
    scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * 0.5
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    scores = scores.masked_fill((j < i - 2) | (j > i + 1), -math.inf)
    assert _rel(lse, torch.logsumexp(scores, dim=-1)) <= 1e-5
    reference = _padded_reference(q, k, v, softmax_scale=0.5, window_size=(2, 1))
    assert _rel(out, reference) <= 1e-5


def test_qkvpacked_gradients_flow_into_the_packed_tensor(client):
    qkv = _leaf(2, 7, 3, 2, 16)
    out = fa.flash_attn_qkvpacked_func(qkv, causal=True, softcap=4.0, client=client)
    reference = _padded_reference(*qkv.unbind(2), causal=True, softcap=4.0)
    _check_grads([qkv], [out], [reference])


def test_kvpacked_gradients_flow_into_the_packed_tensor(client):
    q, kv = _leaf(2, 7, 4, 16), _leaf(2, 7, 2, 1, 16)
    out = fa.flash_attn_kvpacked_func(q, kv, causal=True, client=client)
    _check_grads([q, kv], [out], [_padded_reference(q, *kv.unbind(2), causal=True)])


def test_varlen_qkvpacked_and_kvpacked(client):
    cu = _cu([5, 11, 3])
    qkv, q, kv = _leaf(19, 3, 2, 16), _leaf(19, 4, 16), _leaf(19, 2, 2, 16)
    outs = [fa.flash_attn_varlen_qkvpacked_func(qkv, cu, 11, causal=True, client=client),
            fa.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 11, 11, window_size=(3, 0),
                                               client=client)]
    references = [attention_varlen(*qkv.unbind(1), cu, cu, causal=True),
                  attention_varlen(q, *kv.unbind(1), cu, cu, window_size=(3, 0))]
    _check_grads([qkv, q, kv], outs, references)


def test_unpadded_names_take_flash_attn_1_argument_order(client):
    cu = _cu([4, 9])
    qkv = _leaf(13, 3, 2, 16)
    # 1.x: (qkv, cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal, return_attn_probs)
    out, lse, probs = fa.flash_attn_unpadded_qkvpacked_func(qkv, cu, 9, 0.0, 0.25, True, True,
                                                            client=client)
    reference = attention_varlen(*qkv.unbind(1), cu, cu, softmax_scale=0.25, causal=True)
    assert probs is None and _rel(out, reference) <= 1e-5
    # 1.x's lse: [batch, heads, max_seqlen], +inf past each sequence's end.
    assert lse.shape == (2, 2, 9)
    _, varlen_lse, _ = fa.flash_attn_varlen_qkvpacked_func(
        qkv, cu, 9, 0.0, 0.25, True, return_attn_probs=True, client=client)
    assert torch.equal(lse[0, :, :4], varlen_lse[:, :4])
    assert torch.equal(lse[1], varlen_lse[:, 4:])
    assert torch.isinf(lse[0, :, 4:]).all()
    q, kv = _leaf(13, 4, 16), _leaf(13, 2, 2, 16)
    outs = [fa.flash_attn_unpadded_kvpacked_func(q, kv, cu, cu, 9, 9, 0.0, None, True,
                                                 client=client),
            fa.flash_attn_unpadded_func(q, *kv.unbind(1), cu, cu, 9, 9, 0.0, causal=True,
                                        client=client)]
    reference = attention_varlen(q, *kv.unbind(1), cu, cu, causal=True)
    _check_grads([q, kv], outs, [reference, reference])


@pytest.mark.parametrize("name", SIGNATURES)
@pytest.mark.parametrize("option", ["dropout_p", "alibi_slopes"])
def test_dropout_and_alibi_are_sent_by_every_function(name, option, monkeypatch):
    positional, _ = SIGNATURES[name]
    shapes = {"q": (2, 4, 2, 8), "k": (2, 4, 2, 8), "v": (2, 4, 2, 8), "qkv": (2, 4, 3, 2, 8),
              "kv": (2, 4, 2, 2, 8)}
    varlen = "cu_seqlens" in positional or "cu_seqlens_q" in positional
    args = {}
    for parameter in positional[:positional.index("dropout_p")]:
        if parameter in shapes:
            shape = shapes[parameter]
            args[parameter] = torch.zeros(shape[0] * shape[1], *shape[2:]) if varlen \
                else torch.zeros(shape)
        elif parameter.startswith("cu_seqlens"):
            args[parameter] = _cu([4, 4])
        else:
            args[parameter] = 4
    args["dropout_p"] = 0.1 if option == "dropout_p" else 0.0
    if option == "alibi_slopes":
        if "alibi_slopes" not in positional:
            pytest.skip("flash-attn 1.x has no ALiBi")
        args["alibi_slopes"] = torch.ones(2)
    sent = {}

    class Sent(Exception):
        pass

    def spy(*call_args):
        sent["alibi_slopes"], sent["dropout_p"] = call_args[-2:]
        raise Sent

    monkeypatch.setattr(fa, "varlen_attention", spy)
    with pytest.raises(Sent):
        getattr(fa, name)(**args, client="127.0.0.1:1")
    if option == "dropout_p":
        assert sent["dropout_p"] == 0.1 and sent["alibi_slopes"] is None
    else:
        assert sent["alibi_slopes"] is args["alibi_slopes"] and sent["dropout_p"] == 0.0

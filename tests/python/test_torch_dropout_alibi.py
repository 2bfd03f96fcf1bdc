"""The torch drop-in with dropout_p and alibi_slopes through the real server: values and
autograd gradients against the float64 reference, the backward drawing the forward's mask."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attnserve  # noqa: E402
from attnserve import flash_attn_varlen_func, reference  # noqa: E402
from server_process import CALL_TIMEOUT_S  # noqa: E402
from torch_threads import one_torch_thread  # noqa: E402,F401  (autouse fixture)


def _rel(got, want):
    got = got.detach().double().numpy()
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.fixture
def spied_client(server):
    """A client whose forward results' dropout seeds are recorded, so a test can recompute
    what the drop-in (which returns no seed, as flash-attn) did."""
    with attnserve.Client(server.target, timeout=CALL_TIMEOUT_S) as client:
        seeds = []
        forward = client.forward

        def spy(*args, **kwargs):
            result = forward(*args, **kwargs)
            seeds.append(result.dropout_seed)
            return result

        client.forward = spy
        yield client, seeds


@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
@pytest.mark.parametrize("slopes_shape", [None, (4,), (2, 4)], ids=["none", "per_head",
                                                                     "per_sequence"])
def test_varlen_func_matches_the_reference(spied_client, dropout_p, slopes_shape):
    client, seeds = spied_client
    gen = torch.Generator().manual_seed(11)
    lens_q, lens_k = [13, 29], [21, 29]
    cu_q = torch.tensor([0, 13, 42], dtype=torch.int32)
    cu_k = torch.tensor([0, 21, 50], dtype=torch.int32)
    q = torch.randn(42, 4, 16, generator=gen).requires_grad_()
    k = torch.randn(50, 2, 16, generator=gen).requires_grad_()
    v = torch.randn(50, 2, 16, generator=gen).requires_grad_()
    dout = torch.randn(42, 4, 16, generator=gen)
    slopes = None if slopes_shape is None else torch.rand(slopes_shape, generator=gen) * 0.5
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                 dropout_p=dropout_p, causal=True, alibi_slopes=slopes,
                                 client=client)
    out.backward(dout)
    seed = seeds[-1]
    assert (seed != 0) == (dropout_p > 0)
    options = dict(causal=True, dropout_p=dropout_p, dropout_seed=seed,
                   alibi_slopes=None if slopes is None else slopes.numpy())
    arrays = [t.detach().numpy() for t in (q, k, v)]
    want, _ = reference.attention_forward(*arrays, cu_q.numpy(), cu_k.numpy(), **options)
    assert _rel(out, want) <= 1e-5
    grads = reference.attention_backward(dout.numpy(), *arrays, out.detach().numpy(), None,
                                         cu_q.numpy(), cu_k.numpy(), **options)
    for name, tensor, expected in zip("qkv", (q, k, v), grads):
        assert _rel(tensor.grad, expected) <= 1e-5, name


def test_return_attn_probs_with_dropout_gives_no_s_dmask(client):
    q = torch.randn(8, 2, 16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    out, lse, s_dmask = flash_attn_varlen_func(q, q, q, cu, cu, 8, 8, dropout_p=0.5,
                                               return_attn_probs=True, client=client)
    assert s_dmask is None and out.shape == q.shape and lse.shape == (2, 8)


def test_non_float32_slopes_are_refused(client):
    q = torch.randn(8, 2, 16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(TypeError, match="alibi_slopes"):
        flash_attn_varlen_func(q, q, q, cu, cu, 8, 8, alibi_slopes=torch.ones(2).half(),
                               client=client)

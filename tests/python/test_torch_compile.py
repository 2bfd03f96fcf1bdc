"""torch.compile(fullgraph=True) through attnserve's torch functions, against the real server:
the custom operators' fake implementations and registered autograd let a function of
FlashAttention calls, and a transformers model with attn_implementation="attnserve", compile
into one graph (fullgraph raises on any graph break) and compute what eager mode does."""
import copy

import pytest

torch = pytest.importorskip("torch")

import attnserve  # noqa: E402
from attnserve.flash_attn import flash_attn_func, flash_attn_varlen_kvpacked_func  # noqa: E402
from torch_threads import one_torch_thread  # noqa: E402,F401  (autouse fixture)



@pytest.fixture(autouse=True)
def default_client(server):
    # Compiled code calls with no client=, so the operators resolve the default at run time.
    attnserve.set_default_client(server.target)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    attnserve.set_default_client(None)


def _rel(actual, expected):
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-300))


def _attention_block(q, k, v, cu_seqlens):
    """Padded GQA attention and a packed kv call, with ops around them for the compiler."""
    padded = flash_attn_func(q * 0.5, k, v, causal=True)
    kv = torch.stack((k, v), dim=2).flatten(0, 1)
    packed = flash_attn_varlen_kvpacked_func(q.flatten(0, 1), kv, cu_seqlens, cu_seqlens, 11, 11,
                                             window_size=(3, 0), softcap=2.0)
    return (padded.flatten(0, 1) * packed).square().sum()


def test_compiled_function_matches_eager_with_inductor():
    q = torch.randn(2, 8, 4, 16, requires_grad=True)
    k, v = (torch.randn(2, 8, 2, 16, requires_grad=True) for _ in range(2))
    cu_seqlens = torch.tensor([0, 5, 16], dtype=torch.int32)
    compiled = torch.compile(_attention_block, fullgraph=True)  # inductor, the default
    loss = compiled(q, k, v, cu_seqlens)
    grads = torch.autograd.grad(loss, (q, k, v))
    eager_loss = _attention_block(q, k, v, cu_seqlens)
    eager_grads = torch.autograd.grad(eager_loss, (q, k, v))
    assert _rel(loss, eager_loss) <= 1e-5
    for grad, eager_grad in zip(grads, eager_grads):
        assert _rel(grad, eager_grad) <= 1e-5


def test_compiled_llama_with_attnserve_attention_matches_eager():
    transformers = pytest.importorskip("transformers")
    attnserve.register_with_transformers()
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="attnserve")
    twin = copy.deepcopy(model)
    ids = torch.randint(0, 64, (2, 10))
    # aot_eager: dynamo and AOTAutograd trace the whole model (graph breaks fail fullgraph)
    # without inductor's code generation, which the test above already covers.
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    loss = compiled(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    eager_loss = twin(input_ids=ids, labels=ids, use_cache=False).loss
    eager_loss.backward()
    assert _rel(loss, eager_loss) <= 1e-5
    eager_grads = dict(twin.named_parameters())
    for name, parameter in model.named_parameters():
        assert _rel(parameter.grad, eager_grads[name].grad) <= 1e-4, name

"""attn_implementation="attnserve" in Hugging Face transformers, through the real server: tiny
randomly initialised models (built from configs, nothing downloaded) train and run like the same
weights on transformers' own attention, for padded batches, packed sequences (position_ids and
cu_seq_lens), GQA, sliding windows and softcap."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.masking_utils")

import attnserve  # noqa: E402
from attnserve import transformers_attention  # noqa: E402
from attnserve.transformers_attention import attnserve_attention  # noqa: E402
from torch_reference import attention_varlen  # noqa: E402
from torch_threads import one_torch_thread  # noqa: E402,F401  (autouse fixture)

VOCAB = 64
TOLERANCE = 1e-4  # float32 end to end, over a few layers and optimizer steps
SMALL = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 64}



@pytest.fixture(scope="module", autouse=True)
def registered(server):
    attnserve.register_with_transformers()
    attnserve.set_default_client(server.target)
    yield
    attnserve.set_default_client(None)


def _rel(actual, expected):
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-300))


def _twins(config, reference="sdpa", seed=0):
    """The same random weights with attnserve and with transformers' `reference` attention."""
    torch.manual_seed(seed)
    models = [transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config),
                                                            attn_implementation=implementation)
              for implementation in ("attnserve", reference)]
    models[1].load_state_dict(models[0].state_dict())
    assert models[0].config._attn_implementation == "attnserve"
    return models


def _train_side_by_side(models, batches, steps=3):
    """SGD steps on both twins; each step's loss and every gradient must agree."""
    optimizers = [torch.optim.SGD(model.parameters(), lr=0.5) for model in models]
    losses = []
    for step in range(steps):
        inputs, extra = batches[step % len(batches)]
        results = []
        for model, optimizer, kwargs in zip(models, optimizers, (extra, {})):
            optimizer.zero_grad()
            loss = model(**inputs, **kwargs).loss
            loss.backward()
            results.append((loss, {n: p.grad.clone() for n, p in model.named_parameters()}))
        (loss, grads), (ref_loss, ref_grads) = results
        assert _rel(loss, ref_loss) <= TOLERANCE, step
        worst = max(_rel(grads[name], ref_grads[name]) for name in ref_grads)
        assert worst <= TOLERANCE, (step, worst)
        losses.append(float(loss.detach()))
        for optimizer in optimizers:
            optimizer.step()
    assert len(set(losses)) == steps  # the weights changed: the steps trained


def _padded_batch(generator, lengths, seqlen):
    ids = torch.randint(0, VOCAB, (len(lengths), seqlen), generator=generator)
    mask = (torch.arange(seqlen)[None, :] < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100),
            "use_cache": False}


def _packed_batch(generator, lengths, with_cu_seq_lens):
    """Sequences concatenated in one row, as DataCollatorWithFlattening builds them; the
    cu_seq_lens keyword arguments go to the attnserve twin only (sdpa's ignores them)."""
    ids = torch.randint(0, VOCAB, (1, sum(lengths)), generator=generator)
    positions = torch.cat([torch.arange(n) for n in lengths])[None, :]
    labels = ids.clone()
    labels[0, np.cumsum(lengths)[:-1]] = -100  # no prediction across a boundary
    extra = {}
    if with_cu_seq_lens:
        cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)
        extra = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max(lengths),
                 "max_length_k": max(lengths)}
    # Without a cache, as in training: transformers reads packing from position_ids only then.
    return {"input_ids": ids, "position_ids": positions, "labels": labels,
            "use_cache": False}, extra


def test_llama_trains_like_sdpa_on_padded_batches():
    generator = torch.Generator().manual_seed(1)
    models = _twins(transformers.LlamaConfig(**SMALL))
    batches = [(_padded_batch(generator, [12, 7, 3], 12), {}),
               (_padded_batch(generator, [5, 9], 9), {})]
    _train_side_by_side(models, batches)


@pytest.mark.parametrize("with_cu_seq_lens", [False, True], ids=["position_ids", "cu_seq_lens"])
def test_llama_trains_like_sdpa_on_packed_sequences(with_cu_seq_lens):
    generator = torch.Generator().manual_seed(2)
    models = _twins(transformers.LlamaConfig(**SMALL))
    batches = [_packed_batch(generator, [6, 11, 4], with_cu_seq_lens),
               _packed_batch(generator, [9, 3, 8], with_cu_seq_lens)]
    _train_side_by_side(models, batches)


def test_mistral_sliding_window_like_sdpa():
    config = transformers.MistralConfig(**SMALL, sliding_window=4)
    models = _twins(config)
    generator = torch.Generator().manual_seed(3)
    _train_side_by_side(models, [(_padded_batch(generator, [14, 10], 14), {})], steps=2)


def test_gemma2_softcap_and_sliding_window_like_eager():
    config = transformers.Gemma2Config(**SMALL, head_dim=8, sliding_window=4,
                                       attn_logit_softcapping=2.0, final_logit_softcapping=None,
                                       query_pre_attn_scalar=8)
    models = _twins(config, reference="eager")
    generator = torch.Generator().manual_seed(4)
    _train_side_by_side(models, [(_padded_batch(generator, [12, 8], 12), {})], steps=2)


def test_cu_seq_lens_alone_delimit_sequences():
    # Without position_ids, only cu_seq_lens can tell the packed sequences apart.
    q, k, v = (torch.randn(1, heads, 15, 16) for heads in (4, 2, 2))
    cu = torch.tensor([0, 6, 15], dtype=torch.int32)
    module = torch.nn.Module()
    out, weights = attnserve_attention(module, q, k, v, None, scaling=0.3, cu_seq_lens_q=cu,
                                       cu_seq_lens_k=cu, max_length_q=9, max_length_k=9)
    reference = attention_varlen(*(t[0].transpose(0, 1) for t in (q, k, v)), cu, cu,
                                 softmax_scale=0.3, causal=True)
    assert weights is None and _rel(out[0], reference) <= 1e-5


def test_attention_dropout_goes_to_flash_attn_s_dropout_p(monkeypatch):
    sent = {}

    def spy(*args, **kwargs):
        sent.update(kwargs)
        return args[0]

    monkeypatch.setattr(transformers_attention, "flash_attn_func", spy)
    q = torch.randn(1, 2, 4, 8)
    attnserve_attention(torch.nn.Module(), q, q, q, None, dropout=0.1)
    assert sent["dropout_p"] == 0.1

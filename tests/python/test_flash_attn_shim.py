"""attnserve.install_flash_attn_shim(): `import flash_attn` resolves to attnserve with real module
objects and distribution metadata, monkey patches written for FlashAttention (flash_attn_patches)
run unchanged and match torch's attention in values and gradients, bert_padding's two unpad_input
conventions, and the start-up hook that installs the shim from the environment."""
import importlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import types
import zipfile

import pytest

torch = pytest.importorskip("torch")

import attnserve  # noqa: E402
from attnserve import flash_attn_shim  # noqa: E402
from server_process import REPO_ROOT  # noqa: E402
from torch_reference import attention_varlen  # noqa: E402
from torch_threads import one_torch_thread  # noqa: E402,F401  (autouse fixture)

CLIENT_DIR = REPO_ROOT / "client" / "python"
SHIM_MODULES = ("flash_attn", "flash_attn.flash_attn_interface", "flash_attn.bert_padding")



@pytest.fixture
def shim():
    attnserve.install_flash_attn_shim()
    yield
    flash_attn_shim.uninstall_flash_attn_shim()
    sys.modules.pop("flash_attn_patches", None)


@pytest.fixture
def patches(shim, client):
    attnserve.set_default_client(client)  # the patches' FlashAttention calls name no server
    yield importlib.import_module("flash_attn_patches")
    attnserve.set_default_client(None)


def _rel(actual, expected):
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-300))


def _masked_causal_reference(q, k, v, mask):
    """[bsz, seqlen, heads, dim] tensors: causal attention among each row's tokens where mask is 1
    (packed in order, as unpad_input packs them), zeros elsewhere; -> [bsz, seqlen, heads*dim]."""
    rows = []
    for b in range(q.shape[0]):
        keep = mask[b].nonzero().flatten() if mask is not None else torch.arange(q.shape[1])
        cu = torch.tensor([0, keep.numel()], dtype=torch.int32)
        out = attention_varlen(q[b, keep], k[b, keep], v[b, keep], cu, cu, causal=True)
        rows.append(torch.zeros(q.shape[1], *out.shape[1:], dtype=out.dtype)
                    .index_copy(0, keep, out))
    return torch.stack(rows).flatten(2)


def _padding_mask(lengths, seqlen, left=False):
    positions = torch.arange(seqlen)[None, :]
    lengths = torch.tensor(lengths)[:, None]
    return positions >= seqlen - lengths if left else positions < lengths


def _compare(patched, reference, leaves):
    """The patched and the reference attention agree in values and in gradients."""
    dout = torch.randn_like(patched)
    grads = torch.autograd.grad(patched, leaves, dout)
    ref_grads = torch.autograd.grad(reference, leaves, dout)
    assert _rel(patched, reference) <= 1e-5
    for grad, ref_grad in zip(grads, ref_grads):
        assert _rel(grad, ref_grad) <= 1e-5


def _leaf(*shape):
    return torch.randn(*shape, dtype=torch.float64).float().requires_grad_()


def test_flash_attn_modules_are_attnserve_s(shim):
    import flash_attn
    import flash_attn.bert_padding
    import flash_attn.flash_attn_interface
    from flash_attn import flash_attn_varlen_func

    for name in SHIM_MODULES:
        module = sys.modules[name]
        assert isinstance(module, types.ModuleType) and module.__spec__.name == name
        assert module.__version__ == "2.6.3" and module.__file__
        assert importlib.util.find_spec(name) is not None
    assert flash_attn.flash_attn_interface.flash_attn_func is attnserve.flash_attn.flash_attn_func
    assert flash_attn_varlen_func is attnserve.flash_attn_varlen_func
    assert flash_attn.bert_padding.pad_input is attnserve.bert_padding.pad_input
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("flash_attn.layers.rotary")  # not part of the shim


def test_distribution_metadata_satisfies_probes(shim):
    assert importlib.metadata.version("flash_attn") == "2.6.3"
    assert importlib.metadata.version("flash-attn") == "2.6.3"
    assert "flash_attn" in importlib.metadata.packages_distributions()["flash_attn"]
    transformers_import_utils = pytest.importorskip("transformers.utils.import_utils")
    assert transformers_import_utils._is_package_available("flash_attn", True) == (True, "2.6.3")
    flash_attn_shim.uninstall_flash_attn_shim()
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("flash_attn")


def test_unpad_input_returns_four_values_or_five_when_asked(shim):
    from flash_attn.bert_padding import pad_input, unpad_input

    hidden = _leaf(2, 5, 3)
    mask = _padding_mask([3, 5], 5)
    states, indices, cu_seqlens, max_seqlen = unpad_input(hidden, mask)
    assert states.shape == (8, 3) and cu_seqlens.tolist() == [0, 3, 8] and max_seqlen == 5
    assert cu_seqlens.dtype == torch.int32
    restored = pad_input(states, indices, 2, 5)
    assert torch.equal(restored, hidden * mask[..., None])
    grad, = torch.autograd.grad(restored.sum(), hidden)
    assert torch.equal(grad, mask[..., None].expand_as(hidden).float())

    attnserve.install_flash_attn_shim(unpad_input_returns=5)
    try:
        import flash_attn
        assert flash_attn.__version__ == "2.7.4"
        unused = torch.zeros(2, 5, dtype=torch.bool)
        unused[0, 3] = True  # allocated but not attended (flash-attn 2.7's unused_mask)
        *_, cu_seqlens, max_seqlen, seqused = unpad_input(hidden, mask, unused)
        assert cu_seqlens.tolist() == [0, 4, 9] and seqused.tolist() == [3, 5]
    finally:
        attnserve.install_flash_attn_shim(unpad_input_returns=4)


@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "right_padding"])
def test_llava_patch_runs_unchanged(patches, masked):
    bsz, heads, seqlen, dim = 3, 2, 9, 16
    q, k, v = (_leaf(bsz, heads, seqlen, dim) for _ in range(3))
    mask = _padding_mask([9, 4, 7], seqlen) if masked else None
    patched = patches.llava_attention(q, k, v, mask)
    reference = _masked_causal_reference(*(t.transpose(1, 2) for t in (q, k, v)), mask)
    _compare(patched, reference, [q, k, v])


@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "left_padding"])
def test_fastchat_patch_runs_unchanged_with_gqa(patches, masked):
    bsz, seqlen, heads, kv_heads, dim = 2, 8, 4, 2, 16
    q, k, v = _leaf(bsz, seqlen, heads, dim), _leaf(bsz, seqlen, kv_heads, dim), \
        _leaf(bsz, seqlen, kv_heads, dim)
    mask = _padding_mask([8, 5], seqlen, left=True) if masked else None
    patched = patches.fastchat_llama2_attention(q, k, v, mask)
    _compare(patched, _masked_causal_reference(q, k, v, mask), [q, k, v])


def _run_python(code, **env):
    environment = {**os.environ, "PYTHONPATH": str(CLIENT_DIR), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=environment)


# Runs the start-up hook as Python does for a .pth in site-packages.
_HOOK = f"import site; site.addsitedir({str(CLIENT_DIR)!r}); "


def test_environment_variable_installs_the_shim_at_start():
    code = _HOOK + "import flash_attn; print(flash_attn.__version__, flash_attn.__file__)"
    result = _run_python(code, ATTNSERVE_FLASH_ATTN_SHIM="1")
    assert result.returncode == 0, result.stderr
    version, path = result.stdout.split()
    assert version == "2.6.3" and path.endswith("flash_attn.py") and "attnserve" in path
    # Unset (or 0), the hook does nothing: not even attnserve is imported.
    code = _HOOK + "import sys; print('attnserve' in sys.modules); import flash_attn"
    result = _run_python(code, ATTNSERVE_FLASH_ATTN_SHIM="0")
    assert result.stdout.strip() == "False" and "No module named 'flash_attn'" in result.stderr


def test_wheel_installs_the_start_up_hook(tmp_path):
    # Built from a copy: setuptools writes build/ and egg-info beside the sources.
    source = shutil.copytree(CLIENT_DIR, tmp_path / "source",
                             ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                             "--no-build-isolation", "-w", str(tmp_path), str(source)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    wheel, = tmp_path.glob("attnserve-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        hook = archive.read("attnserve_flash_attn_shim.pth").decode()
    assert hook == (CLIENT_DIR / "attnserve_flash_attn_shim.pth").read_text()

"""ctypes binding of libattn_capi.so (attn_capi.h) for torch tensors on the GPU.

Used by tests/kernels/gpu and bench/: our kernels run in the same process as PyTorch's, on
PyTorch's current stream, reading and writing the tensors' device memory directly.

    lib = AttnLibrary(find_library())
    flash = lib.family("flash")                       # the device's own code path
    turing = lib.family("flash", compute_capability=75)
    sm80bwd = lib.family("flash", disabled_paths=PATH_SM90_BACKWARD)  # Hopper's sm80 path
    out, lse = flash.forward(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
"""

import ctypes
import math
import os
import pathlib

CAPI_VERSION = 5
DTYPE_FLOAT16, DTYPE_BFLOAT16, DTYPE_FLOAT32 = 0, 1, 2
# disabled_paths bits (ATTN_PATH_* in attn_capi.h), and their names in bench specs.
PATH_SM90_FORWARD, PATH_SM90_BACKWARD = 1, 2
PATH_NAMES = {"no-sm90-fwd": PATH_SM90_FORWARD, "no-sm90-bwd": PATH_SM90_BACKWARD}

_REPO = pathlib.Path(__file__).resolve().parents[2]
_DEFAULT_PATHS = [
    _REPO / "build-gpu" / "lib" / "libattn_capi.so",
    _REPO / "build" / "lib" / "libattn_capi.so",
]


class AttnFwdArgs(ctypes.Structure):
    _fields_ = [
        ("dtype", ctypes.c_int32),
        ("batch", ctypes.c_int32),
        ("total_q", ctypes.c_int64),
        ("total_k", ctypes.c_int64),
        ("num_heads", ctypes.c_int32),
        ("num_heads_k", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("max_seqlen_q", ctypes.c_int32),
        ("max_seqlen_k", ctypes.c_int32),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
        ("softcap", ctypes.c_float),
        ("cu_seqlens_q_device", ctypes.c_void_p),
        ("cu_seqlens_k_device", ctypes.c_void_p),
        ("cu_seqlens_q_host", ctypes.c_void_p),
        ("cu_seqlens_k_host", ctypes.c_void_p),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("stream", ctypes.c_void_p),
        ("compute_capability", ctypes.c_int32),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("disabled_paths", ctypes.c_uint32),
        ("dropout_p", ctypes.c_float),
        ("dropout_seed", ctypes.c_uint64),
        ("alibi_slopes", ctypes.c_void_p),
        ("alibi_slopes_stride", ctypes.c_int32),
        ("first_sequence", ctypes.c_int32),
    ]


class AttnBwdArgs(ctypes.Structure):
    _fields_ = [
        ("fwd", AttnFwdArgs),
        ("dout", ctypes.c_void_p),
        ("dq", ctypes.c_void_p),
        ("dk", ctypes.c_void_p),
        ("dv", ctypes.c_void_p),
        ("deterministic", ctypes.c_int32),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
    ]


class KernelError(RuntimeError):
    """The kernel refused the call; the message says why (e.g. 'flash: fp32 is not supported')."""


def find_library():
    """Path of the built .so ($ATTN_CAPI first), or None."""
    env = os.environ.get("ATTN_CAPI")
    candidates = [pathlib.Path(env)] if env else _DEFAULT_PATHS
    for path in candidates:
        if path.is_file():
            return path
    return None


class AttnLibrary:
    def __init__(self, path):
        self.path = pathlib.Path(path)
        self._lib = ctypes.CDLL(str(self.path))
        lib = self._lib
        lib.attn_capi_version.restype = ctypes.c_int
        lib.attn_capi_families.restype = ctypes.c_char_p
        fwd, bwd = ctypes.POINTER(AttnFwdArgs), ctypes.POINTER(AttnBwdArgs)
        for name, args_type in (("forward", fwd), ("backward", bwd)):
            run = getattr(lib, f"attn_{name}")
            run.restype = ctypes.c_int
            run.argtypes = [ctypes.c_char_p, args_type, ctypes.c_char_p, ctypes.c_size_t]
            size = getattr(lib, f"attn_{name}_workspace_bytes")
            size.restype = ctypes.c_size_t
            size.argtypes = [ctypes.c_char_p, args_type]
        version = lib.attn_capi_version()
        if version != CAPI_VERSION:
            raise RuntimeError(f"{path}: C ABI version {version}, expected {CAPI_VERSION}")

    def families(self):
        """Names of the GPU kernel families built into the library."""
        return [f for f in self._lib.attn_capi_families().decode().split(",") if f]

    def family(self, name, compute_capability=0, disabled_paths=0):
        """One family's entry points; compute_capability (major*10+minor, 0 = the device's own)
        picks the code path, e.g. 75 runs Turing's on a newer GPU; disabled_paths (PATH_* bits)
        switches paths off within it, e.g. PATH_SM90_BACKWARD runs the sm80 backward on Hopper."""
        return KernelFamily(self._lib, name, compute_capability, disabled_paths)


class KernelFamily:
    def __init__(self, lib, name, compute_capability, disabled_paths=0):
        self._lib = lib
        self.name = name
        self.compute_capability = compute_capability
        self.disabled_paths = disabled_paths
        self._name = name.encode()

    def forward(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0, out=None,
                lse=None, workspace=None, cu_seqlens_q_host=None, cu_seqlens_k_host=None,
                stream=None, dtype_code=None, dropout_p=0.0, dropout_seed=0,
                alibi_slopes=None, first_sequence=0):
        """flash_attn_varlen_func's forward: q [total_q, H, D], k/v [total_k, Hk, D], int32
        cu_seqlens on the GPU. Returns (out, lse [H, total_q] float32); allocates the workspace
        (a uint8 tensor) unless given. alibi_slopes: float32 on the GPU, [H] or [batch, H].
        Raises KernelError."""
        import torch

        total_q, num_heads, _ = q.shape
        if out is None:
            out = torch.empty_like(q)
        if lse is None:
            lse = torch.empty((num_heads, total_q), dtype=torch.float32, device=q.device)
        args = _fwd_args(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, softmax_scale, causal, window, softcap,
                         cu_seqlens_q_host, cu_seqlens_k_host, stream, dtype_code,
                         self.compute_capability, self.disabled_paths)
        _set_dropout_alibi(args, dropout_p, dropout_seed, alibi_slopes, first_sequence)
        if workspace is None:
            size = self._lib.attn_forward_workspace_bytes(self._name, ctypes.byref(args))
            workspace = torch.empty(max(size, 1), dtype=torch.uint8, device=q.device)
        args.workspace = workspace.data_ptr()
        args.workspace_bytes = workspace.numel()
        err = ctypes.create_string_buffer(512)
        failed = self._lib.attn_forward(self._name, ctypes.byref(args), err, len(err)) != 0
        if failed:
            raise KernelError(err.value.decode())
        return out, lse

    def backward(self, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                 max_seqlen_k, *, softmax_scale=None, causal=False, window=(-1, -1),
                 softcap=0.0, deterministic=False, dq=None, dk=None, dv=None, workspace=None,
                 cu_seqlens_q_host=None, cu_seqlens_k_host=None, stream=None, dtype_code=None,
                 dropout_p=0.0, dropout_seed=0, alibi_slopes=None, first_sequence=0):
        """flash_attn_varlen_func's backward from the forward's out and lse. Returns
        (dq, dk, dv); allocates the workspace (a uint8 tensor) unless given. Raises
        KernelError."""
        import torch

        if not dout.is_contiguous():
            raise ValueError("dout must be contiguous")
        dq = torch.empty_like(q) if dq is None else dq
        dk = torch.empty_like(k) if dk is None else dk
        dv = torch.empty_like(v) if dv is None else dv
        args = AttnBwdArgs(
            fwd=_fwd_args(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                          max_seqlen_k, softmax_scale, causal, window, softcap,
                          cu_seqlens_q_host, cu_seqlens_k_host, stream, dtype_code,
                          self.compute_capability, self.disabled_paths),
            dout=dout.data_ptr(), dq=dq.data_ptr(), dk=dk.data_ptr(), dv=dv.data_ptr(),
            deterministic=int(bool(deterministic)))
        _set_dropout_alibi(args.fwd, dropout_p, dropout_seed, alibi_slopes, first_sequence)
        if workspace is None:
            size = self._lib.attn_backward_workspace_bytes(self._name, ctypes.byref(args))
            workspace = torch.empty(max(size, 1), dtype=torch.uint8, device=q.device)
        args.workspace = workspace.data_ptr()
        args.workspace_bytes = workspace.numel()
        err = ctypes.create_string_buffer(512)
        failed = self._lib.attn_backward(self._name, ctypes.byref(args), err, len(err)) != 0
        if failed:
            raise KernelError(err.value.decode())
        return dq, dk, dv

    def forward_workspace_bytes(self, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                max_seqlen_q, max_seqlen_k, *, softmax_scale=None, causal=False,
                                cu_seqlens_q_host=None, cu_seqlens_k_host=None, dtype_code=None):
        """Bytes of the device workspace forward() needs for these inputs (no window, softcap,
        dropout or ALiBi)."""
        args = _fwd_args(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, softmax_scale, causal, (-1, -1), 0.0, cu_seqlens_q_host,
                         cu_seqlens_k_host, None, dtype_code, self.compute_capability,
                         self.disabled_paths)
        return self._lib.attn_forward_workspace_bytes(self._name, ctypes.byref(args))

    def backward_workspace_bytes(self, q, k, cu_seqlens_q, cu_seqlens_k, deterministic=False,
                                 dtype_code=DTYPE_BFLOAT16):
        """Bytes of the device workspace backward() needs for these shapes."""
        args = AttnBwdArgs(fwd=AttnFwdArgs(
            dtype=dtype_code, batch=cu_seqlens_q.numel() - 1, total_q=q.shape[0],
            total_k=k.shape[0], num_heads=q.shape[1], num_heads_k=k.shape[1],
            head_dim=q.shape[2], compute_capability=self.compute_capability,
            disabled_paths=self.disabled_paths),
            deterministic=int(bool(deterministic)))
        return self._lib.attn_backward_workspace_bytes(self._name, ctypes.byref(args))


def _fwd_args(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
              softmax_scale, causal, window, softcap, cu_seqlens_q_host, cu_seqlens_k_host,
              stream, dtype_code, compute_capability, disabled_paths):
    import torch

    for name, t in (("q", q), ("k", k), ("v", v), ("out", out), ("cu_seqlens_q", cu_seqlens_q),
                    ("cu_seqlens_k", cu_seqlens_k)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    total_q, num_heads, head_dim = q.shape
    total_k, num_heads_k, _ = k.shape
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    if dtype_code is None:
        dtype_code = {torch.float16: DTYPE_FLOAT16, torch.bfloat16: DTYPE_BFLOAT16,
                      torch.float32: DTYPE_FLOAT32}[q.dtype]
    if stream is None:
        stream = torch.cuda.current_stream(q.device).cuda_stream
    return AttnFwdArgs(
        dtype=dtype_code, batch=cu_seqlens_q.numel() - 1, total_q=total_q, total_k=total_k,
        num_heads=num_heads, num_heads_k=num_heads_k, head_dim=head_dim,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, causal=int(bool(causal)),
        window_left=window[0], window_right=window[1], softmax_scale=softmax_scale,
        softcap=softcap,
        cu_seqlens_q_device=cu_seqlens_q.data_ptr(),
        cu_seqlens_k_device=cu_seqlens_k.data_ptr(),
        cu_seqlens_q_host=_host_ptr(cu_seqlens_q_host),
        cu_seqlens_k_host=_host_ptr(cu_seqlens_k_host),
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), out=out.data_ptr(),
        lse=lse.data_ptr(), stream=stream, compute_capability=compute_capability,
        disabled_paths=disabled_paths)


def _set_dropout_alibi(args, dropout_p, dropout_seed, alibi_slopes, first_sequence):
    args.dropout_p = dropout_p
    args.dropout_seed = dropout_seed
    args.first_sequence = first_sequence
    if alibi_slopes is None:
        return
    import torch

    if (alibi_slopes.dtype != torch.float32 or not alibi_slopes.is_cuda
            or not alibi_slopes.is_contiguous() or alibi_slopes.dim() not in (1, 2)):
        raise ValueError("alibi_slopes must be a contiguous float32 CUDA tensor, [H] or [B, H]")
    args.alibi_slopes = alibi_slopes.data_ptr()
    args.alibi_slopes_stride = 0 if alibi_slopes.dim() == 1 else alibi_slopes.shape[1]


def _host_ptr(tensor):
    if tensor is None:
        return None
    assert tensor.device.type == "cpu" and tensor.is_contiguous()
    return tensor.data_ptr()

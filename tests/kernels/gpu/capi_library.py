"""The GPU tests' handle on libattn_capi.so (kernels/capi): one loaded library per session, and
a skip (not a failure) for a module whose family is not built into it."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "kernels" / "capi"))
import attn_capi  # noqa: E402
# Re-exported for the tests.
from attn_capi import KernelError, PATH_SM90_BACKWARD, PATH_SM90_FORWARD  # noqa: E402,F401

_library = None


def library():
    """The loaded library, or a module-level skip when it is not built."""
    global _library
    if _library is None:
        path = attn_capi.find_library()
        if path is None:
            pytest.skip("libattn_capi.so is not built", allow_module_level=True)
        _library = attn_capi.AttnLibrary(path)
    return _library


def load_family(name, compute_capability=0, disabled_paths=0):
    """One kernel family's entry points (disabled_paths: attn_capi.PATH_* bits, e.g.
    PATH_SM90_BACKWARD), or a module-level skip when it is not built."""
    lib = library()
    if name not in lib.families():
        pytest.skip(f"kernel family {name!r} is not built into {lib.path}",
                    allow_module_level=True)
    return lib.family(name, compute_capability, disabled_paths)

"""The GPU tests' handle on libattn_capi.so (kernels/capi): one loaded library per session, and
a skip (not a failure) for a module whose family is not built into it."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "kernels" / "capi"))
import attn_capi  # noqa: E402
from attn_capi import KernelError  # noqa: E402,F401  (re-exported for the tests)

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


def load_family(name, compute_capability=0, environment=None):
    """One kernel family's entry points (with `environment` set around each call, for
    switches such as ATTN_FLASH_BWD_SM90), or a module-level skip when it is not built."""
    lib = library()
    if name not in lib.families():
        pytest.skip(f"kernel family {name!r} is not built into {lib.path}",
                    allow_module_level=True)
    return lib.family(name, compute_capability, environment)

"""install_flash_attn_shim(): `import flash_attn` (and flash_attn.flash_attn_interface,
flash_attn.bert_padding) resolve to attnserve, so code written for FlashAttention, such as the
monkey patches of LLaVA, FastChat and InternVL, runs unchanged with attention on the server.

A finder placed first on sys.meta_path makes real modules named flash_attn,
flash_attn.flash_attn_interface and flash_attn.bert_padding, whose contents are attnserve's
(attnserve.flash_attn, attnserve.bert_padding), with a __spec__, __file__ and __version__. The
same finder answers importlib.metadata for the distribution "flash_attn" (version, top-level
package), so probes such as transformers' (importlib.util.find_spec, importlib.metadata.version,
packages_distributions) see an installed flash-attn. Other flash_attn submodules (layers, ops,
...) do not exist under the shim and fail to import as missing modules do.

At interpreter start: with ATTNSERVE_FLASH_ATTN_SHIM=1 in the environment, the
attnserve_flash_attn_shim.pth file that the package installs into site-packages calls
install_flash_attn_shim() before any user code runs (for programs that cannot be edited).
"""
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import pathlib
import sys
import threading
import warnings

SHIM_ENV = "ATTNSERVE_FLASH_ATTN_SHIM"
PACKAGE = "flash_attn"
# The flash-attn API each unpad_input convention belongs to: 2.7 added unpad_input's fifth value.
API_VERSIONS = {4: "2.6.3", 5: "2.7.4"}
# Shim module name -> the attnserve module whose public names it carries.
_MODULES = {
    "flash_attn": "attnserve.flash_attn",
    "flash_attn.flash_attn_interface": "attnserve.flash_attn",
    "flash_attn.bert_padding": "attnserve.bert_padding",
}
_lock = threading.Lock()


def _bert_padding():
    # Imported when first needed: it imports torch, which the .pth hook at interpreter start
    # should not pay for before flash_attn is imported at all.
    from . import bert_padding
    return bert_padding


def api_version() -> str:
    """The flash-attn version the shim reports, by unpad_input's number of return values."""
    return API_VERSIONS[_bert_padding().UNPAD_INPUT_RETURNS]


class _ShimLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module):
        source = importlib.import_module(_MODULES[module.__name__])
        for name in source.__all__:
            setattr(module, name, getattr(source, name))
        module.__all__ = list(source.__all__)
        module.__version__ = api_version()
        module.__attnserve_shim__ = True
        if module.__name__ == PACKAGE:
            # As flash_attn's own __init__ does: attribute access works after `import flash_attn`.
            module.flash_attn_interface = importlib.import_module(PACKAGE + ".flash_attn_interface")
            module.bert_padding = importlib.import_module(PACKAGE + ".bert_padding")


class _ShimDistribution(importlib.metadata.Distribution):
    """Metadata of the distribution flash_attn, as an installed wheel would have."""

    def read_text(self, filename):
        if filename == "METADATA":
            return (f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {api_version()}\n"
                    "Summary: FlashAttention's API served by attnserve (attnserve's shim)\n")
        if filename == "top_level.txt":
            return PACKAGE + "\n"
        return None

    def locate_file(self, path):
        return pathlib.Path(__file__).parent / path


class _ShimFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        source = _MODULES.get(fullname)
        if source is None:
            return None
        origin = importlib.util.find_spec(source).origin
        spec = importlib.machinery.ModuleSpec(fullname, _ShimLoader(), origin=origin,
                                              is_package=fullname == PACKAGE)
        spec.has_location = True  # so the module gets a __file__, as an installed one has
        return spec

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        # Only for lookups of the running interpreter's own path: tools that scan explicit
        # directories (pip) must see what is really installed there.
        if context.path is not sys.path:
            return iter(())
        name = context.name
        if name is not None and name.replace("-", "_").lower() != PACKAGE:
            return iter(())
        return iter((_ShimDistribution(),))


_finder = _ShimFinder()


def install_flash_attn_shim(unpad_input_returns=None) -> None:
    """Makes `import flash_attn` (and its flash_attn_interface and bert_padding) resolve to
    attnserve from now on. Idempotent. unpad_input_returns (4 or 5) sets
    flash_attn.bert_padding.unpad_input's number of return values (see attnserve.bert_padding).

    A real flash_attn imported earlier is dropped from sys.modules (with a warning): modules
    that already hold its functions keep them, so install the shim before importing such code.
    """
    if unpad_input_returns is not None:
        if unpad_input_returns not in API_VERSIONS:
            raise ValueError(f"unpad_input_returns={unpad_input_returns!r}: expected 4 or 5")
        _bert_padding().UNPAD_INPUT_RETURNS = unpad_input_returns
    with _lock:
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
        loaded = [name for name, module in list(sys.modules.items())
                  if (name == PACKAGE or name.startswith(PACKAGE + "."))
                  and not getattr(module, "__dict__", {}).get("__attnserve_shim__", False)]
        for name in loaded:
            del sys.modules[name]
    if loaded:
        warnings.warn("install_flash_attn_shim: flash_attn was already imported; code that "
                      "imported it before keeps the real one", RuntimeWarning, stacklevel=2)
    importlib.invalidate_caches()
    module = sys.modules.get(PACKAGE)
    if module is not None:  # installed before with another unpad_input convention
        for shim in (module, module.flash_attn_interface, module.bert_padding):
            shim.__version__ = api_version()


def uninstall_flash_attn_shim() -> None:
    """Undoes install_flash_attn_shim (for tests): the finder goes and the shim modules leave
    sys.modules, so the next `import flash_attn` finds whatever is really installed."""
    with _lock:
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        # A snapshot, read through __dict__: a lazy module's __getattr__ (transformers', on the
        # GPU machine) imports more modules while sys.modules is being looked through.
        for name in [n for n, m in list(sys.modules.items())
                     if getattr(m, "__dict__", {}).get("__attnserve_shim__", False)]:
            del sys.modules[name]


def _install_from_environment() -> None:
    """Called by attnserve_flash_attn_shim.pth at interpreter start."""
    if os.environ.get(SHIM_ENV, "").strip() not in ("", "0"):
        install_flash_attn_shim()

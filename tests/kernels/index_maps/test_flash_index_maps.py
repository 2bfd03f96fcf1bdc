"""The flash kernels' CPU-side index-map checks (kernels/flash/check_*.py) as tests: each script
emulates what the threads of a kernel store and read, and the layouts, fragments, reductions, masks
and tile order the kernel relies on, and raises on the first mismatch. No GPU needed, so CI runs
them on every change."""
import pathlib
import runpy
import sys

import pytest

FLASH = pathlib.Path(__file__).resolve().parents[3] / "kernels" / "flash"


@pytest.mark.parametrize("script", sorted(p.name for p in FLASH.glob("check_*.py")))
def test_index_maps(script, monkeypatch):
    # As if run on its own: a script that parses options must not see pytest's.
    monkeypatch.setattr(sys, "argv", [str(FLASH / script)])
    runpy.run_path(str(FLASH / script), run_name="__main__")

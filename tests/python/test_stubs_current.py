"""The committed stubs are exactly what generate_stubs.py makes from the current protos."""
import importlib.util
import pathlib

import pytest

CLIENT_DIR = pathlib.Path(__file__).resolve().parents[2] / "client" / "python"


def _load_generator():
    spec = importlib.util.spec_from_file_location("generate_stubs",
                                                  CLIENT_DIR / "generate_stubs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_are_current(tmp_path):
    generator = _load_generator()
    generator.generate(tmp_path)
    for name in generator.GENERATED:
        committed = generator.PACKAGE_OUT / name
        assert committed.exists(), f"{committed} is missing: run client/python/generate_stubs.py"
        if committed.read_bytes() != (tmp_path / name).read_bytes():
            pytest.fail(f"{committed} is stale: run client/python/generate_stubs.py")

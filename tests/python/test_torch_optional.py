"""torch is an optional dependency: `import attnserve` and the numpy client work without it."""
import subprocess
import sys

# torch made unimportable, as on a machine without it.
SCRIPT = """
import sys
sys.modules["torch"] = None
import attnserve
assert attnserve.Client and attnserve.set_default_client
try:
    attnserve.flash_attn_varlen_func
except ModuleNotFoundError as error:
    assert "attnserve[torch]" in str(error), error
else:
    raise AssertionError("flash_attn_varlen_func without torch")
"""


def test_import_without_torch():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr

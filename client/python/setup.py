"""Packaging beyond pyproject.toml: attnserve_flash_attn_shim.pth goes to the root of
site-packages, where Python runs it at start-up (it installs the flash_attn shim when
$ATTNSERVE_FLASH_ATTN_SHIM is set, and does nothing else). setuptools has no declarative way to
place a file there, hence this build_py. Editable installs (pip install -e) do not carry it;
scripts/setup.sh copies it into the development virtualenv."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

STARTUP_PTH = "attnserve_flash_attn_shim.pth"


class BuildPyWithStartupPth(build_py):
    def run(self):
        super().run()
        self.copy_file(STARTUP_PTH, os.path.join(self.build_lib, STARTUP_PTH))

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, STARTUP_PTH)]


setup(cmdclass={"build_py": BuildPyWithStartupPth})

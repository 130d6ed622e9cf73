"""Builds kwker_torch: `pip install --no-build-isolation -e .` (torch must already be installed).

The native part is one shared library, `kwker_torch/libkwker_shim.so`, built by cargo from the
workspace: the Rust kernels (`rust/`) and the stable-ABI registration shim (`csrc-shim/`). It is loaded
with `torch.ops.load_library`, not imported as a Python module, so it does not depend on the Python ABI,
and it links only torch's stable C functions, so one build keeps working on later torch releases.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
LIB = "libkwker_shim.so"


class CargoBuild(build_ext):
    """Runs `cargo build --release -p kwker-shim` and places the library inside the package."""

    def get_ext_filename(self, fullname: str) -> str:
        return os.path.join(*fullname.split(".")[:-1], LIB)

    def build_extension(self, ext: Extension) -> None:
        try:
            import torch
        except ImportError:
            sys.exit(
                "kwker: torch must be installed before building (pip install torch==2.13.0), and the build "
                "must see it: use `pip install --no-build-isolation -e .`"
            )
        env = dict(os.environ, KWKER_TORCH_DIR=os.path.dirname(torch.__file__), PYTHON=sys.executable)
        subprocess.check_call(["cargo", "build", "--release", "-p", "kwker-shim"], cwd=ROOT, env=env)
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(os.path.join(ROOT, "target", "release", LIB), dest)


class AnyPythonWheel(bdist_wheel):
    """Tags the wheel `py3-none-<platform>`: the library is loaded by torch, not imported by Python, so one wheel
    serves every Python 3 on the platform. `auditwheel repair` (see tests/project/test_wheel.py) then retags it
    manylinux, leaving torch's own libraries out of it."""

    def get_tag(self) -> tuple[str, str, str]:
        return "py3", "none", super().get_tag()[2]


setup(
    ext_modules=[Extension("kwker_torch.libkwker_shim", sources=[])],
    cmdclass={"build_ext": CargoBuild, "bdist_wheel": AnyPythonWheel},
)

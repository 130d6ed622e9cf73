"""The wheel, as a new user meets it: ``pip wheel . -w dist`` builds it (cargo runs here, once), ``auditwheel
repair`` makes it a release artifact tagged manylinux (torch's own library left out: the wheel runs against the
user's torch), then it installs into a fresh virtual environment and runs there with no cargo on PATH and the
repository out of sight: the import, ``torch.ops.kwker.linear`` against ``F.linear``, ``decode.install()`` greedy
tokens against the stock model's, the sample text shipped in the package, and ``python -m kwker.serve --help``.

The venv sees the system site-packages for torch and transformers (no network at test time), so the script
first checks that ``kwker_torch`` is imported from the wheel, not from this checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import os, sys, subprocess
import torch
import torch.nn.functional as F
import kwker_torch
from kwker_torch import decode, texts
from kwker_torch.testing import generate_greedy, random_model

where = os.path.realpath(kwker_torch.__file__)
assert where.startswith(os.path.realpath(sys.prefix)), f"kwker_torch came from {where}, not the venv"
x, w = torch.randn(5, 64, dtype=torch.bfloat16), torch.randn(96, 64, dtype=torch.bfloat16)
got = torch.ops.kwker.linear(x, w, None)
assert torch.allclose(got.float(), F.linear(x.float(), w.float()), rtol=2e-2, atol=2e-2)
model = random_model("SmolLM2-360M", torch.bfloat16, num_hidden_layers=2).float()
ids = torch.arange(3, 20)[None]
want = generate_greedy(model, ids, 6, exact=True)
decode.install(model, max_batch=1, max_context=64)
assert decode.is_installed(model) and torch.equal(generate_greedy(model, ids, 6, exact=True), want)
assert len(texts.sample_text()) > 5000
out = subprocess.run([sys.executable, "-m", "kwker.serve", "--help"], capture_output=True, text=True)
assert out.returncode == 0 and "--precision" in out.stdout, out.stderr
print("wheel ok", where)
"""


def test_the_wheel_installs_and_runs_without_cargo(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", str(ROOT),
                            "-w", str(dist)], capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    (raw,) = dist.glob("kwker_torch-*-py3-none-linux_*.whl")
    # A release artifact: the platform tag auditwheel proves from the symbols the library uses. libtorch_cpu.so
    # is the user's torch, found at run time, never bundled.
    fixed = tmp_path / "fixed"
    repair = subprocess.run([sys.executable, "-m", "auditwheel", "repair", "--exclude", "libtorch_cpu.so",
                             "-w", str(fixed), str(raw)], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert repair.returncode == 0, repair.stderr[-3000:]
    (wheel,) = fixed.glob("kwker_torch-*-py3-none-manylinux_*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    # No cargo (nor rustc) anywhere on PATH: the wheel must not need them.
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not (shutil.which("cargo", path=d) or shutil.which("rustc", path=d))]  # fmt: skip
    env = {**os.environ, "PATH": os.pathsep.join([str(venv / "bin"), *path]), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""}  # fmt: skip
    assert shutil.which("cargo", path=env["PATH"]) is None
    inst = subprocess.run([py, "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", str(wheel)],
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert inst.returncode == 0, inst.stderr[-3000:]
    run = subprocess.run([py, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                         timeout=900)  # fmt: skip
    assert run.returncode == 0 and "wheel ok" in run.stdout, (run.stdout[-2000:], run.stderr[-3000:])

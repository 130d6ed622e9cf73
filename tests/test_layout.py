"""The Python side's layout holds: a package per subsystem, product modules that never import the test helpers,
no file over 600 lines, and the old public names still the same objects as the new ones."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kwker_torch"
# The compatibility module `kwker_torch.models` re-exports the test helpers on purpose (scripts, notebooks).
ALLOWED = {PACKAGE / "models.py"}


def imported(path: Path) -> set[str]:
    """Absolute names of the modules `path` imports (relative imports resolved against its package)."""
    pkg = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)] if node.level else []
            mod = ".".join([*base, node.module] if node.module else base)
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return out


def test_no_product_module_imports_the_test_helpers() -> None:
    for path in PACKAGE.rglob("*.py"):
        if "testing" in path.relative_to(PACKAGE).parts or path in ALLOWED:
            continue
        bad = sorted(m for m in imported(path) if m == "kwker_torch.testing" or m.startswith("kwker_torch.testing."))
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}: product code loads models through kwker_torch.hf"


def test_no_python_file_over_600_lines() -> None:
    for sub in ["kwker_torch", "kwker", "tests", "benchmarks"]:
        for path in (ROOT / sub).rglob("*.py"):
            n = len(path.read_text().splitlines())
            assert n <= 600, f"{path.relative_to(ROOT)} has {n} lines; split it by what its parts do"


def test_old_names_are_the_new_modules() -> None:
    code = """
import kwker_torch.torch_ops as a, kwker_torch.ops.install as b
import kwker_torch.compile_backend as c, kwker_torch.compile.backend as d
import kwker_torch.quality as e, kwker_torch.tools.quality as f
from kwker_torch import models, hf, testing
assert a is b and c is d and e is f
assert models.load_smollm2 is hf.load_smollm2 and models.random_model is testing.random_model
from importlib.metadata import entry_points
(ep,) = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "kwker"]
assert ep.load() is d.kwker_backend, ep
print("ok")
"""
    # A fresh interpreter: the aliases must hold on a first import, whatever this process imported before.
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every simple cycle through the graph's edges, each listed once from its smallest module."""
    found = []
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start and path[0] == min(path):
                    found.append([*path, start])
                elif nxt not in path and nxt > start:
                    stack.append((nxt, [*path, nxt]))
    return found


def _python_imports(path: Path) -> set[str]:
    """Sibling modules `path` imports at run time (type-only imports under TYPE_CHECKING excluded)."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}  # fmt: skip
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, ast.ImportFrom) or node.level != 1:
            continue
        out |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
    return out


def test_no_import_cycle_in_the_decoder_packages() -> None:
    """Neither the Python decoder package nor `rust/src/decoder/` has modules that import each other in a ring
    (a reader can take them top-down)."""
    py = {p.stem: p for p in (PACKAGE / "decoder").glob("*.py")}
    graph = {m: {d for d in _python_imports(p) if d in py and d != m} for m, p in py.items()}
    assert not _cycles(graph), f"kwker_torch/decoder import cycles: {_cycles(graph)}"
    rs = {p.stem: p.read_text() for p in (ROOT / "rust" / "src" / "decoder").glob("*.rs")}
    graph = {}
    for m, text in rs.items():
        names = set(re.findall(r"use super::(\w+)", text))
        for group in re.findall(r"use super::\{([^}]*)\}", text):
            names |= {g.split("::")[0].strip() for g in group.split(",") if g.strip()}
        graph[m] = {n for n in names if n in rs and n != m}
    assert graph["layer"], "the scan found no `use super::` in layer.rs"
    assert not _cycles(graph), f"rust/src/decoder import cycles: {_cycles(graph)}"

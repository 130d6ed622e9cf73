"""The Python side's layout holds: a package per subsystem, product modules that never import the test helpers,
no file over 600 lines, the old public names still the same objects as the new ones, and the tests mirrored:
every test file in the folder of the subsystem it tests, each name once, every path to one that a page or a
comment gives still there."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


# Test folders besides the subsystems' (`tests/<subpackage>/` for each package of kwker_torch that has tests).
PROJECT_TESTS = {"project"}  # the repository as a whole: docs, this layout, the wheel
FIXTURES = "fixtures"  # the models and files several folders build, imported as `fixtures.*`


def test_tests_mirror_the_subsystems() -> None:
    """Every test file lives in `tests/<subsystem>/` (a package of kwker_torch) or `tests/project/`, never loose
    in `tests/`; names are unique across folders (pytest's default import mode, no `__init__.py` in the test
    folders, imports each file by its name alone); helpers shared by several folders are in `tests/fixtures/`."""
    tests = ROOT / "tests"
    subsystems = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    allowed = subsystems | PROJECT_TESTS
    loose = sorted(p.name for p in tests.glob("*.py") if p.name != "conftest.py")
    assert not loose, f"tests/ has {loose} directly: test files go in tests/<subsystem>/, helpers in tests/fixtures/"
    files = sorted(p for p in tests.rglob("test_*.py") if "__pycache__" not in p.parts)
    assert len(files) > 20, f"the scan found only {files}"
    for path in files:
        folder = path.relative_to(tests).parts[0]
        assert path.parent == tests / folder and folder in allowed, (
            f"{path.relative_to(ROOT)}: test files live one level down, in one of {sorted(allowed)}"
        )
    names = [p.name for p in files]
    assert len(set(names)) == len(names), f"test file names repeat: {sorted({n for n in names if names.count(n) > 1})}"
    packages = sorted(p.parent.name for p in tests.rglob("__init__.py") if p.parent.name != FIXTURES)
    assert not packages, f"tests/{packages} have __init__.py: test folders are not packages"
    assert (tests / FIXTURES / "__init__.py").is_file()


def test_named_test_paths_exist() -> None:
    """A `tests/...py` path that the pages, the code or a comment names leads to a file (moving a test file
    means updating who points at it). benchmarks/HISTORY.md records paths as they were and is not read."""
    sources = [ROOT / "README.md", ROOT / "DEVELOPERS.md", ROOT / "BENCHMARKS.md", ROOT / "requirements.txt",
               *(ROOT / "docs").glob("*.md"), *(ROOT / "scripts").glob("*"), *(ROOT / "benchmarks").glob("*.py"),
               *PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "rust").rglob("*.rs"),
               *(ROOT / "csrc-shim").rglob("*.rs")]  # fmt: skip
    named = re.compile(r"(?<![\w/.-])tests/[\w/]+\.py\b")
    missing = sorted(
        f"{src.relative_to(ROOT)}: {m}"
        for src in sources
        if src.is_file()
        for m in named.findall(src.read_text(errors="replace"))
        if not (ROOT / m).is_file()
    )
    assert not missing, f"paths to test files that do not exist: {missing}"


def test_one_sampler_and_one_draft_policy() -> None:
    """Tokens are drawn, warped and drafted only by ``rust/src/decoder/sample.rs`` / ``lookup.rs`` (through
    ``decoder/sampling.py`` and ``decoder/lookup.py``): no second sampler or proposal grows in Python."""
    pkg = ROOT / "kwker_torch"
    bad = []
    for f in sorted(pkg.rglob("*.py")):
        text = f.read_text()
        for pattern in (r"\.multinomial\(", r"torch\.Generator\(\)\.manual_seed", r"\bdef propose\("):
            if re.search(pattern, text) and f.relative_to(pkg).as_posix() != "decoder/lookup.py":
                bad.append(f"{f.relative_to(ROOT)}: {pattern}")
    assert not bad, bad

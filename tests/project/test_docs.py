"""The README and `docs/` cannot rot: every Python block runs, every command they show exists with the flags
they give it, every relative link leads to a file, and the environment-variable table names every `KWKER_*`
variable the code reads.

Python blocks run page by page in one namespace per page (later blocks use earlier names), on a tiny random
Qwen3 saved as a Hugging Face folder with Qwen's own tokenizer and chat template (tools included): the name
`path` in the pages is that folder. The server page's client blocks talk to the server's app over that model,
served from this process (`http://127.0.0.1:8000` in the page becomes its address). Blocks that name the real
SmolLM2 use it (installed by `scripts/setup.sh`, as the demo does).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kwker_torch.testing import qwen_tokenizer, random_model

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(page: Path, lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall(page.read_text()) if kind == lang]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Qwen3 (2 layers, hidden 64) and Qwen's tokenizer, saved as a Hugging Face folder."""
    out = tmp_path_factory.mktemp("docs-model")
    model = random_model("Qwen3-0.6B", num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    model.save_pretrained(out)
    qwen_tokenizer().save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def server(folder: str) -> Iterator[str]:
    from kwker_torch.serve import ServeOptions, create_app, engine_for
    from kwker_torch.serve.background import Background
    from kwker_torch.testing import load_local

    model, tok = load_local(folder)
    opts = ServeOptions(slots=2, max_context=1024, served_name="tiny-qwen3")
    engine = engine_for(model, tok, opts)
    run = Background(create_app(opts, engine=engine))
    yield run.url
    run.stop()
    engine.shutdown(grace=5)


def test_every_page_has_code_and_the_readme_fits_two_screens() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
    names = {p.name for p in PAGES}
    for page in ["decoder", "quantization", "server", "ops", "compile", "models", "processors", "limits"]:
        assert f"{page}.md" in names, f"docs/{page}.md is missing"


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "python")], ids=lambda p: p.name)
def test_python_blocks_run(page: Path, folder: str, request: pytest.FixtureRequest, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"path": folder, "__name__": f"docs_{page.stem}"}
    for i, body in enumerate(blocks(page, "python")):
        if "127.0.0.1:8000" in body:
            body = body.replace("http://127.0.0.1:8000", request.getfixturevalue("server"))
        try:
            exec(compile(body, f"{page.name}, python block {i + 1}", "exec"), namespace)  # noqa: S102
        except Exception as e:
            raise AssertionError(f"{page.name}: python block {i + 1} failed: {e!r}\n{body}") from e


def commands() -> list[tuple[str, str]]:
    """(page, line) of every `python -m ...` and `bash scripts/...` line of the pages' shell blocks."""
    out = []
    for page in PAGES:
        for body in blocks(page, "bash"):
            for line in body.splitlines():
                line = line.split("#")[0].strip()
                if line.startswith(("python -m ", "bash scripts/")):
                    out.append((page.name, line))
    return out


@pytest.mark.parametrize("page,line", commands())
def test_commands_exist_with_their_flags(page: str, line: str) -> None:
    if line.startswith("bash "):
        assert (ROOT / line.split()[1]).is_file(), f"{page}: {line}"
        return
    module = line.split()[2]
    if module.endswith(".ray"):
        pytest.importorskip("ray", reason="Ray Serve is an optional extra")
    help_text = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                               timeout=120, cwd=ROOT)  # fmt: skip
    assert help_text.returncode == 0, f"{page}: `python -m {module} --help` failed:\n{help_text.stderr[-2000:]}"
    for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line):
        assert flag in help_text.stdout, f"{page}: `{line}` uses {flag}, which `python -m {module}` does not take"


def test_relative_links_lead_to_files() -> None:
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


def test_the_variable_table_names_every_variable_the_code_reads() -> None:
    read = re.compile(r"""(?:environ\.get\(|environ\[|env::var(?:_os)?\(|getenv\()\s*["'](KWKER_[A-Z0-9_]+)""")
    found = set()
    for sub in ["kwker_torch", "kwker", "rust/src", "csrc-shim"]:
        for f in (ROOT / sub).rglob("*"):
            if f.suffix in {".py", ".rs"}:
                found |= set(read.findall(f.read_text(errors="replace")))
    assert {"KWKER_ISA", "KWKER_NUM_THREADS"} <= found, f"the scan missed known variables: {found}"
    table = (ROOT / "docs" / "processors.md").read_text()
    missing = sorted(v for v in found if f"`{v}`" not in table)
    assert not missing, f"docs/processors.md does not list {missing}"

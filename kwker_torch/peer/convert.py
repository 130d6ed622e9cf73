"""llama.cpp's own converter (``convert_hf_to_gguf.py`` of the pinned ``llama-cpp-python`` sdist) for the
benchmarks: a Hugging Face model folder into a GGUF of the same weights, for every family llama.cpp runs
(all of KwkDecoder's but OPT). Benchmark-only, like the rest of ``peer/``.

``converter()`` downloads the sdist once (``pip download --no-binary llama-cpp-python --no-deps``: no build)
and extracts ``vendor/llama.cpp/{convert_hf_to_gguf.py, conversion/, gguf-py/}`` into the peer cache; the
script puts its vendored ``gguf-py`` first on its own path, so the project's pinned ``gguf`` is untouched.
``convert_hf(folder, out, outtype)`` runs it in a subprocess and returns ``out``.

A random-weight model of another family carries the real SmolLM2's tokenizer (a byte-level BPE the converter
recognises); ``save_for_converter`` writes the model, that tokenizer, and ``tokenizer_class: GPT2Tokenizer``
(Phi-3's converter takes the GPT-2 path only when the tokenizer says so; it is what the tokenizer is), its
vocabulary padded with unreachable placeholders to the model's embedding rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from .build import PACKAGE, cache_root, pinned_version

PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def converter() -> Path:
    """The folder holding llama.cpp's convert_hf_to_gguf.py (fetched and extracted once)."""
    version = pinned_version()
    dest = cache_root() / f"llama.cpp-convert-{version}"
    script = dest / "convert_hf_to_gguf.py"
    if script.exists():
        return dest
    sdist_dir = cache_root() / "sdist"
    sdist = sdist_dir / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.exists():
        sdist_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", f"{PACKAGE}=={version}", "--no-binary", PACKAGE,
                        "--no-deps", "-d", str(sdist_dir)], check=True)  # fmt: skip
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    tmp = dest.with_name(dest.name + ".partial")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)
                   and any(m.name[len(prefix):].startswith(p) for p in PARTS)]  # fmt: skip
        for m in members:
            m.name = m.name[len(prefix) :]
        tar.extractall(tmp, members=members, filter="data")
    os.replace(tmp, dest)
    return dest


def save_for_converter(model: Any, tokenizer: Any, folder: str) -> str:
    """``model`` (safetensors) and ``tokenizer`` saved as a folder the converter reads."""
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    cfg_path = os.path.join(folder, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["tokenizer_class"] = "GPT2Tokenizer"
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)
    # The vocabulary padded with unreachable placeholder tokens up to the model's embedding rows: Gemma 3's
    # converter cuts the embedding to the tokenizer's size, which would leave llama.cpp a smaller model.
    tj_path = os.path.join(folder, "tokenizer.json")
    with open(tj_path) as f:
        tj = json.load(f)
    vocab = tj["model"]["vocab"]
    rows = int(model.get_input_embeddings().weight.shape[0])
    next_id = max(vocab.values()) + 1
    while len(vocab) + len(tj.get("added_tokens", [])) < rows:
        vocab[f"<kwker_pad_{next_id}>"] = next_id
        next_id += 1
    with open(tj_path, "w") as f:
        json.dump(tj, f)
    return folder


def convert_hf(folder: str, out: str, outtype: str = "bf16") -> str:
    """llama.cpp's conversion of the HF folder ``folder`` to ``out`` (``outtype`` "bf16", "f32", "f16", "q8_0")."""
    script = converter() / "convert_hf_to_gguf.py"
    tmp = f"{out}.partial-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
    proc = subprocess.run([sys.executable, str(script), folder, "--outfile", tmp, "--outtype", outtype],
                          capture_output=True, text=True, env=env)  # fmt: skip
    if proc.returncode != 0:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise RuntimeError(f"convert_hf_to_gguf.py failed on {folder}:\n{proc.stderr[-3000:]}")
    os.replace(tmp, out)
    return out


__all__ = ["convert_hf", "converter", "save_for_converter"]


def _main() -> int:  # pragma: no cover - a CLI for trying the converter by hand
    import argparse

    p = argparse.ArgumentParser(description="llama.cpp's convert_hf_to_gguf.py of the pinned sdist")
    p.add_argument("folder")
    p.add_argument("out")
    p.add_argument("--outtype", default="bf16")
    a = p.parse_args()
    print(convert_hf(a.folder, a.out, a.outtype))
    return 0


if __name__ == "__main__":
    sys.exit(_main())

"""``KwkDecoder.save`` / ``KwkDecoder.load``: a built decoder's stored tensors (packed panels, 8-/4-bit codes
with their scales, norms and biases) in a folder, so a server does not re-quantize at every start.

Folder layout: ``weights.safetensors`` holds one uint8 tensor per stored tensor, its bytes exactly as the
decoder keeps them (``KwkDecoder.export``); ``kwker.json`` holds the save format and version, the recipe and
limits (``KwkDecoder.describe``: the composition as data, which is all the native decoder needs), the Hugging
Face config, the family, the EOS ids, the ``info`` report, and per tensor its table name, layer, format,
expert (a sparse layer's experts), shape and SHA-256. Loading checks the format and version, every checksum,
and (in Rust) the recipe, every tensor's name, shape, length and scales before anything runs: a damaged or
foreign folder raises ``ValueError`` naming what is wrong. Numbers are bit-identical after a round trip (tested).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import torch

from . import native
from .common import kv_row_bytes

SAVE_FORMAT = "kwker-decoder"
# 2: tensors by table name and the recipe (issue 16), with an expert index per tensor since issue 17 (absent:
# 0); 1 (Llama-only numeric kinds) is refused.
SAVE_VERSION = 2
WEIGHTS, META = "weights.safetensors", "kwker.json"


def save(dec: Any, path: str | os.PathLike[str]) -> None:
    from safetensors.torch import save_file

    from .. import __version__

    os.makedirs(path, exist_ok=True)
    desc = dec.describe()
    tensors: dict[str, torch.Tensor] = {}
    index = []
    for t in desc["tensors"]:
        expert = t["expert"]
        fmt, rows, cols, data = dec.export(t["name"], t["layer"], expert)
        key = f"{t['name']}.{t['layer']}" + (f".{expert}" if native.TENSORS[t["name"]]["per_expert"] else "")
        tensors[key] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        index.append(
            {"key": key, "name": t["name"], "layer": t["layer"], "expert": expert, "format": fmt, "rows": rows,
             "cols": cols, "sha256": hashlib.sha256(data).hexdigest()}
        )  # fmt: skip
    meta = {
        "format": SAVE_FORMAT,
        "version": SAVE_VERSION,
        "kwker_version": __version__,
        "recipe": desc["recipe"],
        "limits": desc["limits"],
        "family": dec.family,
        "hf_config": dec.config.to_dict(),
        "eos": dec.eos_ids,
        "info": dec.info,
        "tensors": index,
    }
    w_tmp, m_tmp = (os.path.join(path, f"{n}.partial") for n in (WEIGHTS, META))
    save_file(tensors, w_tmp, metadata={"format": SAVE_FORMAT, "version": str(SAVE_VERSION)})
    with open(m_tmp, "w") as f:
        json.dump(meta, f)
    os.replace(w_tmp, os.path.join(path, WEIGHTS))
    os.replace(m_tmp, os.path.join(path, META))


def _bad(path: Any, why: str) -> ValueError:
    return ValueError(f"kwker: cannot load a decoder from {os.fspath(path)!r}: {why}")


def _meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    meta_path, weights_path = os.path.join(path, META), os.path.join(path, WEIGHTS)
    if not os.path.exists(meta_path) or not os.path.exists(weights_path):
        raise _bad(path, f"it needs {META} and {WEIGHTS} (written by KwkDecoder.save)")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise _bad(path, f"{META} is not readable JSON ({exc})") from exc
    if meta.get("format") != SAVE_FORMAT or meta.get("version") != SAVE_VERSION:
        raise _bad(
            path,
            f"it was saved as {meta.get('format')!r} version {meta.get('version')!r} (kwker "
            f"{meta.get('kwker_version', '?')}); this kwker reads {SAVE_FORMAT!r} version {SAVE_VERSION}: save it "
            "again from the Hugging Face model with this kwker",
        )
    return meta


def load(cls: Any, path: str | os.PathLike[str], max_batch: int | None, max_context: int | None,
         kv_cache: str | None = None) -> Any:  # fmt: skip
    meta = _meta(path)
    try:
        return _load(cls, path, meta, max_batch, max_context, kv_cache)
    except (KeyError, TypeError, AttributeError) as exc:  # an edited or cut kwker.json: say so, not a traceback
        raise _bad(path, f"{META} lacks or has a malformed entry ({type(exc).__name__}: {exc})") from exc


def _load(cls: Any, path: str | os.PathLike[str], meta: dict, max_batch: int | None, max_context: int | None,
          kv_cache: str | None) -> Any:  # fmt: skip
    from safetensors import safe_open
    from transformers import AutoConfig

    hf = dict(meta["hf_config"])
    try:
        cfg = AutoConfig.for_model(hf.pop("model_type"), **hf)
    except ValueError as exc:
        raise _bad(path, f"its Hugging Face config cannot be rebuilt ({exc})") from exc
    limits = dict(meta["limits"])
    slots = int(limits["slots"] if max_batch is None else max_batch)
    context = int(limits["max_context"] if max_context is None else max_context)
    kv = limits.get("kv", "f32") if kv_cache is None else kv_cache
    kv_row_bytes(kv, 1)  # an unknown format is the caller's error (ValueError naming the formats), not the file's
    try:
        b = native.Builder(meta["recipe"], slots, context, int(limits["chunk_rows"]), kv)
    except ValueError as exc:
        raise _bad(path, str(exc).removeprefix("kwker: ")) from exc
    try:
        st = safe_open(os.path.join(path, WEIGHTS), framework="pt")
    except Exception as exc:  # safetensors raises its own error types for a damaged header
        raise _bad(path, f"{WEIGHTS} is damaged ({exc})") from exc
    with st:
        for t in meta["tensors"]:
            try:
                data = st.get_tensor(t["key"]).contiguous()
            except Exception as exc:
                raise _bad(path, f"{WEIGHTS} lacks or cannot read tensor {t['key']} ({exc})") from exc
            # Hashed and handed over in place (no bytes copy per tensor), checked to be the flat bytes that
            # save wrote.
            if data.dtype != torch.uint8 or data.dim() != 1:
                raise _bad(path, f"tensor {t['key']} is {data.dtype} {list(data.shape)}, not flat uint8 bytes")
            if hashlib.sha256(data.numpy()).hexdigest() != t["sha256"]:
                raise _bad(path, f"tensor {t['key']} ({t['name']}, layer {t['layer']}) fails its checksum")
            try:
                if t["format"] == "vector":
                    if data.numel() != 4 * int(t["rows"]) * int(t["cols"]):
                        raise ValueError(f"{t['key']} has {data.numel()} bytes for {t['rows']} x {t['cols']} f32s")
                    b.set(t["name"], t["layer"], data.clone().view(torch.float32))  # a fresh, f32-aligned copy
                else:
                    b.set_packed(t["name"], t["layer"], t["format"], data, int(t["rows"]), int(t["cols"]),
                                 int(t.get("expert", 0)))  # fmt: skip
            except ValueError as exc:
                raise _bad(path, str(exc).removeprefix("kwker: ")) from exc
    # Everything read from kwker.json before the build, so that a malformed entry cannot leak a handle.
    info, r, eos, family = dict(meta["info"]), meta["recipe"], meta["eos"], meta.get("family", "")
    info["kv_cache"] = kv
    try:
        h = b.build()
    except ValueError as exc:
        raise _bad(path, str(exc).removeprefix("kwker: ")) from exc
    info["weight_bytes_per_token"] = int(native.LIB.kwker_decoder_weight_bytes(h))
    return cls(h, cfg, int(r["vocab"]), slots, context, info, eos, family)

"""``KwkDecoder.save`` / ``KwkDecoder.load``: a built decoder's stored weights (packed panels, 8-/4-bit codes
with their scales, norms and biases) in a folder, so a server does not re-quantize at every start.

Folder layout: ``weights.safetensors`` holds one uint8 tensor per stored tensor, its bytes exactly as the
decoder keeps them (``kwker_decoder_export``); ``kwker.json`` holds the save format and version, the decoder's
native config (shapes, rope frequencies, ...), the Hugging Face config (``KwkDecoder.config``), the EOS ids, the
``info`` report, and per tensor its kind, layer, format code, shape and SHA-256. Loading checks the format and
version, every checksum, and (in Rust) every length and scale before anything runs: a damaged or foreign folder
raises ``ValueError`` naming what is wrong. Numbers are bit-identical after a round trip (tested).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
from typing import Any

import torch

from . import _native

SAVE_FORMAT = "kwker-decoder"
SAVE_VERSION = 1
WEIGHTS, META = "weights.safetensors", "kwker.json"
# Tensor kinds (rust/src/decoder/builder.rs, Kind): model-level, then per layer.
MODEL_KINDS = (0, 1, 2)  # embed, lm_head, final norm
LAYER_KINDS = tuple(range(3, 13))
VECTOR = 4  # format code of an f32 vector in kwker_decoder_export
ERR_LEN = 2048


def _keys(layers: int) -> list[tuple[int, int]]:
    return [(k, 0) for k in MODEL_KINDS] + [(k, i) for i in range(layers) for k in LAYER_KINDS]


def _export(dec: Any, kind: int, layer: int) -> tuple[int, int, int, bytes]:
    lib, err = _native.LIB, ctypes.create_string_buffer(ERR_LEN)
    fmt, rows, cols, need = ctypes.c_int32(), ctypes.c_int64(), ctypes.c_int64(), ctypes.c_size_t()
    refs = [ctypes.byref(x) for x in (fmt, rows, cols)]
    if lib.kwker_decoder_export(dec._h, kind, layer, *refs, None, 0, ctypes.byref(need), err, ERR_LEN):
        raise ValueError(f"kwker: {err.value.decode()}")
    buf = (ctypes.c_uint8 * max(need.value, 1))()
    if lib.kwker_decoder_export(dec._h, kind, layer, *refs, buf, need.value, ctypes.byref(need), err, ERR_LEN):
        raise ValueError(f"kwker: {err.value.decode()}")
    return fmt.value, rows.value, cols.value, bytes(buf)[: need.value]


def save(dec: Any, path: str | os.PathLike[str]) -> None:
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    index = []
    for kind, layer in _keys(int(dec._native_cfg["layers"])):
        fmt, rows, cols, data = _export(dec, kind, layer)
        if fmt < 0:
            continue  # a bias or lm_head the model does not have
        name = f"t{kind}.{layer}"
        tensors[name] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        index.append(
            {"name": name, "kind": kind, "layer": layer, "fmt": fmt, "rows": rows, "cols": cols,
             "sha256": hashlib.sha256(data).hexdigest()}
        )  # fmt: skip
    from . import __version__

    meta = {
        "format": SAVE_FORMAT,
        "version": SAVE_VERSION,
        "kwker_version": __version__,
        "native_config": dec._native_cfg,
        "hf_config": dec.config.to_dict(),
        "eos": list(dec._eos),
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


def load(cls: Any, path: str | os.PathLike[str], max_batch: int | None, max_context: int | None) -> Any:
    from safetensors import safe_open
    from transformers import AutoConfig

    from .decoder import _DecoderConfig

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
    nc = dict(meta["native_config"])
    if max_batch is not None:
        nc["slots"] = max_batch
    if max_context is not None:
        nc["max_context"] = max_context
    inv_freq = torch.tensor(nc.pop("inv_freq"), dtype=torch.float32)
    if inv_freq.numel() != int(nc["head_dim"]) // 2:
        raise _bad(path, f"{META} has {inv_freq.numel()} rotary frequencies for head_dim {nc['head_dim']}")
    c = _DecoderConfig(**nc, inv_freq=ctypes.cast(inv_freq.data_ptr(), ctypes.POINTER(ctypes.c_float)))
    lib, err = _native.LIB, ctypes.create_string_buffer(ERR_LEN)
    b = lib.kwker_decoder_builder(ctypes.byref(c), err, ERR_LEN)
    if not b:
        raise _bad(path, err.value.decode())
    try:
        try:
            st = safe_open(weights_path, framework="pt")
        except Exception as exc:  # safetensors raises its own error types for a damaged header
            raise _bad(path, f"{WEIGHTS} is damaged ({exc})") from exc
        with st:
            for t in meta["tensors"]:
                try:
                    data = st.get_tensor(t["name"]).contiguous()
                except Exception as exc:
                    raise _bad(path, f"{WEIGHTS} lacks or cannot read tensor {t['name']} ({exc})") from exc
                # Hashed and handed over in place (no bytes copy per tensor), checked to be the flat bytes
                # that save wrote.
                if data.dtype != torch.uint8 or data.dim() != 1:
                    raise _bad(path, f"tensor {t['name']} is {data.dtype} {list(data.shape)}, not flat uint8 bytes")
                if hashlib.sha256(data.numpy()).hexdigest() != t["sha256"]:
                    raise _bad(path, f"tensor {t['name']} (kind {t['kind']}, layer {t['layer']}) fails its checksum")
                if t["fmt"] == VECTOR:
                    if data.numel() != 4 * int(t["rows"]) * int(t["cols"]):
                        n, r, c = data.numel(), t["rows"], t["cols"]
                        raise _bad(path, f"tensor {t['name']} has {n} bytes for {r} x {c} f32s")
                    vec = data.clone().view(torch.float32)  # a fresh copy: torch aligns it for f32 reads
                    failed = lib.kwker_decoder_set(b, t["kind"], t["layer"], 0, vec.data_ptr(), t["rows"],
                                                   t["cols"], err, ERR_LEN)  # fmt: skip
                else:
                    failed = lib.kwker_decoder_set_packed(b, t["kind"], t["layer"], t["fmt"], data.data_ptr(),
                                                          data.numel(), t["rows"], t["cols"], err, ERR_LEN)  # fmt: skip
                if failed:
                    raise _bad(path, err.value.decode())
    except BaseException:
        lib.kwker_decoder_builder_free(b)
        raise
    h = lib.kwker_decoder_build(b, err, ERR_LEN)
    if not h:
        raise _bad(path, err.value.decode())
    hf = dict(meta["hf_config"])
    cfg = AutoConfig.for_model(hf.pop("model_type"), **hf)
    info = dict(meta["info"])
    info["weight_bytes_per_token"] = int(lib.kwker_decoder_weight_bytes(h))
    info["kv_bytes"] = int(nc["slots"]) * int(nc["layers"]) * 2 * int(nc["kv_heads"]) * int(nc["max_context"]) * int(
        nc["head_dim"]
    ) * 4
    dec = cls(h, cfg, int(nc["vocab"]), int(nc["slots"]), int(nc["max_context"]), info)
    dec._eos = list(meta["eos"])
    dec._native_cfg = {**nc, "inv_freq": inv_freq.tolist()}
    return dec

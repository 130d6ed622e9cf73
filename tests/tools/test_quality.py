"""Tests of the quality tool (``python -m kwker_torch.quality``).

- The protocol pieces on hand-made logits: which positions are scored (unscored rows are NaN and must not
  matter), KL of identical logits is exactly 0 with top-1 1.0, KL of a known pair of distributions equals
  its hand-computed value (0.25 ln 2), chunking and BOS replacement as llama-perplexity does them.
- The CLI on a tiny random Llama with a byte tokenizer (fast): errors for too-short and empty texts (exit
  2), the ``--json`` line and its fields, the kwker and llama.cpp contenders' plumbing through stand-ins
  of ``KwkDecoder`` / ``LlamaCppWorker`` (same API), ``--peer-cache`` giving one llama.cpp row per KV
  cache (loaded with its cache keywords), a refused precision exiting 2.
- Slow, on the real SmolLM2-135M (float32), 2 chunks of 512: hf-f32's perplexity equals an independent
  plain torch loop's to 4 significant digits; the kwker decoder's ``--precision preserve`` equals hf-f32's
  perplexity to 4 significant digits with KL < 1e-6 and top-1 1.0 (skipped until KwkDecoder exists).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import kwker_torch
from kwker_torch.tools import quality

TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
    "want of a wife. However little known the feelings or views of such a man may be on his first entering "
    "a neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is "
    "considered the rightful property of some one or other of their daughters.\n"
) * 3  # 1113 bytes: 17 chunks of 64 byte-tokens


class ByteTok:
    """A byte-level tokenizer with the slice of the HF tokenizer API the tool uses."""

    def __init__(self, bos: int | None = None) -> None:
        self.bos_token_id = bos

    def __call__(self, text: str, add_special_tokens: bool = True, verbose: bool = True) -> dict[str, list[int]]:
        ids = list(text.encode("utf-8"))
        if add_special_tokens and self.bos_token_id is not None:
            ids = [self.bos_token_id] + ids
        return {"input_ids": ids}

    def __len__(self) -> int:
        return 256


@pytest.fixture(scope="module")
def tiny() -> Any:
    """A 2-layer random Llama over 256 byte tokens (head_dim 64, grouped-query), float32."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    p = tmp_path / "text.txt"
    p.write_text(TEXT, encoding="utf-8")
    return p


@pytest.fixture
def no_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs the test as if kwker_torch.KwkDecoder were not in the build (whether or not it is)."""
    monkeypatch.delattr(kwker_torch, "KwkDecoder", raising=False)


def _use_model(monkeypatch: pytest.MonkeyPatch, model: Any, tok: Any) -> list[str | None]:
    """Makes the tool use ``model``/``tok`` instead of loading one; returns the specs it was asked for."""
    asked: list[str | None] = []

    def load(spec: str | None) -> tuple[Any, Any, str]:
        asked.append(spec)
        return model, tok, "test model"

    monkeypatch.setattr(quality, "load_model", load)
    return asked


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = quality.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _hf_logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids[None], use_cache=False).logits[0].float()


# --------------------------------------------------------------------------------------------------
# Protocol pieces


def test_chunks_cut_like_llama_perplexity() -> None:
    ids = torch.arange(1100)
    cs = quality.chunks(ids, 512)
    assert len(cs) == 2  # 1100 // 512; the tail of 76 tokens is not scored
    assert torch.equal(cs[0], torch.arange(512)) and torch.equal(cs[1], torch.arange(512, 1024))
    assert len(quality.chunks(ids, 512, 1)) == 1 and len(quality.chunks(ids, 512, 9)) == 2
    with_bos = quality.chunks(ids, 512, bos=7)
    assert [int(c[0]) for c in with_bos] == [7, 7]
    assert torch.equal(with_bos[1][1:], torch.arange(513, 1024))
    assert int(ids[512]) == 512  # the input is not modified


def test_score_chunk_reads_only_the_second_half() -> None:
    """ctx 8: logits rows 4, 5, 6 predict tokens 5, 6, 7; every other row is NaN and must not matter."""
    t, v = 8, 5
    ids = torch.tensor([0, 1, 2, 3, 4, 0, 3, 2])
    logits = torch.full((t, v), float("nan"))
    rows = torch.randn(3, v, generator=torch.Generator().manual_seed(1))
    logits[4:7] = rows
    stats = quality.score_chunk(logits, ids, None, 4)
    expected = -sum(math.log(torch.softmax(rows[i].double(), 0)[int(ids[5 + i])]) for i in range(3))
    assert stats.count == 3 == t - 1 - t // 2
    assert math.isclose(stats.nll_sum, expected, rel_tol=1e-12)
    assert stats.kl is None and stats.top1 is None
    assert quality.score_chunk(logits, ids).count == 3  # first defaults to ctx // 2


def test_identical_logits_give_kl_zero_and_top1_one() -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(64, 1000, generator=g) * 4
    ids = torch.randint(0, 1000, (64,), generator=g)
    stats = quality.score_chunk(logits, ids, logits.clone(), 32)  # a copy: KL computed, not short-cut
    assert stats.kl == 0.0
    assert stats.top1 == 1.0
    same = quality.score_chunk(logits, ids, logits, 32)  # the reference scoring itself
    assert same.kl == 0.0 and same.top1 == 1.0 and same.nll_sum == stats.nll_sum


def test_kl_of_known_distributions() -> None:
    """Row 3: p_ref = (1/2, 1/4, 1/4), p_test = (1/4, 1/2, 1/4): KL = 1/2 ln 2 - 1/4 ln 2 = ln(2)/4, different
    argmax. Row 4: both (1/2, 1/4, 1/4): KL 0, same argmax. Mean KL ln(2)/8, top-1 0.5."""
    ref = torch.zeros(6, 3)
    test = torch.zeros(6, 3)
    ref[3] = torch.tensor([0.5, 0.25, 0.25]).log()
    test[3] = torch.tensor([0.25, 0.5, 0.25]).log()
    ref[4] = test[4] = torch.tensor([0.5, 0.25, 0.25]).log() + 3.0  # a shift changes nothing
    ids = torch.tensor([0, 0, 0, 0, 2, 0])  # targets of rows 3 and 4: tokens 2 and 0
    stats = quality.score_chunk(test, ids, ref, 3)
    assert stats.count == 2
    assert math.isclose(stats.kl, math.log(2) / 8, rel_tol=1e-6)  # float32 logits: log(0.25) is exact
    assert stats.top1 == 0.5
    assert math.isclose(stats.nll_sum, -math.log(0.25) - math.log(0.5), rel_tol=1e-6)


def test_evaluate_sums_over_chunks() -> None:
    g = torch.Generator().manual_seed(3)
    table = {i: torch.randn(16, 50, generator=g) for i in range(2)}
    cs = [torch.randint(0, 50, (16,), generator=g) for _ in range(2)]
    keyed = {id(c): table[i] for i, c in enumerate(cs)}
    r = quality.evaluate(lambda c: keyed[id(c)] + 0.5, lambda c: keyed[id(c)], cs)
    direct = [quality.score_chunk(table[i], cs[i]) for i in range(2)]
    assert r["tokens"] == 14 and r["chunks"] == 2
    # the shifted float32 logits round differently: equal to float32 precision
    assert math.isclose(r["nll_mean"], sum(s.nll_sum for s in direct) / 14, rel_tol=1e-6)
    assert r["kl"] < 1e-12 and r["top1"] == 1.0  # a constant shift of the logits is the same distribution


def test_bos_tokenizer_prepends_and_replaces_like_llama_cpp() -> None:
    ids, bos = quality.tokenize(ByteTok(bos=1), "hello world")
    assert bos == 1 and ids.tolist() == [1] + list(b"hello world")
    assert [int(c[0]) for c in quality.chunks(ids, 4, bos=bos)] == [1, 1, 1]
    ids, bos = quality.tokenize(ByteTok(), "hello world")
    assert bos is None and ids.tolist() == list(b"hello world")


# --------------------------------------------------------------------------------------------------
# CLI on a tiny model


def test_too_short_text_is_a_clear_error(
    tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _use_model(monkeypatch, tiny, ByteTok())
    short = tmp_path / "short.txt"
    short.write_text("Only a few words.", encoding="utf-8")
    rc, out, err = _run(["--text", str(short), "--ctx", "64"], capsys)
    assert rc == 2 and out == ""
    assert "only 17 tokens" in err and "at least 64" in err and "--ctx" in err
    with pytest.raises(quality.QualityError, match="only 5 tokens"):
        quality.chunks(torch.arange(5), 8)


def test_empty_text_is_a_clear_error(
    tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = _use_model(monkeypatch, tiny, ByteTok())
    empty = tmp_path / "empty.txt"
    empty.write_text("\n", encoding="utf-8")
    rc, out, err = _run(["--text", str(empty)], capsys)
    assert rc == 2 and out == ""
    assert "the text is empty" in err and "--text" in err
    assert asked == []  # refused before loading any model
    rc, _, err = _run(["--text", str(tmp_path / "missing.txt")], capsys)
    assert rc == 2 and "not found" in err
    with pytest.raises(quality.QualityError, match="no tokens"):
        quality.chunks(torch.zeros(0, dtype=torch.int64), 512)


def test_gptq_without_calib_is_a_clear_error(
    tiny: Any, text_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _use_model(monkeypatch, tiny, ByteTok())
    rc, out, err = _run(["--text", str(text_file), "--precision", "int4", "--gptq"], capsys)
    assert rc == 2 and out == ""
    assert "--gptq fits each matrix to calibration text: pass --calib FILE" in err


def test_json_line_has_the_fields(
    tiny: Any,
    text_file: Path,
    no_decoder: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _use_model(monkeypatch, tiny, ByteTok())
    rc, out, err = _run(["--json", "--text", str(text_file), "--ctx", "64", "--chunks", "2"], capsys)
    assert rc == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1
    report = json.loads(lines[0])
    for key in ("model", "text_files", "text_tokens", "ctx", "chunks", "tokens_scored", "bos", "contenders"):
        assert key in report
    assert report["ctx"] == 64 and report["chunks"] == 2 and report["tokens_scored"] == 2 * 31
    assert report["text_tokens"] == len(TEXT.encode()) - 1  # one trailing newline dropped, as llama.cpp -f
    assert report["scored_positions"] == [32, 62] and report["bos"] is None
    (ref,) = report["contenders"]
    assert ref["name"] == "hf-f32" and ref["format"] == "float32"
    for key in ("perplexity", "delta_ppl_pct", "kl", "top1", "nll_mean", "tokens", "seconds"):
        assert isinstance(ref[key], (int, float)), key
    assert ref["kl"] == 0.0 and ref["top1"] == 1.0 and ref["delta_ppl_pct"] == 0.0
    assert math.isclose(ref["perplexity"], math.exp(ref["nll_mean"]))
    assert report["skipped"][0]["name"] == "kwker"  # the decoder is not in this build (or hidden)


def test_table_output(
    tiny: Any, text_file: Path, no_decoder: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _use_model(monkeypatch, tiny, ByteTok())
    rc, out, err = _run(["--text", str(text_file), "--ctx", "64", "--chunks", "3"], capsys)
    assert rc == 0, err
    assert "3 chunks, 93 tokens scored" in out and "positions 32..62" in out
    assert any(line.startswith("hf-f32") for line in out.splitlines())
    assert "skipped kwker" in out


def test_missing_decoder_with_explicit_precision_is_an_error(
    tiny: Any, text_file: Path, no_decoder: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _use_model(monkeypatch, tiny, ByteTok())
    rc, _, err = _run(["--text", str(text_file), "--ctx", "64", "--chunks", "1", "--precision", "preserve"], capsys)
    assert rc == 2 and "KwkDecoder is not available" in err


class StandInDecoder:
    """KwkDecoder's API (from_hf, score) on the HF forward itself; refuses int8/int4 (as a decoder that
    cannot run a precision would), so the tool's handling of a refusal is tested."""

    calls: list[dict[str, Any]] = []

    def __init__(self, model: Any) -> None:
        self.model = model

    @classmethod
    def from_hf(
        cls, model: Any, *, precision: str, max_batch: int, max_context: int, calib: Any = None, **formats: Any
    ) -> StandInDecoder:
        cls.calls.append(dict(precision=precision, max_batch=max_batch, max_context=max_context, **formats))
        if precision in ("balanced", "int8", "int4"):
            raise NotImplementedError(f"kwker: precision {precision!r} is not supported by this stand-in")
        dec = cls(model)
        dec.info = {"bits_per_weight": 32.0}
        return dec

    def score(self, ids: torch.Tensor) -> torch.Tensor:
        assert ids.dim() == 1 and ids.dtype == torch.int64
        return _hf_logits(self.model, ids)


def test_kwker_contender_plumbing(
    tiny: Any, text_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(kwker_torch, "KwkDecoder", StandInDecoder, raising=False)
    StandInDecoder.calls.clear()
    _use_model(monkeypatch, tiny, ByteTok())
    rc, out, err = _run(["--json", "--text", str(text_file), "--ctx", "64", "--chunks", "2"], capsys)
    assert rc == 0, err
    assert StandInDecoder.calls == [dict(precision="preserve", max_batch=1, max_context=64)]
    ref, kw = json.loads(out)["contenders"]
    assert kw["name"] == "kwker preserve" and kw["format"] == "preserve"
    assert kw["perplexity"] == pytest.approx(ref["perplexity"], rel=1e-6)
    assert kw["kl"] < 1e-9 and kw["top1"] == 1.0


def test_formats_reach_every_kwker_contender(
    tiny: Any, text_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(kwker_torch, "KwkDecoder", StandInDecoder, raising=False)
    StandInDecoder.calls.clear()
    _use_model(monkeypatch, tiny, ByteTok())
    args = ["--json", "--text", str(text_file), "--ctx", "64", "--chunks", "1", "--formats", "down=q6k", "embed=q8"]
    rc, out, err = _run(args, capsys)
    assert rc == 0, err
    want = dict(precision="preserve", max_batch=1, max_context=64, formats={"down": "q6k", "embed": "q8"})
    assert StandInDecoder.calls == [want]
    assert json.loads(out)["contenders"][1]["name"] == "kwker preserve [down=q6k,embed=q8]"
    rc, out, err = _run(args[:-2] + ["down"], capsys)
    assert rc == 2 and "--formats takes KIND=FORMAT pairs (e.g. down=q6k); got ['down']" in err


def test_kv_cache_reaches_the_decoder_and_the_default_is_the_decoders(
    tiny: Any, text_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--kv-cache f32 q8`` passes each format, f32 included (a decoder whose default is not f32 must be told);
    without the flag the tool passes none, so each precision runs with the cache a user's from_hf gives it."""
    monkeypatch.setattr(kwker_torch, "KwkDecoder", StandInDecoder, raising=False)
    StandInDecoder.calls.clear()
    _use_model(monkeypatch, tiny, ByteTok())
    args = ["--json", "--text", str(text_file), "--ctx", "64", "--chunks", "1"]
    rc, out, err = _run(args + ["--kv-cache", "f32", "q8"], capsys)
    assert rc == 0, err
    assert StandInDecoder.calls == [dict(precision="preserve", max_batch=1, max_context=64, kv_cache=kv)
                                    for kv in ("f32", "q8")]  # fmt: skip
    names = [(r["name"], r["kv_cache"]) for r in json.loads(out)["contenders"][1:]]
    assert names == [("kwker preserve kv f32", "f32"), ("kwker preserve kv q8", "q8")]
    StandInDecoder.calls.clear()
    rc, out, err = _run(args, capsys)
    assert rc == 0, err
    assert StandInDecoder.calls == [dict(precision="preserve", max_batch=1, max_context=64)]
    assert json.loads(out)["contenders"][1]["name"] == "kwker preserve"


@pytest.mark.parametrize("precision", ["int4", "balanced"])
def test_refused_precision_prints_the_decoders_error_and_exits_2(
    precision: str, tiny: Any, text_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(kwker_torch, "KwkDecoder", StandInDecoder, raising=False)
    _use_model(monkeypatch, tiny, ByteTok())
    rc, out, err = _run(["--text", str(text_file), "--ctx", "64", "--precision", precision], capsys)
    assert rc == 2 and out == ""
    assert f"precision {precision!r} is not supported by this stand-in" in err


def _fake_llama_cpp(model: Any, width: int | None = None) -> types.ModuleType:
    """A stand-in ``kwker_torch.peer.llama_cpp`` whose worker returns the HF forward's logits (numpy)."""
    mod = types.ModuleType("kwker_torch.peer.llama_cpp")

    class LlamaCppWorker:
        loaded: list[tuple[str, int, int]] = []
        caches: list[dict[str, str]] = []  # the KV cache keywords of each load

        def __init__(self, kind: str, threads: int) -> None:
            assert kind == "native" and threads >= 1

        def __enter__(self) -> LlamaCppWorker:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def load(self, path: str, n_ctx: int, n_batch: int, *, kv_type: str, flash_attn: str) -> None:
            LlamaCppWorker.loaded.append((path, n_ctx, n_batch))
            LlamaCppWorker.caches.append({"kv_type": kv_type, "flash_attn": flash_attn})

        def logits(self, ids: list[int]) -> np.ndarray:
            assert isinstance(ids, list)
            out = _hf_logits(model, torch.tensor(ids)).numpy()
            return out if width is None else np.zeros((len(ids), width), np.float32)

    mod.LlamaCppWorker = LlamaCppWorker  # type: ignore[attr-defined]
    return mod


def test_gguf_contender_plumbing(
    tiny: Any,
    text_file: Path,
    tmp_path: Path,
    no_decoder: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mod = _fake_llama_cpp(tiny)
    monkeypatch.setitem(sys.modules, "kwker_torch.peer.llama_cpp", mod)
    _use_model(monkeypatch, tiny, ByteTok())
    gguf_file = tmp_path / "model.gguf"
    gguf_file.write_bytes(b"not a real gguf")  # the stand-in worker does not read it
    argv = ["--json", "--text", str(text_file), "--ctx", "64", "--chunks", "2", "--gguf", str(gguf_file)]
    rc, out, err = _run(argv, capsys)
    assert rc == 0, err
    assert mod.LlamaCppWorker.loaded == [(str(gguf_file), 64, 64)]
    ref, cpp = json.loads(out)["contenders"]
    assert cpp["name"] == "llama.cpp model.gguf" and cpp["format"].startswith("gguf")  # named by file type, else file
    assert cpp["perplexity"] == pytest.approx(ref["perplexity"], rel=1e-6) and cpp["top1"] == 1.0


def test_peer_cache_gives_one_llama_cpp_row_per_cache(
    tiny: Any,
    text_file: Path,
    tmp_path: Path,
    no_decoder: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--peer-cache f16 q8_0``: a worker of its own per cache, loaded with llama.cpp's default cache and with
    ``-ctk q8_0 -ctv q8_0 -fa 1``, reported as separate rows named as bench_depth names them."""
    mod = _fake_llama_cpp(tiny)
    mod.LlamaCppWorker.loaded, mod.LlamaCppWorker.caches = [], []
    monkeypatch.setitem(sys.modules, "kwker_torch.peer.llama_cpp", mod)
    _use_model(monkeypatch, tiny, ByteTok())
    gguf_file = tmp_path / "model.gguf"
    gguf_file.write_bytes(b"not a real gguf")
    argv = ["--json", "--text", str(text_file), "--ctx", "64", "--chunks", "1", "--gguf", str(gguf_file),
            "--peer-cache", "f16", "q8_0", "f16"]  # fmt: skip
    rc, out, err = _run(argv, capsys)
    assert rc == 0, err
    assert mod.LlamaCppWorker.caches == [{"kv_type": "f16", "flash_attn": "auto"},
                                         {"kv_type": "q8_0", "flash_attn": "on"}]  # fmt: skip
    rows = json.loads(out)["contenders"]
    assert [(r["name"], r["kv_cache"]) for r in rows] == [
        ("hf-f32", None), ("llama.cpp model.gguf", "f16"), ("llama.cpp model.gguf kv q8_0", "q8_0"),
    ]  # fmt: skip
    table = io.StringIO()
    quality.print_table(json.loads(out), table)
    lines = [ln for ln in table.getvalue().splitlines() if ln.startswith(("contender", "hf-f32", "llama.cpp"))]
    assert len({ln.index(" format" if ln.startswith("contender") else " gguf" if "gguf" in ln else " float32")
                for ln in lines}) == 1  # the name column is as wide as the longest name  # fmt: skip
    assert quality.peer_name("Q4_0", "q8_0") == "llama.cpp Q4_0 kv q8_0" and quality.peer_name("F32", "f16") == (
        "llama.cpp F32"
    )
    with pytest.raises(SystemExit):
        quality.parse_args(["--peer-cache", "q4_0"])  # not a cache the peer runs


def test_gguf_with_another_vocabulary_is_a_clear_error(
    tiny: Any,
    text_file: Path,
    tmp_path: Path,
    no_decoder: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "kwker_torch.peer.llama_cpp", _fake_llama_cpp(tiny, width=300))
    _use_model(monkeypatch, tiny, ByteTok())
    gguf_file = tmp_path / "other.gguf"
    gguf_file.write_bytes(b"x")
    rc, _, err = _run(["--text", str(text_file), "--ctx", "64", "--chunks", "1", "--gguf", str(gguf_file)], capsys)
    assert rc == 2 and "300 tokens but the reference model has 256" in err


# --------------------------------------------------------------------------------------------------
# Real SmolLM2-135M, float32, 2 chunks of 512


def _default_text() -> Path:
    return quality.DEFAULT_TEXT  # the project's sample story: a clone alone has it


@pytest.fixture(scope="module")
def smollm2_report(smollm2_f32: tuple[torch.nn.Module, object]) -> Iterator[dict[str, Any]]:
    """The tool's --json report on the real SmolLM2, default text, 2 chunks of 512 (kwker row if built)."""
    model, tok = smollm2_f32
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(quality, "load_model", lambda spec: (model, tok, "SmolLM2-135M-Instruct"))
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = quality.main(["--json", "--ctx", "512", "--chunks", "2"])
    assert rc == 0
    yield json.loads(buf.getvalue())


@pytest.mark.slow
def test_hf_f32_perplexity_equals_a_plain_torch_loop(
    smollm2_f32: tuple[torch.nn.Module, object], smollm2_report: dict[str, Any]
) -> None:
    model, tok = smollm2_f32
    text = _default_text().read_text(encoding="utf-8")
    ids = torch.tensor(tok(text).input_ids)  # SmolLM2's tokenizer adds no BOS
    ctx, nlls = 512, []
    for c in range(2):
        x = ids[c * ctx : (c + 1) * ctx]
        with torch.no_grad():
            logits = model(x[None]).logits[0]
        logp = torch.log_softmax(logits.float(), dim=-1)
        nlls.append(-logp[ctx // 2 : ctx - 1].gather(1, x[ctx // 2 + 1 :, None]).squeeze(1))
    plain = torch.exp(torch.cat(nlls).double().mean()).item()
    ref = smollm2_report["contenders"][0]
    assert ref["name"] == "hf-f32" and ref["tokens"] == 2 * 255
    rel = abs(ref["perplexity"] - plain) / plain
    print(f"hf-f32 perplexity {ref['perplexity']:.6f}, plain loop {plain:.6f}, relative difference {rel:.1e}")
    # measured 8.0e-6: the plain loop's float32 log_softmax over 49152 logits (the tool's is float64)
    assert rel < 5e-5  # 4 significant digits


def _decoder_or_skip() -> None:
    try:
        from kwker_torch import KwkDecoder  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"kwker_torch.KwkDecoder is not in this build yet ({exc})")


@pytest.mark.slow
def test_kwker_preserve_matches_hf_f32(request: pytest.FixtureRequest) -> None:
    _decoder_or_skip()
    report = request.getfixturevalue("smollm2_report")  # only now: no model load while the decoder is absent
    rows = {r["name"]: r for r in report["contenders"]}
    ref, kw = rows["hf-f32"], rows["kwker preserve"]
    rel = abs(kw["perplexity"] - ref["perplexity"]) / ref["perplexity"]
    print(f"kwker preserve: perplexity {kw['perplexity']:.6f} (rel {rel:.1e}), KL {kw['kl']:.2e}, top-1 {kw['top1']}")
    assert rel < 5e-5  # 4 significant digits
    assert kw["kl"] < 1e-6
    assert kw["top1"] == 1.0

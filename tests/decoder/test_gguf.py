"""``KwkDecoder.from_gguf``: a GGUF file's quantized tensors repacked without changing a value.

References: the ``gguf`` package's own dequantization of every tensor, as transformers loads it into the
Hugging Face model (``from_pretrained(..., gguf_file=)``, float32): every matrix the decoder reports as exact
must hold those values bit for bit (read back with ``dec.weight``), whatever rows the family's mapping
stacks (q/k/v, gate/up) and however llama.cpp permuted them (Llama's q/k). The logits then differ from that
float32 forward only by the decoder's activation codes (int8 per 32 values): measured here at 0.29 of the
largest logit on the random synthetic model (its random Q4_K / Q6_K blocks make it sensitive), as much as
``from_hf(..., "int8")``'s 0.28 of the same float32 weights. On the real SmolLM2
file (its source is Q4_1), top-1 agreement with the file's float32 forward is over 0.9 on a short text (the
quality tool measures 0.969 and +0.27 % perplexity over 20 chunks).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import pytest
import torch
from fixtures.gguf_files import write_gguf

from kwker_torch import KwkDecoder

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType


def _f16(x: float) -> np.ndarray:
    return np.array([x], dtype=np.float16).view(np.uint8)


def _raw_q4_k(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random Q4_K blocks (d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles): any bytes are a
    valid block once d and dmin are finite."""
    b = rng.integers(0, 256, size=(rows, cols // 256, 144), dtype=np.uint8)
    b[..., 0:2], b[..., 2:4] = _f16(0.002), _f16(0.001)
    return b.reshape(rows, -1)


def _raw_q6_k(rows: int, cols: int, rng: np.random.Generator, paired: bool) -> np.ndarray:
    """Random Q6_K blocks (ql, qh, 16 int8 scales, d); ``paired``: each 32 values' two scales equal (the
    decoder's q6_k holds either exactly, its scale per 16 values as the file's)."""
    b = rng.integers(0, 256, size=(rows, cols // 256, 210), dtype=np.uint8)
    scales = rng.integers(-32, 32, size=(rows, cols // 256, 16), dtype=np.int8)
    if paired:
        scales[..., 1::2] = scales[..., 0::2]
    b[..., 192:208] = scales.view(np.uint8)
    b[..., 208:210] = _f16(0.001)
    return b.reshape(rows, -1)


# Layer 0: every type repacked exactly, in its own bits or, in one fused matrix, in the widest of its parts'
# (Q4_0 beside Q5_0 in q/k/v: q5_0; Q5_0 beside Q8_0 in gate/up: q8_0; Q4_0 alone: q4_0); layer 1: a fused
# projection of formats no one format holds (Q4_K q/k beside Q6_K v: runs of rows in their own formats, exact),
# a type with no repack (Q5_1), a Q6_K whose paired scales differ (exact too), and an F16 matrix; the embedding
# Q4_1 (q4), the head Q4_K (q4k).
TYPES = {
    "blk.0.attn_q": Q.Q4_0, "blk.0.attn_k": Q.Q5_0, "blk.0.attn_v": Q.Q5_0, "blk.0.attn_output": Q.Q4_0,
    "blk.0.ffn_gate": Q.Q5_0, "blk.0.ffn_up": Q.Q8_0, "blk.0.ffn_down": "Q6_K paired",
    "blk.1.attn_q": Q.Q4_K, "blk.1.attn_k": Q.Q4_K, "blk.1.attn_v": Q.Q6_K, "blk.1.attn_output": Q.F16,
    "blk.1.ffn_gate": Q.Q5_1, "blk.1.ffn_up": Q.Q5_1, "blk.1.ffn_down": Q.Q6_K,
    "token_embd": Q.Q4_1, "output": Q.Q4_K,
}  # fmt: skip


def _quantizer(seed: int = 0) -> Any:
    rng = np.random.default_rng(seed)

    def quantize(name: str, values: np.ndarray) -> tuple[np.ndarray, Any] | None:
        ty = TYPES.get(name.removesuffix(".weight"))
        if ty is None or values.ndim != 2:
            return None
        rows, cols = values.shape
        if ty == Q.Q4_K:
            return _raw_q4_k(rows, cols, rng), Q.Q4_K
        if ty in (Q.Q6_K, "Q6_K paired"):
            return _raw_q6_k(rows, cols, rng, paired=ty != Q.Q6_K), Q.Q6_K
        if ty == Q.F16:
            return values.astype(np.float16), Q.F16
        return gguf.quants.quantize(values, ty), ty

    return quantize


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory: Any) -> tuple[str, torch.nn.Module]:
    """A 2-layer Llama (grouped-query heads, untied head) written with the types above, and the model
    transformers loads back from it (float32, every tensor dequantized by the gguf package)."""
    from transformers import AutoModelForCausalLM, GgufConfig, LlamaConfig

    cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
                      tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    folder = tmp_path_factory.mktemp("gguf")
    path = write_gguf(model, os.path.join(folder, "llama.gguf"), tokenizer=False, quantize=_quantizer())
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file="llama.gguf", dtype=torch.float32,
                                                  quantization_config=GgufConfig(dequantize=True)).eval()  # fmt: skip
    return path, loaded


def _hf_matrix(model: torch.nn.Module, name: str, layer: int) -> torch.Tensor:
    """The HF weights a decoder matrix stacks (Llama: q/k/v, gate/up)."""
    if name == "embed":
        return model.model.embed_tokens.weight
    if name == "lm_head":
        return model.lm_head.weight
    blk = model.model.layers[layer]
    a, m = blk.self_attn, blk.mlp
    parts = {"qkv": [a.q_proj, a.k_proj, a.v_proj], "o": [a.o_proj], "up": [m.gate_proj, m.up_proj],
             "down": [m.down_proj]}[name]  # fmt: skip
    return torch.cat([p.weight for p in parts])


def test_every_exactly_repacked_matrix_holds_the_files_values(llama_file: Any, caplog: Any) -> None:
    path, loaded = llama_file
    with caplog.at_level(logging.WARNING, logger="kwker_torch"):
        dec = KwkDecoder.from_gguf(path, max_context=64)
    info = dec.info["gguf"]
    assert dec.info["kv_cache"] == "q8"  # the default beside quantized matrices, as from_hf's int4
    assert sorted(info["exact"]) == sorted(["qkv.0", "o.0", "up.0", "down.0", "qkv.1", "o.1", "down.1", "embed.0",
                                            "lm_head.0"])  # fmt: skip
    assert info["converted"] == {"up.1": "Q5_1 -> q6k (dequantized and quantized again)"}
    assert dec.info["formats"] == {
        "qkv.0": "q5_0", "o.0": "q4_0", "up.0": "q8_0", "down.0": "q6_k", "qkv.1": "q4k+q6_k", "o.1": "f32",
        "up.1": "q6k", "down.1": "q6_k", "embed.0": "q4", "lm_head.0": "q4k",
    }  # fmt: skip
    assert dec.info["parts_matrices"] == 1
    stored = {(t["name"], t["layer"]): t["format"] for t in dec.describe()["tensors"]}
    assert stored[("qkv", 1)] == "parts" and stored[("qkv", 0)] == "q5_0"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "(Q5_1)" in warnings[0] and "llama.gguf" in warnings[0]
    for label in info["exact"]:
        name, layer = label.rsplit(".", 1)
        got, want = dec.weight(name, int(layer)), _hf_matrix(loaded, name, int(layer))
        assert torch.equal(got, want), label
    for label in info["converted"]:  # converted: within the target format's step of the file's values
        name, layer = label.rsplit(".", 1)
        got, want = dec.weight(name, int(layer)), _hf_matrix(loaded, name, int(layer))
        assert not torch.equal(got, want) and (got - want).abs().max() <= 0.02 * want.abs().max(), label


def test_logits_differ_from_the_files_float32_forward_only_by_the_activation_codes(llama_file: Any) -> None:
    path, loaded = llama_file
    dec = KwkDecoder.from_gguf(path, max_batch=2, max_context=64, kv_cache="f32")  # the weights' error alone
    ids = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = loaded(ids[None]).logits[0]
    got = dec.score(ids)
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    # The activation codes' error alone, as from_hf's of the same float32 weights reads it: int8's 15-bit
    # codes would be the floor, int4's 8-bit codes what q4_0 / q5_0 / q4k / q6k read. Measured (this file's
    # random Q4_K / Q6_K blocks make its logits sensitive): from_gguf 0.29, from_hf int8 0.28, int4 0.84.
    hf = KwkDecoder.from_hf(loaded, "int8", max_batch=2, max_context=64, kv_cache="f32")
    hf_err = ((hf.score(ids) - ref).abs().max() / ref.abs().max()).item()
    assert err <= 1.2 * hf_err, (err, hf_err)
    # Top-1 as the float32 forward's at 38 of the 40 positions (a random model's near-ties can flip a few).
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9
    # A generation is the scored tokens' own argmax, step by step, in any slot.
    out = dec.generate([ids[:8], ids[:5]], max_new_tokens=6)
    for prompt, c in zip([ids[:8], ids[:5]], out, strict=True):
        full = torch.cat([prompt, torch.tensor(c.tokens[:-1], dtype=torch.int64)])
        assert c.tokens == dec.score(full)[len(prompt) - 1 :].argmax(-1).tolist()


def test_llama_q_and_k_rows_are_unpermuted(llama_file: Any) -> None:
    """llama.cpp stores Llama's q/k rows interleaved per head; the decoder must hold HF's order (the stacked
    matrix equal to HF's q/k/v is the proof; here, that the permutation is not the identity)."""
    path, loaded = llama_file
    reader = gguf.GGUFReader(path)
    t = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    file_rows = torch.from_numpy(gguf.dequantize(t.data, t.tensor_type).copy())
    hf_rows = loaded.model.layers[0].self_attn.q_proj.weight
    assert not torch.equal(file_rows, hf_rows)
    assert torch.equal(KwkDecoder.from_gguf(path, max_context=16).weight("qkv", 0)[:256], hf_rows)


def test_a_matrix_of_parts_saves_and_loads_as_it_is(llama_file: Any, tmp_path: Any) -> None:
    """q/k in Q4_K beside v in Q6_K (layer 1): the runs of rows come back from a saved folder in their own
    formats, and the loaded decoder scores the same logits, bit for bit."""
    path, _ = llama_file
    dec = KwkDecoder.from_gguf(path, max_context=32)
    dec.save(tmp_path / "saved")
    back = KwkDecoder.load(tmp_path / "saved")
    assert back.info["formats"]["qkv.1"] == "q4k+q6_k"
    assert torch.equal(back.weight("qkv", 1), dec.weight("qkv", 1))
    ids = torch.arange(3, 30)
    assert torch.equal(back.score(ids), dec.score(ids))


def test_bad_paths_get_clear_errors(tmp_path: Any) -> None:
    with pytest.raises(FileNotFoundError, match="no GGUF file at"):
        KwkDecoder.from_gguf(os.path.join(tmp_path, "missing.gguf"))
    not_gguf = os.path.join(tmp_path, "model.gguf")
    with open(not_gguf, "wb") as f:
        f.write(b"PK\x03\x04 not a gguf file")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        KwkDecoder.from_gguf(not_gguf)


@pytest.mark.slow
def test_the_real_smollm2_file_runs_as_it_is(smollm2_f32: Any) -> None:
    """The real SmolLM2-135M-Instruct GGUF (its source is Q4_1): every matrix repacked exactly (q4, the
    embedding's Q8_0 as q8_0), the stored values those of the file, and scores close to its float32 forward."""
    from kwker_torch.testing import SMOLLM2_GGUF, smollm2_dir

    model, tok = smollm2_f32
    dec = KwkDecoder.from_gguf(os.path.join(smollm2_dir(), SMOLLM2_GGUF), max_context=256)
    assert dec.info["gguf"]["converted"] == {} and len(dec.info["gguf"]["exact"]) == 121
    assert dec.info["q4_matrices"] == 120 and dec.info["formats"]["embed.0"] == "q8_0"
    assert torch.equal(dec.weight("o", 3), model.model.layers[3].self_attn.o_proj.weight)
    assert torch.equal(dec.weight("embed"), model.model.embed_tokens.weight)
    text = "Mr. Bennet was among the earliest of those who waited on Mr. Bingley. He had always intended to visit him."
    ids = tok(text, return_tensors="pt").input_ids[0]
    with torch.no_grad():
        ref = model(ids[None]).logits[0]
    got = dec.score(ids)
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9
    assert tok.decode(dec.generate(tok("The capital of France is", return_tensors="pt").input_ids[0],
                                   max_new_tokens=2).tokens).strip().startswith("Paris")  # fmt: skip


@pytest.mark.slow
def test_the_fast_reader_reads_what_the_gguf_reader_reads() -> None:
    """``FastReader`` (what from_gguf and transformers read through) against the ``gguf`` package's own reader
    on the real SmolLM2 file: every field's parts, types and indices, every tensor's bytes."""
    from kwker_torch.decoder.gguf_reader import FastReader
    from kwker_torch.testing import SMOLLM2_GGUF, smollm2_dir

    path = os.path.join(smollm2_dir(), SMOLLM2_GGUF)
    a, b = gguf.GGUFReader(path), FastReader(path)
    assert list(a.fields) == list(b.fields)
    for key, fa in a.fields.items():
        fb = b.fields[key]
        assert (fa.offset, fa.types, fa.data, len(fa.parts)) == (fb.offset, fb.types, fb.data, len(fb.parts)), key
        for pa, pb in zip(fa.parts, fb.parts, strict=True):
            assert pa.dtype == pb.dtype and np.array_equal(pa, pb), key
    assert [(t.name, t.tensor_type, list(t.shape)) for t in a.tensors] == [
        (t.name, t.tensor_type, list(t.shape)) for t in b.tensors
    ]
    assert all(np.array_equal(x.data, y.data) for x, y in zip(a.tensors, b.tensors, strict=True))


def test_decode_install_runs_the_file_the_model_was_loaded_from(llama_file: Any, smollm2: Any) -> None:
    """``decode.install(model, gguf=FILE)``: the model's generate() on the file's tensors as stored (tokens equal to
    from_gguf's own generation); a file of another model, or a precision beside it, is refused by name."""
    from kwker_torch import decode
    from kwker_torch.testing import generate_greedy

    path, loaded = llama_file
    prompt = torch.randint(0, 512, (1, 9), generator=torch.Generator().manual_seed(2))
    want = KwkDecoder.from_gguf(path, max_context=64).generate(prompt[0], max_new_tokens=8).tokens
    decode.install(loaded, gguf=path, max_batch=1, max_context=64)
    try:
        assert decode.decoder_of(loaded).info["precision"] == "gguf"
        out = generate_greedy(loaded, prompt, 8, exact=True)
        assert out[0, 9:].tolist() == want
    finally:
        decode.uninstall(loaded)
    with pytest.raises(ValueError, match="the file is not this model"):
        decode.install(smollm2[0], gguf=path, max_context=64)
    with pytest.raises(ValueError, match="precision must be 'preserve'"):
        decode.install(loaded, "int4", gguf=path, max_context=64)

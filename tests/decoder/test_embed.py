"""``KwkDecoder.embed`` against Hugging Face's own hidden states and sentence-transformers' own pooling.

Every family's tiny config (``tests/fixtures/family_cases.py``), float32 and bf16 weights: three inputs of
different lengths embedded in one call over two slots (two native steps, several sequences in the first),
pooled "last" and "mean", within 1e-5 of the largest value of HF's float32 ``base_model(ids).last_hidden_state``
pooled the same way (each input alone, unpadded), normalized or not (measured 1e-7 to 1.2e-6, median 5.7e-7).
int8 / int4 run and stay near them (their bar: running; the measured error is stated below). A random
Qwen3-Embedding-shaped model saved with a sentence-transformers config (Transformer, last-token Pooling,
Normalize) gives ``SentenceTransformer(folder).encode``'s vectors.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from fixtures.embedding_model import WIDTH, qwen3_embedding_folder
from fixtures.family_cases import CASES, tiny

from kwker_torch import KwkDecoder

TOL = 1e-5
LENGTHS = (13, 5, 9)


def inputs() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, 1000, (n,), generator=g).tolist() for n in LENGTHS]


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a - ref).abs().max() / ref.abs().max()).item()


def hf_pooled(model: torch.nn.Module, seqs: list[list[int]], pooling: str) -> torch.Tensor:
    """HF's float32 final hidden states of each input alone, pooled as sentence-transformers pools them."""
    ref = copy.deepcopy(model).float()
    rows = []
    with torch.no_grad():
        for ids in seqs:
            h = ref.base_model(torch.tensor([ids])).last_hidden_state[0].float()
            rows.append(h[-1] if pooling == "last" else h.sum(0) / h.shape[0])
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_embed_within_1e5_of_hf_hidden_states_pooled(case: str, dtype: torch.dtype) -> None:
    model = tiny(case, dtype)
    seqs = inputs()
    dec = KwkDecoder.from_hf(model, max_batch=2, max_context=32)
    for pooling in ("last", "mean"):
        ref = hf_pooled(model, seqs, pooling)
        assert dec.hidden_size == ref.shape[1]
        before = dec.native_steps
        got = dec.embed(seqs, pooling=pooling, normalize=False)
        assert dec.native_steps - before == 2  # 3 inputs over 2 slots: 2 native steps
        assert got.shape == ref.shape and got.dtype == torch.float32
        assert rel(got, ref) <= TOL, (pooling, rel(got, ref))
        unit = dec.embed(seqs, pooling=pooling)
        assert rel(unit, torch.nn.functional.normalize(ref, dim=-1)) <= TOL
        one = dec.embed(torch.tensor(seqs[1]), pooling=pooling, normalize=False)  # one sequence: [hidden]
        assert one.shape == (dec.hidden_size,) and rel(one, ref[1]) <= TOL
    assert all(dec.slot_len(s) == 0 for s in range(2))  # the slots are left empty


# int8 / int4 on random weights, against the float32 hidden states (last pooling, normalized): cosine distance
# 1 - cos measured 1.9e-5 to 3.3e-4 for int8 and 4.2e-4 to 1.3e-2 for int4 on these cases.
QUANT_CASES = ["llama", "qwen3", "gemma3", "phi2", "opt-350m-post-norm", "falcon-7b", "mixtral"]
COSINE_LOSS = {"int8": 2e-3, "int4": 5e-2}


@pytest.mark.parametrize("case", QUANT_CASES)
def test_int8_and_int4_embed_near_the_float32_vectors(case: str) -> None:
    model = tiny(case, torch.bfloat16)
    seqs = inputs()
    ref = torch.nn.functional.normalize(hf_pooled(model, seqs, "last"), dim=-1)
    for precision in ("int8", "int4"):
        dec = KwkDecoder.from_hf(model, precision, max_batch=3, max_context=32)
        got = dec.embed(seqs)
        assert torch.isfinite(got).all()
        loss = (1 - (got * ref).sum(-1)).max().item()
        assert loss <= COSINE_LOSS[precision], (precision, loss)


def test_bad_inputs_are_refused_by_name() -> None:
    dec = KwkDecoder.from_hf(tiny("llama"), max_batch=2, max_context=16)
    with pytest.raises(ValueError, match="sequence 1 is empty"):
        dec.embed([[5, 6], []])
    with pytest.raises(ValueError, match=r"sequence 0 has token id 5000, outside the vocabulary \[0, 2048\)"):
        dec.embed([[5, 5000]])
    with pytest.raises(ValueError, match="sequence 0 has 17 tokens; a slot holds at most max_context = 16"):
        dec.embed([list(range(3, 20))])
    with pytest.raises(ValueError, match=r"pooling='cls'; expected one of \['last', 'mean'\]"):
        dec.embed([[5, 6]], pooling="cls")
    with pytest.raises(ValueError, match="needs at least one sequence"):
        dec.embed([])


def test_slots_and_rows_per_step() -> None:
    """Sequences share a step, one per slot given; a long one does not make the others wait."""
    from kwker_torch.decoder.embed import groups

    assert groups([5, 5, 5, 5, 5], 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert groups([3000, 2000, 10, 10], 8) == [range(0, 1), range(1, 4)]
    assert groups([5000, 3], 4) == [range(0, 1), range(1, 2)]
    model = tiny("qwen3")
    dec = KwkDecoder.from_hf(model, max_batch=4, max_context=32)
    seqs = inputs()
    dec.step([(3, [7, 8, 9])])  # slot 3 holds text that embed() (slots 0..1) must not touch
    before = dec.native_steps
    got = dec.embed(seqs, normalize=False, slots=[1, 0])
    assert dec.native_steps - before == 2 and dec.slot_tokens(3) == [7, 8, 9]
    assert rel(got, hf_pooled(model, seqs, "last")) <= TOL


def test_longrope_inputs_on_either_side_of_the_switch_each_get_hfs_own_rotation() -> None:
    """Phi-4-mini's LongRoPE switches at 16 tokens in the tiny config: a 20-token input is read in another step than
    the shorter ones, so each gets the rotary set HF gives it alone."""
    from kwker_torch.decoder.embed import groups, order

    assert order([20, 5, 30, 9], 16) == [1, 3, 0, 2] and order([20, 5], None) == [0, 1]
    assert groups([5, 9, 20, 30], 8, switch=16) == [range(0, 2), range(2, 4)]
    model = tiny("phi4-mini-longrope")
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (20, 5, 13)]
    dec = KwkDecoder.from_hf(model, max_batch=3, max_context=32)
    before = dec.native_steps
    got = dec.embed(seqs, normalize=False)
    assert dec.native_steps - before == 2
    assert rel(got, hf_pooled(model, seqs, "last")) <= TOL


TEXTS = ["The lighthouse keeper opened the bottle.", "A short one", "Retrieval beside chat: embeddings from the "
         "same server, pooled at the last token as Qwen3-Embedding is."]  # fmt: skip


def test_embed_equals_sentence_transformers_on_a_qwen3_embedding_shaped_model(tmp_path: Any) -> None:
    from sentence_transformers import SentenceTransformer

    folder = str(tmp_path / "qwen3-embedding-tiny")
    model, tok = qwen3_embedding_folder(folder)
    st = SentenceTransformer(folder, device="cpu")
    assert [type(m).__name__ for m in st] == ["Transformer", "Pooling", "Normalize"]
    ref = torch.as_tensor(st.encode(TEXTS, batch_size=3, convert_to_numpy=True))  # padded batch of 3
    ids = [st.tokenize([t])["input_ids"][0].tolist() for t in TEXTS]
    assert ids == [tok(t)["input_ids"] for t in TEXTS]
    dec = KwkDecoder.from_hf(model, max_batch=2, max_context=64)
    got = dec.embed(ids, pooling="last", normalize=True)
    assert rel(got, ref) <= TOL, rel(got, ref)
    # mean pooling: the same model with sentence-transformers' mean Pooling module
    from sentence_transformers.sentence_transformer.modules import Pooling

    st_mean = SentenceTransformer(modules=[st[0], Pooling(WIDTH, pooling_mode="mean")], device="cpu")
    ref_mean = torch.as_tensor(st_mean.encode(TEXTS, batch_size=3, convert_to_numpy=True))
    assert rel(dec.embed(ids, pooling="mean", normalize=False), ref_mean) <= TOL

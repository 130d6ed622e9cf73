"""Every entry point, for every family (one tiny case per family, with the real SmolLM2's 49152-token
vocabulary so its tokenizer and chat template apply): ``decode.install()`` under Hugging Face's
``generate()`` (greedy over a left-padded batch, seeded sampling with a streamer, prompt lookup, an
``assistant_model``, the prompt cache across calls), ``save``/``load``, the quality tool, the server with the
model's chat template, and a load from a GGUF file (for the families transformers reads from GGUF).
References: Hugging Face's own float32 model for install() (tokens identical), the quality tool (perplexity
within 1e-4, top-1 agreement 1.0) and the GGUF load (logits within 1e-5 of the largest); save/load against
the decoder it saved (bit-identical); the server against KwkDecoder on the same model (whose logits against
HF's every family test in test_families.py checks).
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import openai
import pytest
import torch
from fixtures.family_cases import CASES, LAYERS, decisive
from fixtures.gguf_files import GGUF_ARCH, write_gguf

from kwker_torch import KwkDecoder, decode
from kwker_torch.testing import chat_ids, generate_greedy, random_model

pytestmark = pytest.mark.slow
TOL = 1e-5
# One case per family (the variant that exercises the most of it).
FAMILY_CASES = [
    "llama", "mistral-window", "qwen2-window-layers", "qwen3", "gemma2", "gemma3", "phi4-mini-longrope", "granite",
    "stablelm-parallel-qknorm", "starcoder2", "olmo-clip", "olmo2", "pythia", "phi2", "gpt2", "opt-350m-post-norm",
    "mixtral", "qwen3-moe", "granite-moe", "olmoe-clip-normed", "falcon-40b-new-arch",
]  # fmt: skip
QUESTIONS = ["What is the capital of France?", "Write one sentence about the sea."]


def entry_model(case: str, seed: int = 0) -> torch.nn.Module:
    """The case at the SmolLM2 tokenizer's vocabulary, float32."""
    base, over = CASES[case]
    over = dict(over, vocab_size=49152, bos_token_id=1, eos_token_id=2)
    if "pad_token_id" in over:
        over["pad_token_id"] = 2
    model = random_model(base, torch.float32, num_hidden_layers=LAYERS.get(case, 2), seed=seed, **over)
    decisive(model)  # a mixture's routers as family_cases makes them
    return model


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def left_padded(tok: Any) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [chat_ids(tok, q)[0] for q in QUESTIONS]
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), 2, dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, n - len(r) :], mask[i, n - len(r) :] = r, 1
    return ids, mask


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_install_under_hf_generate(case: str, smollm2: Any) -> None:
    from transformers import TextIteratorStreamer

    tok = smollm2[1]
    model = entry_model(case)
    ref = copy.deepcopy(model)
    ids, mask = left_padded(tok)
    want = generate_greedy(ref, ids, 8, attention_mask=mask, exact=True)
    one = chat_ids(tok, QUESTIONS[0])
    want_one = generate_greedy(ref, one, 16, exact=True)
    torch.manual_seed(7)
    sampled = ref.generate(one, max_new_tokens=12, do_sample=True, top_k=40, temperature=0.9, min_new_tokens=12)
    draft = decode.install(entry_model(case, seed=1), max_batch=2)
    decode.install(model, max_batch=4, max_context=256)
    try:
        dec = decode.decoder_of(model)
        before = dec.native_steps
        assert torch.equal(generate_greedy(model, ids, 8, attention_mask=mask, exact=True), want)
        assert dec.native_steps - before == 8  # the prompt, then one native step per new token
        streamer = TextIteratorStreamer(tok, skip_prompt=True)
        torch.manual_seed(7)
        got = model.generate(one, max_new_tokens=12, do_sample=True, top_k=40, temperature=0.9, min_new_tokens=12,
                             streamer=streamer)  # fmt: skip
        assert torch.equal(got, sampled)
        assert "".join(streamer) == tok.decode(got[0, one.shape[1] :], skip_special_tokens=True)
        assert torch.equal(generate_greedy(model, one, 16, exact=True, prompt_lookup_num_tokens=4), want_one)
        assert torch.equal(generate_greedy(model, one, 16, exact=True, assistant_model=draft), want_one)
        # The prompt cache: the next turn starts with what the previous left in an idle slot.
        cached = decode.stats(model)["cached_tokens"]
        turn2 = torch.cat([want_one, chat_ids(tok, [{"role": "user", "content": "And then?"}])[:, 1:]], 1)
        assert torch.equal(generate_greedy(model, turn2, 6, exact=True), generate_greedy(ref, turn2, 6, exact=True))
        assert decode.stats(model)["cached_tokens"] > cached
    finally:
        decode.uninstall(model)
        decode.uninstall(draft)


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_save_load_and_the_quality_tool(case: str, smollm2: Any, tmp_path: Any) -> None:
    from kwker_torch.tools import quality

    tok = smollm2[1]
    model = entry_model(case)
    ids = chat_ids(tok, QUESTIONS[1])[0]
    dec = KwkDecoder.from_hf(model, "int8", max_context=128)
    dec.save(tmp_path / "int8")
    back = KwkDecoder.load(tmp_path / "int8")
    assert back.family == dec.family and back.info["formats"] == dec.info["formats"]
    assert torch.equal(back.score(ids), dec.score(ids))  # bit-identical
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    text = tmp_path / "text.txt"
    text.write_text("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
                    "must be in want of a wife. " * 12)  # fmt: skip
    out = quality.run(quality.parse_args(["--model", str(folder), "--text", str(text), "--ctx", "64", "--chunks", "2",
                                          "--precision", "preserve"]))  # fmt: skip
    by = {c["name"]: c for c in out["contenders"]}
    hf, kwk = by["hf-f32"], by["kwker preserve"]
    assert abs(kwk["perplexity"] / hf["perplexity"] - 1) < 1e-4 and kwk["top1"] == 1.0 and kwk["kl"] < 1e-9
    json.dumps(out)


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_server_chat_with_the_chat_template(case: str, smollm2: Any) -> None:
    from kwker_torch.serve import ServeOptions, create_app, engine_for
    from kwker_torch.serve.background import Background

    tok = smollm2[1]
    model = entry_model(case)
    ref = KwkDecoder.from_hf(model, max_context=256)
    opts = ServeOptions(slots=2, max_context=256, queue=4)
    engine = engine_for(model, tok, opts)
    run = Background(create_app(opts, engine=engine))
    try:
        client = openai.OpenAI(base_url=run.url + "/v1", api_key="none", max_retries=0, timeout=120)
        r = client.chat.completions.create(model=opts.model_name, temperature=0, max_tokens=10,
                                           messages=[{"role": "user", "content": QUESTIONS[0]}])  # fmt: skip
        out = ref.generate(chat_ids(tok, QUESTIONS[0])[0], 10, prompt_cache=False)
        toks = out.tokens[:-1] if out.finish_reason == "stop" else out.tokens
        assert r.choices[0].message.content == tok.decode(toks, skip_special_tokens=True)
        assert r.usage.completion_tokens == len(out.tokens)
    finally:
        run.stop()
        engine.shutdown(grace=5)




GGUF_FAMILY_CASES = [c for c in FAMILY_CASES if c in (
    "llama", "mistral-window", "qwen2-window-layers", "qwen3", "gemma2", "gemma3", "phi4-mini-longrope",
    "stablelm-parallel-qknorm", "starcoder2", "gpt2")]  # fmt: skip


@pytest.mark.parametrize("case", GGUF_FAMILY_CASES)
def test_a_model_loaded_from_gguf(case: str, smollm2: Any, tmp_path: Any) -> None:
    """transformers reads these families from GGUF (their architecture is in its GGUF map); the model it builds
    (its own defaults where the file says nothing) runs on the decoder."""
    from transformers import AutoModelForCausalLM, GgufConfig

    model = entry_model(case)
    assert model.config.model_type in GGUF_ARCH
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    # Without a vocab_size key, transformers sizes the vocabulary from the file's tokenizer (slow to read).
    needs_tokenizer = "vocab_size" not in GGUF_CONFIG_MAPPING[GGUF_ARCH[model.config.model_type]].values()
    write_gguf(model, os.path.join(tmp_path, "m.gguf"), tokenizer=needs_tokenizer)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf", dtype=torch.float32,
                                                  quantization_config=GgufConfig(dequantize=True)).eval()  # fmt: skip
    dec = KwkDecoder.from_hf(loaded, max_context=64)
    ids = chat_ids(smollm2[1], QUESTIONS[0])[0]
    with torch.no_grad():
        ref = loaded(ids[None]).logits[0]
    assert rel(dec.score(ids), ref) <= TOL
    # The same file run as it is (float32 tensors kept as float32): the same logits.
    as_stored = KwkDecoder.from_gguf(os.path.join(tmp_path, "m.gguf"), max_context=64)
    assert as_stored.info["gguf"]["converted"] == {}
    assert rel(as_stored.score(ids), ref) <= TOL


def test_the_server_loads_a_gguf_file(tmp_path: Any) -> None:
    """``python -m kwker_torch.serve --model FILE.gguf``: the model (its tensors as stored) and its tokenizer (with
    the chat template) from the file, on the decoder."""
    from kwker_torch.serve import ServeOptions, build_engine

    path = write_gguf(entry_model("qwen3"), os.path.join(tmp_path, "qwen3.gguf"))
    engine = build_engine(ServeOptions(model=path, slots=1, max_context=64, queue=2))
    try:
        assert engine.dec.family == "Qwen3"
        assert engine.dec.info["precision"] == "gguf"  # the file's tensors as stored (here F32: kept as f32)
        assert engine.dec.info["gguf"]["converted"] == {} and engine.dec.info["f32_matrices"] > 0
        assert engine.tok.chat_template
    finally:
        engine.shutdown(grace=1)

"""``decode.install(model)``: Hugging Face's own ``generate()`` and forward on KwkDecoder, one native step
per forward, with HF's API kept: greedy tokens equal to HF float32's (the real SmolLM2-135M as float32
and as bf16), logits within 1e-5 of the largest every step, left-padded batches, seeded sampling,
streamers, stopping criteria, plain forwards with a loss, manual cache loops, fallbacks, clear errors."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from kwker_torch import decode
from kwker_torch.testing import chat_ids, generate_greedy, random_model

TOL = 1e-5


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def with_logits(model: torch.nn.Module, ids: torch.Tensor, new: int, **kw: object) -> tuple[torch.Tensor, list]:
    out = generate_greedy(model, ids, new, output_logits=True, return_dict_in_generate=True, **kw)
    return out.sequences, list(out.logits)


def small(layers: int = 2) -> torch.nn.Module:
    return random_model("SmolLM2-360M", torch.bfloat16, num_hidden_layers=layers).float()


@pytest.fixture
def smollm2_bf16_as_f32(smollm2: tuple) -> tuple:
    """The real SmolLM2-135M's bf16 weights loaded as float32 (bf16-exact: read as bf16 by the decoder)."""
    import copy

    model, tok = smollm2
    return copy.deepcopy(model).float(), tok


def test_real_smollm2_generate_equals_hf_float32(smollm2_bf16_as_f32: tuple) -> None:
    model, tok = smollm2_bf16_as_f32
    ids = chat_ids(tok, "Give me three tips for writing clear emails.")
    want, ref_logits = with_logits(model, ids, 32)
    decode.install(model, max_batch=2, max_context=512)
    try:
        dec = decode.decoder_of(model)
        assert dec.info["f32_matrices"] == 0  # every matrix read as bf16: same numbers, half the bytes
        before = dec.native_steps
        got, logits = with_logits(model, ids, 32)
        steps = dec.native_steps - before
    finally:
        decode.uninstall(model)
    assert torch.equal(got, want), (tok.decode(got[0, ids.shape[1] :]), tok.decode(want[0, ids.shape[1] :]))
    assert steps == len(logits)  # one native step per forward: the prompt, then one per new token
    assert max(rel(a, b) for a, b in zip(logits, ref_logits, strict=True)) <= TOL


def test_real_smollm2_loaded_as_bf16_gives_hf_float32_tokens(smollm2: tuple) -> None:
    """A bf16 model: the decoder computes in float32, so its greedy tokens are those of HF's float32
    forward of the same weights (not of HF's bf16 forward, which rounds every op)."""
    import copy

    model, tok = smollm2
    ids = chat_ids(tok, "Name a famous bridge and say where it is.")
    want = generate_greedy(copy.deepcopy(model).float(), ids, 24)
    installed = copy.deepcopy(model)
    decode.install(installed, max_batch=1, max_context=256)
    got = generate_greedy(installed, ids, 24)
    assert torch.equal(got, want)
    with torch.no_grad():
        out = installed(ids)
    assert out.logits.dtype == torch.float32 and out.logits.shape == (1, ids.shape[1], installed.config.vocab_size)


def test_left_padded_batch_equals_hf() -> None:
    model = small()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 1000, (3, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    mask[2, :7] = 0
    want, ref = with_logits(model, ids, 12, attention_mask=mask, pad_token_id=0)
    decode.install(model, max_batch=4, max_context=64)
    got, logits = with_logits(model, ids, 12, attention_mask=mask, pad_token_id=0)
    assert decode.decoder_of(model).native_steps == 12  # the prompt and 11 decode steps, all native
    assert torch.equal(got, want)
    assert max(rel(a, b) for a, b in zip(logits, ref, strict=True)) <= TOL


def test_sampling_streamer_stopping_criteria_and_outputs() -> None:
    from transformers import StoppingCriteria, StoppingCriteriaList

    model = small()
    ids = torch.randint(3, 1000, (1, 8), generator=torch.Generator().manual_seed(1))
    kw = dict(do_sample=True, temperature=0.7, top_k=40, top_p=0.9, max_new_tokens=20, min_new_tokens=20)

    def sample() -> torch.Tensor:
        torch.manual_seed(42)
        with torch.no_grad():
            return model.generate(ids, attention_mask=torch.ones_like(ids), **kw)

    want = sample()

    class Collect:
        def __init__(self) -> None:
            self.tokens: list[int] = []
            self.ended = False

        def put(self, value: torch.Tensor) -> None:
            self.tokens += value.flatten().tolist()

        def end(self) -> None:
            self.ended = True

    class StopAfter(StoppingCriteria):
        def __init__(self, n: int) -> None:
            self.n = n

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object) -> torch.Tensor:
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= ids.shape[1] + self.n, dtype=torch.bool)

    decode.install(model, max_batch=2, max_context=64)
    assert torch.equal(sample(), want)  # HF's own sampler, the same RNG draws, on logits equal to 1e-6
    assert decode.decoder_of(model).native_steps == 20
    streamer = Collect()
    out = generate_greedy(model, ids, 30, streamer=streamer, stopping_criteria=StoppingCriteriaList([StopAfter(5)]))
    assert out.shape[1] == ids.shape[1] + 5
    assert streamer.ended and streamer.tokens == out[0].tolist()  # the prompt, then each new token
    res = model.generate(ids, max_new_tokens=4, do_sample=False, output_scores=True, output_logits=True,
                         return_dict_in_generate=True)  # fmt: skip
    assert len(res.scores) == len(res.logits) == 4 and res.sequences.shape == (1, ids.shape[1] + 4)


def test_plain_forward_loss_and_manual_cache_loop() -> None:
    model = small()
    ids = torch.randint(3, 1000, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(ids, labels=ids)
        step1 = model(ids[:, :6])
        step2 = model(ids[:, 6:], cache=step1.cache)
    decode.install(model, max_batch=4, max_context=64)
    with torch.no_grad():
        out = model(ids, labels=ids)
        assert type(out).__name__ == "CausalLMOutputWithPast" and out.logits.shape == ref.logits.shape
        assert rel(out.logits, ref.logits) <= TOL
        assert abs(out.loss.item() - ref.loss.item()) <= 1e-5 * ref.loss.item()
        a = model(ids[:, :6])
        b = model(ids[:, 6:], cache=a.cache)  # continue the cache by hand, as a custom decode loop does
        assert type(a.cache).__name__ == "KwkCache" and a.cache.get_seq_length() == 9
        assert rel(a.logits, step1.logits) <= TOL and rel(b.logits, step2.logits) <= TOL
        assert rel(model(ids, return_dict=False)[0], ref.logits) <= TOL


def test_fallbacks_are_logged_and_uninstall_restores(caplog: pytest.LogCaptureFixture) -> None:
    model = small(layers=1)
    ids = torch.randint(3, 1000, (1, 5))
    with torch.no_grad():
        ref = model(ids).logits
    decode.install(model, max_batch=2, max_context=32)
    dec = decode.decoder_of(model)
    with caplog.at_level(logging.INFO, logger="kwker_torch"):
        before = dec.native_steps
        out = model(ids)  # gradients enabled and parameters require them: left to torch
        hs = model(ids, output_hidden_states=True)
        with torch.no_grad():
            model(ids)
    assert out.logits.requires_grad and hs.hidden_states is not None
    assert dec.native_steps == before + 1  # only the no_grad call ran natively
    assert "gradients enabled" in caplog.text and "output_hidden_states" in caplog.text
    decode.uninstall(model)
    assert "forward" not in model.__dict__ and not decode.is_installed(model)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref)


def test_weight_changes_after_install_rebuild_the_decoder() -> None:
    """A weight changed in place after install() is seen at the start of the next sequence."""
    model = small(layers=1)
    ids = torch.randint(3, 1000, (1, 6), generator=torch.Generator().manual_seed(3))
    decode.install(model, max_batch=2, max_context=32)
    first = decode.decoder_of(model)
    with torch.no_grad():
        model(ids)
        model.model.layers[0].mlp.down_proj.weight.mul_(2.0)
        got = model(ids).logits
        rebuilt = decode.decoder_of(model)
        decode.uninstall(model)
        ref = model(ids).logits
    assert rel(got, ref) <= TOL
    assert rebuilt is not first and rebuilt.native_steps == 1  # a new decoder ran the changed weights


def test_bad_input_gives_clear_errors() -> None:
    model = small(layers=1)
    decode.install(model, max_batch=2, max_context=16)
    ids = torch.randint(3, 1000, (3, 4))
    with pytest.raises(ValueError, match="a batch of 3 sequences needs 3 decoder slots.*max_batch=3"):
        generate_greedy(model, ids, 2)
    with pytest.raises(NotImplementedError, match="beam search is not supported under decode.install"):
        with torch.no_grad():
            model.generate(ids[:1], max_new_tokens=3, num_beams=2, do_sample=False)
    with pytest.raises(Exception, match="more than max_context = 16"):
        generate_greedy(model, ids[:1], 20)
    with pytest.raises(Exception, match="token id 99999 is out of range"):
        with torch.no_grad():
            model(torch.tensor([[99999]]))
    with torch.no_grad():
        kept = [model(ids[:1]) for _ in range(3)]  # three live caches, two slots: the oldest is evicted
        with pytest.raises(RuntimeError, match="can no longer be used: its slots were given to a newer sequence"):
            model(ids[:1, :1], cache=kept[0].cache)
        model(ids[:1, :1], cache=kept[2].cache)  # the newest still works


def test_generate_from_two_threads_equals_serial() -> None:
    model = small()
    g = torch.Generator().manual_seed(4)
    a, b = torch.randint(3, 1000, (1, 7), generator=g), torch.randint(3, 1000, (2, 5), generator=g)
    decode.install(model, max_batch=4, max_context=64)
    want = [generate_greedy(model, a, 16), generate_greedy(model, b, 16)]
    with torch.no_grad():
        scored = model(a).logits
    got: list = [None, None, None]

    def run(i: int, ids: torch.Tensor) -> None:
        got[i] = generate_greedy(model, ids, 16)

    def plain() -> None:  # a third thread leasing and releasing slots with plain forwards meanwhile
        with torch.no_grad():
            got[2] = all(rel(model(a).logits, scored) <= TOL for _ in range(10))

    before = decode.decoder_of(model).native_steps
    threads = [threading.Thread(target=run, args=(i, x)) for i, x in enumerate((a, b))]
    threads.append(threading.Thread(target=plain))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[2] is True
    assert decode.decoder_of(model).native_steps == before + 2 * 16 + 10


def test_kwker_alias_runs_the_documented_snippet() -> None:
    """``import kwker; from kwker.decode import install`` as in the product's documentation (a local model
    instead of a hub id), also with precision="int4" (the snippet's quantized form)."""
    import kwker
    from kwker.decode import install

    model = small(layers=1)
    ids = torch.randint(3, 1000, (1, 6), generator=torch.Generator().manual_seed(5))
    want = generate_greedy(model, ids, 8)
    install(model, precision="int4")
    assert decode.decoder_of(model).info["q4k_matrices"] > 0
    with torch.no_grad():
        quantized = model.generate(ids, max_new_tokens=8, do_sample=False, attention_mask=torch.ones_like(ids))
    assert quantized.shape == want.shape
    install(model)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False, attention_mask=torch.ones_like(ids))
    assert torch.equal(out, want)
    assert kwker.KwkDecoder is decode.decoder_of(model).__class__

"""``POST /v1/embeddings`` through the real ``openai`` client (``client.embeddings.create``), on live servers:

- a random Qwen3-Embedding-shaped model folder with a sentence-transformers config (last-token pooling,
  Normalize) and ``is_matryoshka`` in its config: the vectors are ``SentenceTransformer(folder).encode``'s
  (within 1e-5 of the largest value), as floats, as base64 (little-endian float32) and in the client's own
  default (base64 decoded by the client); ``dimensions`` cuts and normalizes again; ``usage`` counts tokens;
  embeddings run while a chat completion is generating, and leave its text alone;
- a tiny Llama folder served with ``--pooling mean`` (no sentence-transformers config): HF's mean-pooled
  hidden states, normalized; ``dimensions`` is a 400 there (not a Matryoshka model);
- the 400s, each naming what was expected.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import torch
from fixtures.embedding_model import WIDTH, qwen3_embedding_folder
from fixtures.tiny_model import tiny_model

from kwker_torch.serve import ServeOptions, create_app
from kwker_torch.serve.background import Background
from kwker_torch.serve.embeddings import Pooling, pooling_of

pytestmark = pytest.mark.slow
MODEL = "qwen3-embedding-tiny"
TOL = 1e-5
TEXTS = ["The lighthouse keeper opened the bottle.", "A short one", "Retrieval beside chat: embeddings from the "
         "same server, pooled at the last token as Qwen3-Embedding is.", "four",
         "and a fifth input to embed"]  # fmt: skip


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a - ref).abs().max() / ref.abs().max()).item()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: Any) -> str:
    path = str(tmp_path_factory.mktemp("emb") / MODEL)
    qwen3_embedding_folder(path, matryoshka=True)
    return path


@pytest.fixture(scope="module")
def server(folder: str) -> Iterator[str]:
    opts = ServeOptions(model=folder, slots=2, max_context=128, served_name=MODEL)
    run = Background(create_app(opts))
    yield run.url
    run.stop()


@pytest.fixture
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def reference(folder: str) -> torch.Tensor:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(folder, device="cpu")
    return torch.as_tensor(st.encode(TEXTS, convert_to_numpy=True))


def test_the_folder_config_decides_the_pooling(folder: str, tmp_path: Any) -> None:
    p = pooling_of(folder, "mean")  # sentence-transformers < 6's config, as Qwen3-Embedding ships it
    assert (p.mode, p.normalize, p.problem) == ("last", True, None) and p.source.endswith("modules.json")
    assert pooling_of(None, "mean") == Pooling("mean", True, "--pooling")
    # sentence-transformers 6's form, without Normalize; and modules this server does not apply
    (tmp_path / "1_Pooling").mkdir()
    modules = [{"path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
               {"path": "1_Pooling", "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"}]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 8, "pooling_mode": "mean"}))
    assert pooling_of(str(tmp_path), "last") == Pooling("mean", False, f"{tmp_path}/modules.json")
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "cls"}))
    assert "pooling_mode_cls_token" in (pooling_of(str(tmp_path), "last").problem or "")
    modules.append({"path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    assert "include Dense" in (pooling_of(str(tmp_path), "last").problem or "")


def test_float_base64_and_the_clients_default_equal_sentence_transformers(client: openai.OpenAI, folder: str,
                                                                         reference: torch.Tensor) -> None:  # fmt: skip
    out = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    assert out.object == "list" and out.model == MODEL and [d.index for d in out.data] == list(range(len(TEXTS)))
    got = torch.tensor([d.embedding for d in out.data])
    assert got.shape == (len(TEXTS), WIDTH) and rel(got, reference) <= TOL, rel(got, reference)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    tokens = sum(len(tok(t)["input_ids"]) for t in TEXTS)
    assert out.usage.prompt_tokens == out.usage.total_tokens == tokens
    raw = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="base64")
    b64 = torch.tensor(np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in raw.data]))
    assert torch.equal(b64, got)
    default = client.embeddings.create(model=MODEL, input=TEXTS)  # the client asks base64 and decodes it
    assert torch.equal(torch.tensor([d.embedding for d in default.data]), got)
    one = client.embeddings.create(model=MODEL, input=TEXTS[1], encoding_format="float")
    assert torch.equal(torch.tensor(one.data[0].embedding), got[1])


def test_token_ids_and_dimensions(client: openai.OpenAI, folder: str, reference: torch.Tensor) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    ids = [tok(t)["input_ids"] for t in TEXTS[:3]]
    out = client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    assert rel(torch.tensor([d.embedding for d in out.data]), reference[:3]) <= TOL
    single = client.embeddings.create(model=MODEL, input=ids[0], encoding_format="float")
    assert len(single.data) == 1 and rel(torch.tensor(single.data[0].embedding), reference[0]) <= TOL
    cut = client.embeddings.create(model=MODEL, input=TEXTS, dimensions=16, encoding_format="float")
    got = torch.tensor([d.embedding for d in cut.data])
    assert got.shape == (len(TEXTS), 16)
    assert rel(got, torch.nn.functional.normalize(reference[:, :16], dim=-1)) <= TOL  # cut, then normalized
    assert torch.allclose(got.norm(dim=-1), torch.ones(len(TEXTS)))


def test_embeddings_run_beside_a_chat_completion(client: openai.OpenAI, reference: torch.Tensor) -> None:
    """Both slots: one generating a reply, the other free for embeddings meanwhile; the reply is the one it
    gives alone."""
    import threading

    ask = [{"role": "user", "content": "Say something long"}]
    alone = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=40, temperature=0)
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(client.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=40, temperature=0)))  # fmt: skip
    t.start()
    for _ in range(3):
        out = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
        assert rel(torch.tensor([d.embedding for d in out.data]), reference) <= TOL
    t.join()
    assert box[0].choices[0].message.content == alone.choices[0].message.content


@pytest.mark.parametrize("body, param, says", [
    ({"input": ""}, "input", "input[0] is empty (it has no tokens)"),
    ({"input": []}, "input", "input is empty: give a string, a list of strings"),
    ({"input": [[]]}, "input", "input[0] is empty"),
    ({"input": [[1, 2], [3, 10**7]]}, "input", "input[1] has token id 10000000, outside the vocabulary"),
    ({"input": [[5] * 129]}, "input", "input[0] has 129 tokens; this model's maximum context length is 128"),
    ({"input": "x", "encoding_format": "f16"}, "encoding_format", "Input should be 'float' or 'base64'"),
    ({"input": "x", "dimensions": 0}, "dimensions", "greater than or equal to 1"),
    ({"input": "x", "dimensions": WIDTH + 1}, "dimensions", f"can be cut to 1..{WIDTH}"),
    ({"input": [1, "a"]}, "input", "input"),
    ({"input": ["ok"] * 2049}, "input", "input has 2049 items; at most 2048 per request"),
], ids=["empty-string", "empty-list", "empty-ids", "id-out-of-vocab", "too-long", "encoding", "dimensions-0",
        "dimensions-wide", "mixed", "too-many"])  # fmt: skip
def test_bad_values_are_400s_that_say_what_was_expected(server: str, body: dict[str, Any], param: str,
                                                        says: str) -> None:  # fmt: skip
    r = httpx.post(server + "/v1/embeddings", json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"], err


def test_another_model_is_a_404(server: str) -> None:
    r = httpx.post(server + "/v1/embeddings", json={"model": "nope", "input": "x"}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_pooling_flag_mean_on_a_model_without_a_sentence_transformers_config(tmp_path: Any) -> None:
    from transformers import AutoModelForCausalLM

    path = tiny_model(str(tmp_path / "llama-tiny"))
    opts = ServeOptions(model=path, slots=3, max_context=64, served_name="llama-tiny", pooling="mean")
    run = Background(create_app(opts))
    try:
        client = openai.OpenAI(base_url=run.url + "/v1", api_key="none", max_retries=0, timeout=300)
        ids = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [100, 101, 102, 200]]
        out = client.embeddings.create(model="llama-tiny", input=ids, encoding_format="float")
        ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            pooled = torch.stack([ref.base_model(torch.tensor([x])).last_hidden_state[0].mean(0) for x in ids])
        want = torch.nn.functional.normalize(pooled, dim=-1)
        assert rel(torch.tensor([d.embedding for d in out.data]), want) <= TOL
        with pytest.raises(openai.BadRequestError, match="does not say it was trained to be cut"):
            client.embeddings.create(model="llama-tiny", input=ids, dimensions=8)
    finally:
        run.stop()

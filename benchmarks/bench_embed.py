"""Embeddings: ``POST /v1/embeddings`` of 32 inputs against 32 sequential Hugging Face forward passes (issue 34's
bar: at least 5x), on the real SmolLM2-135M, precision preserve.

The server runs in this process (uvicorn on a background thread, ``--slots`` 8 by default, last-token pooling,
normalized); the client posts the 32 inputs in one request, two sets of them cut from the project's sample
story: "queries" of 6 to 24 words and "passages" of 24 to 150 words. HF's side is what an embedder on
transformers does one input at a time: ``model.model(ids)`` (the final hidden states, no lm_head) per input,
in the checkpoint's bf16 and in float32, with torch's threads; the bar is measured against the faster of the
two. All are timed in turn round after round (``common.interleaved``): medians, and the largest difference
between the server's vectors and HF float32's pooled ones.

    python benchmarks/bench_embed.py [--rounds 5] [--slots 8]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import interleaved, machine, save, table  # noqa: E402

INPUTS = 32
SETS = {"queries": (6, 24), "passages": (24, 150)}  # words per input, shortest and longest


def inputs(lo: int, hi: int) -> list[str]:
    from kwker_torch.texts import sample_text

    words = sample_text().split()
    out, at = [], 0
    for i in range(INPUTS):
        n = lo + (i * 37) % (hi - lo + 1)
        if at + n > len(words):
            at = 0
        out.append(" ".join(words[at : at + n]))
        at += n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--slots", type=int, default=8)
    args = ap.parse_args()
    import httpx

    from kwker_torch.serve import ServeOptions, create_app, engine_for
    from kwker_torch.serve.background import Background
    from kwker_torch.testing import load_smollm2

    print(machine())
    model, tok = load_smollm2(torch.bfloat16)
    opts = ServeOptions(slots=args.slots, max_context=2048, served_name="smollm2")
    engine = engine_for(model, tok, opts)
    run = Background(create_app(opts, engine=engine))
    client = httpx.Client(timeout=600)
    models = {"bf16": model, "f32": copy.deepcopy(model).float()}
    report: dict = {"command": " ".join(sys.argv), "slots": args.slots}
    try:
        for name, (lo, hi) in SETS.items():
            report[name] = bench_set(name, inputs(lo, hi), tok, models, client, run.url, args.rounds)
    finally:
        client.close()
        run.stop()
        engine.shutdown(grace=5)
    print(f"wrote {save('embed', report)}")


def bench_set(name: str, texts: list[str], tok: Any, models: dict[str, Any], client: Any, url: str,
              rounds: int) -> dict[str, Any]:  # fmt: skip
    ids = [tok(t, return_tensors="pt").input_ids for t in texts]
    lengths = [x.shape[1] for x in ids]
    print(f"\n{name}: {INPUTS} inputs of {min(lengths)}..{max(lengths)} tokens ({sum(lengths)} in all)")
    body = {"model": "smollm2", "input": texts, "encoding_format": "float"}

    def served() -> Any:
        r = client.post(url + "/v1/embeddings", json=body)
        r.raise_for_status()
        return r.json()

    def hf(which: str) -> list[torch.Tensor]:
        m = models[which]
        with torch.no_grad():
            return [m.model(x).last_hidden_state[0, -1] for x in ids]

    got = torch.tensor([d["embedding"] for d in served()["data"]])
    ref = torch.nn.functional.normalize(torch.stack(hf("f32")), dim=-1)
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    t = interleaved({"server": served, "hf_bf16": lambda: hf("bf16"), "hf_f32": lambda: hf("f32")},
                    rounds=rounds, min_seconds=0.0)  # fmt: skip
    rows = [["/v1/embeddings (one request of 32)", t["server"] * 1e3, INPUTS / t["server"], "1.00"],
            ["HF bf16, 32 sequential model.model()", t["hf_bf16"] * 1e3, INPUTS / t["hf_bf16"],
             f"{t['hf_bf16'] / t['server']:.2f}"],
            ["HF f32, 32 sequential model.model()", t["hf_f32"] * 1e3, INPUTS / t["hf_f32"],
             f"{t['hf_f32'] / t['server']:.2f}"]]  # fmt: skip
    print(table(["what", "median ms", "inputs/s", "its time / server's"], rows))
    ratio = min(t["hf_bf16"], t["hf_f32"]) / t["server"]
    print(f"{name}: server vs the faster HF {ratio:.2f}x (bar: >= 5x); max |server - HF f32| / max |HF f32| = "
          f"{err:.2e}")  # fmt: skip
    return {"tokens": lengths, "seconds": t, "ratio_vs_faster_hf": ratio, "max_rel_err_vs_hf_f32": err}


if __name__ == "__main__":
    main()

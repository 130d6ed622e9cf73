"""kwker_torch: Rust CPU kernels for PyTorch language models, registered as ``torch.ops.kwker.*``.

Importing this package loads the native library (which registers the ops with torch's dispatcher
through the stable ABI) and the ops' fake kernels (for ``torch.compile`` and ``opcheck``).

Ops (inference only; float32 accumulation, one rounding to the output dtype):
  - ``torch.ops.kwker.linear(x, weight, bias=None)``: ``x @ weight.T + bias``.
  - ``torch.ops.kwker.decode_attention(q, k, v, scale)``: attention of new tokens over a KV cache.

Use ``kwker_torch.torch_ops.install()`` to put an unchanged Hugging Face model on them.
"""

from __future__ import annotations

from . import ops  # noqa: F401  (registers the ops, their fake kernels and autograd rules)
from .decoder import KwkDecoder
from .ops.native import isa, num_threads, set_isa, set_num_threads, supported_isas

__all__ = ["KwkDecoder", "isa", "num_threads", "set_isa", "set_num_threads", "supported_isas"]
__version__ = "0.1.0"

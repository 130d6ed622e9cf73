"""llama.cpp as a benchmark peer: build it for this host, drive it in a subprocess, export GGUF files.

Benchmark-only. Nothing else in kwker_torch imports this package, except the quality tool (``PEER_CACHES``, a
plain table, at import; the worker only for its ``--gguf`` option). ``build.ensure_llama_cpp(kind)`` installs
PyPI ``llama-cpp-python`` (pinned in ``benchmarks/requirements-peers.txt``) into a private folder;
``llama_cpp.LlamaCppWorker`` runs it in a child process (two builds cannot share one process); ``gguf_export``
writes HF models as GGUF files.
"""

# llama.cpp's KV cache settings by name, for the benchmarks' and the quality tool's ``--peer-cache``: its default
# f16 cache (flash attention "auto", as llama-bench) and the 8-bit pair ``-ctk q8_0 -ctv q8_0 -fa 1`` (a quantized
# V cache needs flash attention). Keywords of ``LlamaCppWorker.load``.
PEER_CACHES: dict[str, dict[str, str]] = {
    "f16": {"kv_type": "f16", "flash_attn": "auto"},
    "q8_0": {"kv_type": "q8_0", "flash_attn": "on"},
}

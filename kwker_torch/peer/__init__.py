"""llama.cpp as a benchmark peer: build it for this host, drive it in a subprocess, export GGUF files.

Benchmark-only. Nothing else in kwker_torch imports this package, except the quality tool's ``--gguf``
option. ``build.ensure_llama_cpp(kind)`` installs PyPI ``llama-cpp-python`` (pinned in
``benchmarks/requirements-peers.txt``) into a private folder; ``llama_cpp.LlamaCppWorker`` runs it in a
child process (two builds cannot share one process); ``gguf_export`` writes HF models as GGUF files.
"""

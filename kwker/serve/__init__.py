"""``kwker.serve``: ``kwker_torch.serve`` (the OpenAI-compatible server) under the short package name;
``python -m kwker.serve`` runs it as ``python -m kwker_torch.serve`` does."""

from __future__ import annotations

from kwker_torch.serve import Engine, ServeOptions, build_engine, create_app, engine_for

__all__ = ["Engine", "ServeOptions", "build_engine", "create_app", "engine_for"]

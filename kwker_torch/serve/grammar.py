"""``response_format`` (and forced tool calls, tools.py: one call's JSON schema, or a Lark grammar of several)
by constrained decoding on llguidance: each step, the tokens the grammar does not allow are masked out of the
logits before the next token is chosen, so the output is valid JSON (of the schema, for ``json_schema``)
unless it is cut by ``max_tokens``.

A schema llguidance cannot compile is refused (``GrammarError``, answered 400) before generation: never
silently unconstrained output. ``{"type": "text"}`` (or no response_format) means no grammar.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any


class GrammarError(ValueError):
    """The response_format cannot be enforced; the message says why."""


class Grammars:
    """Compiles response formats for one tokenizer (its llguidance view is built once, on first use)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self._hf = tokenizer
        self._vocab = vocab_size
        self._ll: Any = None
        self._lock = threading.Lock()

    def _tokenizer(self) -> Any:
        with self._lock:
            if self._ll is None:
                import llguidance.hf

                self._ll = llguidance.hf.from_tokenizer(self._hf, n_vocab=self._vocab)
            return self._ll

    def compile(self, fmt: dict[str, Any] | None) -> str | None:
        """The llguidance grammar of an OpenAI response_format, or None for plain text."""
        if not fmt:
            return None
        kind = fmt.get("type")
        if kind in (None, "text"):
            return None
        if kind == "json_object":
            schema: Any = {"type": "object"}
        elif kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict | bool):
                raise GrammarError(
                    "response_format.json_schema must be an object with a 'schema' (a JSON Schema object), "
                    'e.g. {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}'
                )
            schema = spec.get("schema", {})
        else:
            raise GrammarError(
                f"response_format.type {kind!r} is not supported; expected 'text', 'json_object' or 'json_schema'"
            )
        return self.compile_schema(schema, "response_format")

    def compile_schema(self, schema: Any, what: str) -> str:
        """The llguidance grammar of a JSON Schema; ``what`` names its source in errors."""
        import llguidance

        return self._checked(lambda: llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema)), what,
                             "the JSON schema")  # fmt: skip

    def compile_lark(self, lark: str, what: str) -> str:
        """The llguidance grammar of a Lark grammar (which may embed JSON schemas as ``%json {...}``)."""
        import llguidance

        return self._checked(lambda: llguidance.LLMatcher.grammar_from_lark(lark), what, "the grammar")

    def _checked(self, compile_: Callable[[], str], what: str, kind: str) -> str:
        """``compile_()``'s grammar, validated against this tokenizer; GrammarError naming ``what`` and ``kind``."""
        import llguidance

        try:
            grammar = compile_()
        except (ValueError, TypeError) as e:
            raise GrammarError(f"{what}: {kind} cannot be compiled: {e}") from e
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self._tokenizer())
        if failed:
            raise GrammarError(f"{what}: {kind} cannot be enforced: {'; '.join(messages)}")
        return grammar

    def matcher(self, grammar: str) -> Any:
        import llguidance

        m = llguidance.LLMatcher(self._tokenizer(), grammar)
        if m.is_error():
            raise GrammarError(f"the grammar cannot start: {m.get_error()}")
        return m

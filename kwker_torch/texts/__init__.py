"""Text that belongs to the project: ``sample.txt``, a short story written for kwker (plain English prose, 1,811
words, 2,167 tokens of SmolLM2's tokenizer), so that the demo's quoting prompt, the quality tool's default
text and the tests need nothing outside the package. Published quality numbers use the Austen novels passed
with ``--text``."""

from __future__ import annotations

from pathlib import Path

SAMPLE = Path(__file__).with_name("sample.txt")


def sample_text() -> str:
    """The whole sample story."""
    return SAMPLE.read_text(encoding="utf-8")


def passage(words: int = 120) -> str:
    """The story's opening ``words`` words, on one line: a passage for prompts that quote their input."""
    return " ".join(sample_text().split()[:words])

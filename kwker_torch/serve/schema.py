"""Pydantic models of the OpenAI request bodies the server accepts (chat completions, completions) and
OpenAI's error shape.

As OpenAI does: fields this server does not know are ignored; a known field of the wrong type or out of
range is a 400 naming the field (the handler in app.py turns pydantic's errors into OpenAI's shape).
Types are strict (``"5"`` is not a number, ``1`` is not a boolean), numbers may be ints or floats.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

_UNSUPPORTED: dict[str, Any] = {"functions": [], "function_call": None, "best_of": 1, "suffix": ""}
_INSTEAD = {"functions": " (send 'tools')", "function_call": " (send 'tool_choice')"}


class FieldError(ValueError):
    """A request value this server cannot take; ``param`` names the field at fault (an OpenAI error's ``param``).
    The endpoints answer it with a 400 carrying the message."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class _Strict(BaseModel):
    """Every request model: unknown fields ignored, known ones strictly typed (see the module doc)."""

    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Strict):
    include_usage: bool | None = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionSpec(_Strict):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema object; none: a function without arguments
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    reasoning_content: str | None = None  # an assistant's earlier reasoning (the template decides what it keeps)

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class _Sampling(_Strict):
    model: str
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = Field(default=1, ge=1, le=128)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    response_format: dict[str, Any] | None = None
    ignore_eos: bool | None = False  # (vLLM's extension) generate max_tokens tokens past end-of-sequence: benchmarks

    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    # Common extensions (vLLM, llama-server): Hugging Face's repetition penalty, top-k (0 or -1: off), min-p.
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)

    # OpenAI fields this server does not implement: accepted at their defaults (clients send them), refused
    # otherwise, so that a request never silently means something else than it says.
    functions: list[Any] | None = None
    function_call: Any = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("functions", "function_call", "best_of", "suffix")
    @classmethod
    def _unsupported(cls, value: Any, info: ValidationInfo) -> Any:
        name = info.field_name or ""
        default = _UNSUPPORTED[name]
        if value is not None and value != default:
            raise ValueError(f"{name} is not supported by this server{_INSTEAD.get(name, '')}; leave it out "
                             f"(or at {default!r})")  # fmt: skip
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not key.isdigit():
                raise ValueError(f"logit_bias keys are token ids written as strings (e.g. \"42\"), got {key!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias} for token {key}")
        return value

    @model_validator(mode="after")
    def _defaults_for_nulls(self) -> _Sampling:
        """OpenAI's nullable fields: an explicit null means the default."""
        for name, value in (("n", 1), ("stream", False), ("ignore_eos", False), ("logprobs", None), ("echo", False)):
            if name in type(self).model_fields and getattr(self, name) is None and value is not None:
                setattr(self, name, value)
        if getattr(self, "logprobs", 0) is None and isinstance(self, ChatCompletionRequest):
            self.logprobs = False
        return self

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Checked by reasoning.py / app.py, whose 400s say what is expected: template variables (an object),
    # OpenAI's reasoning effort, and how calls stream ("fragments", OpenAI's shape, or "whole").
    chat_template_kwargs: Any = None
    reasoning_effort: Any = None
    tool_call_stream: Any = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool | None = False


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:  # fmt: skip
    # A message may quote the request (a model's name): a lone surrogate there is written as its escape, so the
    # response still encodes as UTF-8 (it was a 500).
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}

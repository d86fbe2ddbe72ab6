"""Request and response models facing agents (OpenAI's shapes) and the gateway's own small APIs.

Agent-facing models accept unknown fields (``extra="allow"``): they are passed on to the upstream and
kept in the recorded raw body. Validation only rejects what no upstream could accept, so that a bad
request gets a clear 4xx here instead of an opaque upstream error.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from gateway.errors import ValidationFailedError

M = TypeVar("M", bound=BaseModel)
# Integers the gateway's own routes take stay in a signed 64-bit range: the JSON encoder (orjson)
# cannot write larger ones, and a version or index that large means nothing (found by the fuzzer:
# ``/admin/pause`` with ``version: 176790371284283719680`` was a 500).
MAX_INT = (1 << 62) - 1


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ChatMessage(_Open):
    role: str = Field(min_length=1, max_length=64)
    content: str | list[dict[str, JsonValue]] | None = None


class ChatCompletionRequest(_Open):
    model: str = Field(default="", max_length=512)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    n: int = Field(default=1, ge=1, le=128)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    tools: list[dict[str, JsonValue]] | None = None
    tool_choice: str | dict[str, JsonValue] | None = None
    response_format: dict[str, JsonValue] | None = None
    user: str | None = Field(default=None, max_length=256)
    metadata: dict[str, JsonValue] | None = None


class CompletionRequest(_Open):
    model: str = Field(default="", max_length=512)
    prompt: str | list[str] | list[int] | list[list[int]]
    stream: bool = False
    n: int = Field(default=1, ge=1, le=128)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    user: str | None = Field(default=None, max_length=256)
    metadata: dict[str, JsonValue] | None = None


class RewardRequest(BaseModel):
    """``POST /episodes/{id}/reward``: an agent-reported reward."""

    model_config = ConfigDict(extra="forbid")

    value: float = Field(allow_inf_nan=False)
    call_index: int | None = Field(default=None, ge=0, le=(1 << 31) - 1)  # the event log's Int32 call_seq
    message: str = Field(default="", max_length=8192)


class AglEventRequest(BaseModel):
    """``POST /episodes/{id}/agl/events``: an Agent Lightning agent's event (AGL 1.0's ``EventCreate``).

    Unknown fields are ignored, as AGL's model ignores them; ``data`` is opaque except for ``reward``.
    """

    event_type: str = Field(min_length=1, max_length=64)
    data: dict[str, JsonValue] = Field(default_factory=dict)


class FeedbackRequest(BaseModel):
    """``POST /v1/feedback``: production feedback on a session or one call."""

    model_config = ConfigDict(extra="forbid")

    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    call_id: str | None = Field(default=None, min_length=1, max_length=64)
    rating: int | None = Field(default=None, ge=-100, le=100)
    score: float | None = Field(default=None, allow_inf_nan=False)
    comment: str = Field(default="", max_length=8192)


class OpenEpisodeRequest(BaseModel):
    """``POST /admin/episodes``: open a training episode by hand (``flywheel episodes open``)."""

    model_config = ConfigDict(extra="forbid")

    episode_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    task_id: str | None = Field(default=None, min_length=1, max_length=256)
    group_id: str | None = Field(default=None, min_length=1, max_length=64)
    model: str | None = Field(default=None, max_length=256)
    mode: Literal["train", "val"] = "train"


class FinishEpisodeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: Literal["ok", "error", "timeout", "cancelled"] = "ok"
    reward: float | None = Field(default=None, allow_inf_nan=False)
    output: JsonValue = None
    error: str | None = Field(default=None, max_length=16384)


class PauseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int | None = Field(default=None, ge=0, le=MAX_INT)
    drain_timeout_s: float | None = Field(default=None, gt=0, le=3600)


class ResumeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int | None = Field(default=None, ge=0, le=MAX_INT)


def validate(model: type[M], data: Any) -> M:
    """``model.model_validate`` with pydantic's first error as a 422 in OpenAI's format."""
    if not isinstance(data, dict):
        raise ValidationFailedError("request body must be a JSON object", code="invalid_type")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        raise ValidationFailedError(
            f"{loc + ': ' if loc else ''}{err['msg']}", param=loc or None, code="invalid_value"
        ) from exc


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` describing a JSON body that the route reads raw (so the spec still shows it)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    schema = inline(schema)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}

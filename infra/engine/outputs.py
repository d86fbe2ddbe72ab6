"""What the engine hands back: per-step token events, finished choices, and its errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

PauseMode = Literal["abort", "wait", "keep"]
FinishReason = Literal["stop", "length", "abort"]


class EngineStepError(RuntimeError):
    """A model step raised; the requests in that step end with this error."""


@dataclass(frozen=True)
class TokenEvent:
    """One generated token of choice ``index``."""

    index: int
    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]]
    weight_version: int


@dataclass(frozen=True)
class ChoiceResult:
    """A finished choice: everything a response needs, ids and logprobs exactly as sampled."""

    index: int
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    weight_versions: list[int]
    text: str
    finish_reason: FinishReason
    stop_reason: str | int | None


@dataclass
class RequestUpdate:
    """What one engine step produced for one request: new tokens and the choices that finished."""

    tokens: list[TokenEvent] = field(default_factory=list)
    finished: list[ChoiceResult] = field(default_factory=list)


@dataclass(frozen=True)
class GenerationResult:
    request_id: str
    prompt_token_ids: list[int]
    choices: list[ChoiceResult]

"""The options of each built-in scorer, typed: ``ScorerSpec.options`` read through these models.

A task's ``scorer`` stays ``{"name", "ref", "options"}`` on the wire; the name selects the options
model (a union tagged by ``name``), which ``ScorerSpec`` validates when the task is parsed, so a typo
(``"tolerence"``) or a wrong type (``"tolerance": "small"``) is a bad task line at submit time instead
of an episode that fails to score later. A name no built-in knows keeps its options untyped (the
reward service answers it with ``UnknownScorer``).

Every scorer takes ``field`` (which key of the agent's output is its answer) and ``discount`` (the
per-call credit discount of this task's episodes).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue


class ScorerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    field: str | None = Field(default=None, max_length=256)
    discount: float | None = Field(default=None, ge=0.0, le=1.0)


class AgentOptions(ScorerOptions):
    fill: float | None = Field(default=None, allow_inf_nan=False)  # the reward when none was reported


class ExactOptions(ScorerOptions):
    answer: JsonValue = None  # default: the task's answer (a list: any of them)
    ignore_case: bool = False


class NumericOptions(ScorerOptions):
    answer: JsonValue = None
    tolerance: float = Field(default=1e-6, ge=0.0, allow_inf_nan=False)
    rel_tolerance: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)


class RegexOptions(ScorerOptions):
    pattern: str | None = None  # default: the task's answer
    ignore_case: bool = False
    full: bool = False  # the whole answer must match, not a part of it


class SqlOptions(ScorerOptions):
    db: str | None = None  # default: the task's metadata "db"
    gold: str | None = None  # default: the task's answer
    timeout_s: float = Field(default=5.0, gt=0.0, le=600.0)
    ordered: bool | Literal["auto"] = "auto"  # auto: in order when the gold query has ORDER BY


class ToolCallOptions(ScorerOptions):
    """The model's tool calls against accepted argument values (BFCL's ``possible_answer`` format): a list
    of ``{function_name: {parameter: [accepted values]}}``, one per expected call, in order; ``""`` among a
    parameter's accepted values lets it be left out."""

    answer: JsonValue = None  # default: the task's answer
    # partial credit: per expected call 1/2 for the right function, the rest shared by its parameters
    partial: bool = False


class FunctionOptions(ScorerOptions):
    model_config = ConfigDict(extra="allow", frozen=True)  # the user function's own options


class JudgeOptions(ScorerOptions):
    model: str | None = Field(default=None, max_length=256)
    max_tokens: int = Field(default=256, ge=1, le=32_768)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    criteria: str | None = Field(default=None, max_length=8192)
    mode: Literal["score", "rank"] = "score"  # rank: one ranking of a whole group


OPTIONS: dict[str, type[ScorerOptions]] = {
    "agent": AgentOptions,
    "exact": ExactOptions,
    "numeric": NumericOptions,
    "regex": RegexOptions,
    "sql": SqlOptions,
    "tool_call": ToolCallOptions,
    "function": FunctionOptions,
    "judge": JudgeOptions,
}

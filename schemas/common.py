"""Pieces shared by the event models: the event base, enums and small value types."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, PrivateAttr, ValidationError, model_validator

from schemas.ids import new_event_id
from schemas.scorers import OPTIONS, ScorerOptions

OptionsT = TypeVar("OptionsT", bound=ScorerOptions)

# Bump when an event's shape changes incompatibly, with a note here:
#   1 — first version.
SCHEMA_VERSION = 1


def utcnow() -> datetime:
    return datetime.now(UTC)


class EventBase(BaseModel):
    """Fields every event carries. Subclasses add ``type: Literal[...]`` as discriminator."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = SCHEMA_VERSION
    event_id: str = Field(default_factory=new_event_id, min_length=1, max_length=64)
    emitted_at: datetime = Field(default_factory=utcnow)
    producer: str = Field(default="", max_length=128, description="service that emitted the event")


class EpisodeSource(StrEnum):
    live = "live"  # a training rollout run by a worker
    production = "production"  # a deployed agent's session through the gateway
    replay = "replay"  # republished from the event log


class Mode(StrEnum):
    train = "train"
    val = "val"


class EpisodeStatus(StrEnum):
    ok = "ok"
    error = "error"
    timeout = "timeout"
    cancelled = "cancelled"


class AgentKind(StrEnum):
    command = "command"  # a subprocess: ``python my_agent.py ...``
    callable = "callable"  # ``package.module:function(task, llm)``
    kubernetes = "kubernetes"  # one Job per episode from a template


class AgentRef(BaseModel):
    """Which agent runs a task. ``spec`` is a command line, ``module:function`` or a Job template path."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: AgentKind
    spec: str = Field(min_length=1, max_length=4096)


class ScorerSpec(BaseModel):
    """How the reward service scores an episode of this task.

    ``name`` is one of: ``agent`` (agent-reported reward), ``exact``, ``numeric``, ``regex``, ``sql``,
    ``function`` (``ref`` = ``module:function``), ``judge``. ``options`` holds that scorer's parameters,
    checked against its options model (``schemas.scorers``) when the spec is parsed; read them typed
    with :meth:`options_as`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="agent", min_length=1, max_length=64)
    ref: str | None = Field(default=None, max_length=512)
    options: dict[str, JsonValue] = Field(default_factory=dict)
    _typed: ScorerOptions | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_options(self) -> ScorerSpec:
        kind = OPTIONS.get(self.name)
        if kind is not None:
            try:
                self._typed = kind.model_validate(self.options)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first.get("loc", ()))
                raise ValueError(
                    f"scorer {self.name!r}: options{'.' + where if where else ''}: {first['msg']}"
                ) from None
        return self

    def options_as(self, kind: type[OptionsT]) -> OptionsT:
        """The options as ``kind``: the named scorer's own model (parsed with the spec), or, for a name
        no built-in knows, the options ``kind`` has fields for (``ValueError`` when they do not fit)."""
        if isinstance(self._typed, kind):
            return self._typed
        known = (
            self.options
            if self._typed is not None
            else {k: v for k, v in self.options.items() if k in kind.model_fields}
        )
        try:
            return kind.model_validate(known)
        except ValidationError as exc:
            raise ValueError(f"scorer {self.name!r}: options do not fit {kind.__name__}: {exc}") from None


class Task(BaseModel):
    """A task as the user wrote it. ``input`` and ``answer`` are the user's own JSON."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str = Field(min_length=1, max_length=256)
    input: JsonValue = None
    answer: JsonValue = None
    scorer: ScorerSpec = Field(default_factory=ScorerSpec)
    metadata: dict[str, str] = Field(default_factory=dict)


class TokenLogprob(BaseModel):
    """One alternative in a top-k list."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    token_id: int | None = None
    token: str = ""
    logprob: float


Reward = Annotated[float, Field(allow_inf_nan=False)]

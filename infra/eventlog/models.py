"""Typed filters and results of event-log queries (what the CLI, the admin API and replay exchange)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StringConstraints, model_validator

# Bounds every filter's values are checked against at the API, before a query runs: an int limit
# (``1e6`` as a float is refused, not truncated), versions ≥ 0 within a signed 64-bit column, finite
# rewards, short strings and bounded id lists, so no request can ask the engine for an absurd plan.
MAX_LIMIT = 1_000_000
MAX_VERSION = (1 << 62) - 1
MAX_IDS = 10_000
Text = Annotated[str, StringConstraints(max_length=256)]
Version = Annotated[int, Field(ge=0, le=MAX_VERSION, strict=True)]
Reward = Annotated[float, Field(allow_inf_nan=False, ge=-1e12, le=1e12)]


class EpisodeFilter(BaseModel):
    """Which episodes: every field narrows; ``None`` means "any".

    ``since``/``until`` bound the time of the episode's events (half-open ``[since, until)``);
    ``min_weight_version``/``max_weight_version`` bound the oldest policy version that served it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    since: datetime | None = None
    until: datetime | None = None
    tenant: Text | None = None
    group_id: Text | None = None
    task_id: Text | None = None
    episode_ids: list[Text] | None = Field(default=None, max_length=MAX_IDS)
    source: Text | None = Field(default=None, description="live | production | replay")
    status: Text | None = Field(default=None, description="ok | error | timeout | cancelled")
    min_weight_version: Version | None = None
    max_weight_version: Version | None = None
    min_reward: Reward | None = None
    max_reward: Reward | None = None
    task_id_like: Text | None = Field(default=None, description="SQL LIKE pattern on task_id")
    limit: int = Field(default=100, ge=1, le=MAX_LIMIT, strict=True)
    offset: int = Field(
        default=0, ge=0, le=MAX_LIMIT, strict=True, description="summaries to skip (``episodes`` only)"
    )

    @model_validator(mode="after")
    def _ranges(self) -> EpisodeFilter:
        if self.since and self.until and self.since >= self.until:
            raise ValueError("since must be before until")
        if self.min_reward is not None and self.max_reward is not None and self.min_reward > self.max_reward:
            raise ValueError("min_reward must not exceed max_reward")
        if (
            self.min_weight_version is not None
            and self.max_weight_version is not None
            and self.min_weight_version > self.max_weight_version
        ):
            raise ValueError("min_weight_version must not exceed max_weight_version")
        return self


class CallFilter(BaseModel):
    """Which recorded LLM calls (for export)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    since: datetime | None = None
    until: datetime | None = None
    tenant: Text | None = None
    episode_ids: list[Text] | None = Field(default=None, max_length=MAX_IDS)
    source: Text | None = None
    min_weight_version: Version | None = None
    max_weight_version: Version | None = None
    token_faithful_only: bool = False
    limit: int | None = Field(default=None, ge=1, le=1 << 40, strict=True)


class EpisodeSummary(BaseModel):
    """One episode as the event log sees it."""

    model_config = ConfigDict(frozen=True)

    episode_id: str
    task_id: str
    group_id: str
    tenant: str
    source: str
    status: str
    started_at: datetime
    last_event_at: datetime
    num_calls: int
    num_transitions: int | None
    reward: float | None
    min_weight_version: int | None
    max_weight_version: int | None
    scored: bool


class EventRecord(BaseModel):
    """One stored event: its typed columns and its full JSON."""

    model_config = ConfigDict(frozen=True)

    event_id: str
    type: str
    topic: str
    emitted_at: datetime
    call_seq: int | None
    weight_version: int | None
    reward: float | None
    status: str
    payload: str


Bucket = Literal["minute", "hour", "day"]


class StatsPoint(BaseModel):
    """Scored episodes in one time bucket (``flywheel stats``)."""

    model_config = ConfigDict(frozen=True)

    bucket: datetime
    policy: str | None = Field(
        default=None,
        description="with a policy map, the policy (LoRA adapter); '' the base (added, optional)",
    )
    episodes: int
    mean_reward: float | None
    success_rate: float | None = Field(description="share of scored episodes with reward ≥ threshold")
    ok_rate: float = Field(description="share of episodes whose status is ok")
    mean_calls: float
    mean_transitions: float
    mean_weight_version: float | None
    max_weight_version: int | None
    production_sessions: int = Field(default=0, description="scored production sessions (added, optional)")
    feedback_rate: float | None = Field(
        default=None, description="share of those production sessions with user feedback (added, optional)"
    )
    thumbs_up_rate: float | None = Field(
        default=None,
        description="share of the sessions with feedback whose latest feedback is positive (added, optional)",
    )


class QueryResult(BaseModel):
    """A read-only query's answer; values are JSON-ready (timestamps as ISO strings)."""

    model_config = ConfigDict(frozen=True)

    columns: list[str]
    types: list[str]
    rows: list[list[JsonValue]]


class EventCounts(BaseModel):
    model_config = ConfigDict(frozen=True)

    total: int
    by_type: dict[str, int]


class TrainerStepPoint(BaseModel):
    """One ``TrainerStepCompleted`` as the training view reads it: the figures the step reported."""

    model_config = ConfigDict(frozen=True)

    step: int
    version: int
    at: datetime
    adapter: str = Field(description="the LoRA adapter the step trained; '' for the whole model")
    metrics: dict[str, float] = Field(description="StepMetrics as reported (absent figures absent)")
    samples: dict[str, int] = Field(description="transitions trained on, per episode source")


class VersionPoint(BaseModel):
    """Scored episodes (replays left out) of one policy weight version: the oldest that served them."""

    model_config = ConfigDict(frozen=True)

    weight_version: int
    episodes: int
    mean_reward: float | None
    success_rate: float | None
    mean_calls: float


class TenantFeedback(BaseModel):
    """Production sessions of one tenant and how many got user feedback (any time)."""

    model_config = ConfigDict(frozen=True)

    tenant: str
    sessions: int
    with_feedback: int
    feedback_rate: float
    thumbs_up_rate: float | None

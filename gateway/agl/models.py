"""The JSON shapes of Agent Lightning 1.0's server API, as its clients send and read them.

Written from AGL 1.0.2's documented API (``agentlightning/schemas.py``, ``docs/``): field names,
defaults and the rollout state machine are AGL's, so its controller, trainer and agents read these
answers unchanged. Unknown fields in a rollout's ``metadata`` are kept, as AGL keeps them; a status
patch with an unknown field is refused (422), as AGL refuses it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_ATTEMPT_ID = "0"


class RolloutState(StrEnum):
    QUEUING = "queuing"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


# queuing → running | failed; running → succeeded | failed; a terminal state is final.
TRANSITIONS: dict[RolloutState, frozenset[RolloutState]] = {
    RolloutState.QUEUING: frozenset({RolloutState.RUNNING, RolloutState.FAILED}),
    RolloutState.RUNNING: frozenset({RolloutState.SUCCEEDED, RolloutState.FAILED}),
    RolloutState.SUCCEEDED: frozenset(),
    RolloutState.FAILED: frozenset(),
}
TERMINAL = frozenset({RolloutState.SUCCEEDED, RolloutState.FAILED})


class Event(BaseModel):
    event_type: str
    rollout_id: str
    attempt_id: str
    timestamp: float
    data: dict[str, Any]


class EventCreate(BaseModel):
    event_type: str
    data: dict[str, Any] = Field(default_factory=dict)


class Model(BaseModel):
    """A model server endpoint (``…/v1``), keyed by (model, endpoint)."""

    model: str
    endpoint: str
    version: int = 0


class LocalConfig(BaseModel):
    agent_class: str | None = None
    env_map: dict[str, str] = Field(default_factory=dict)


class K8sConfig(BaseModel):
    job_template: str | None = None


class RolloutConfig(BaseModel):
    timeout_seconds: int = 3600
    local: LocalConfig | None = None
    k8s: K8sConfig | None = None


class RolloutMetadata(BaseModel):
    model_config = ConfigDict(extra="allow")

    batch_idx: int | None = None
    sample_idx_in_batch: int | None = None


class RolloutCreate(BaseModel):
    input: Any
    is_train: bool = True
    config: RolloutConfig | None = None
    metadata: RolloutMetadata | dict[str, Any] | None = None
    rollout_id: str | None = None


class LifecycleStatus(BaseModel):
    state: RolloutState = RolloutState.QUEUING
    k8s_job_name: str | None = None
    last_attempt_id: str | None = None
    error_message: str | None = None
    version: int = 1
    created_at: float
    updated_at: float


class StatusPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state: RolloutState | None = None
    k8s_job_name: str | None = None
    last_attempt_id: str | None = None
    error_message: str | None = None


class RolloutPatch(BaseModel):
    status: StatusPatch | None = None


class Rollout(BaseModel):
    rollout_id: str
    input: Any
    is_train: bool = True
    config: RolloutConfig
    metadata: RolloutMetadata = Field(default_factory=RolloutMetadata)
    status: LifecycleStatus


class RolloutDetail(BaseModel):
    rollout: Rollout
    attempts: list[str]


class TerminalItem(BaseModel):
    rollout_id: str
    state: RolloutState
    data_id: str
    is_train: bool


class TerminalPage(BaseModel):
    items: list[TerminalItem]
    next_after: int
    total_terminal: int


class PauseRequest(BaseModel):
    retry_after_seconds: int = 5
    reason: str | None = None


class PauseState(BaseModel):
    paused: bool
    retry_after_seconds: int
    reason: str | None
    inflight: int

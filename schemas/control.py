"""The events of ``flywheel.control`` (key: model): weight updates, trainer steps and pauses, prompt
versions. ``schemas.events`` puts them into the unions of every event."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.common import EpisodeSource, EventBase


class WeightUpdateRequested(EventBase):
    type: Literal["weight_update_requested"] = "weight_update_requested"
    model: str = "policy"
    version: int = Field(ge=0)
    checkpoint_path: str | None = None
    drain_timeout_s: float = Field(default=30.0, gt=0)


class InferenceDrained(EventBase):
    type: Literal["inference_drained"] = "inference_drained"
    model: str = "policy"
    version: int = Field(ge=0, description="the version being prepared")
    gateway_id: str
    waited_ms: float = 0.0
    timed_out: bool = False


class WeightsActivated(EventBase):
    type: Literal["weights_activated"] = "weights_activated"
    model: str = "policy"
    version: int = Field(ge=0)
    checkpoint_path: str | None = None


class InferenceResumed(EventBase):
    type: Literal["inference_resumed"] = "inference_resumed"
    model: str = "policy"
    version: int = Field(ge=0)
    gateway_id: str


class WeightUpdateFailed(EventBase):
    """A weight load failed; the previous version keeps serving and gateways resume on it."""

    type: Literal["weight_update_failed"] = "weight_update_failed"
    model: str = "policy"
    version: int = Field(ge=0)
    serving_version: int = Field(ge=0)
    error: str


class TrainerStepCompleted(EventBase):
    type: Literal["trainer_step_completed"] = "trainer_step_completed"
    model: str = "policy"
    step: int = Field(ge=0)
    version: int = Field(ge=0)
    metrics: dict[str, float] = Field(default_factory=dict)
    samples: dict[EpisodeSource, int] = Field(
        default_factory=dict,
        description="samples (transitions) this step trained on, per episode source (added, optional)",
    )


class TrainerPauseRequested(EventBase):
    """Ask the trainer to stop taking training steps (it keeps buffering episodes). ``flywheel trainer pause``."""

    type: Literal["trainer_pause_requested"] = "trainer_pause_requested"
    model: str = "policy"
    reason: str = Field(default="", max_length=1024)


class TrainerResumeRequested(EventBase):
    """Ask a paused trainer to take training steps again. ``flywheel trainer resume``."""

    type: Literal["trainer_resume_requested"] = "trainer_resume_requested"
    model: str = "policy"


class PromptComponent(BaseModel):
    """A named piece of the agent's prompt that Flywheel may replace, and the text that replaces it.

    ``match="system"``: a system (or developer) message whose text equals ``original``. ``match="span"``:
    a span the agent marked ``[[flywheel:<name>]]…[[/flywheel:<name>]]`` in any message or prompt
    (``original`` is then the marked text the optimiser started from).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    match: Literal["system", "span"] = "system"
    original: str = Field(max_length=65536)
    text: str = Field(max_length=65536)


class PromptVersionRequested(EventBase):
    """Make ``prompt_version`` the version gateways substitute from now on (None: the agent's own prompts).

    A gateway applies it to groups (episodes without a group) it has not served yet, so a GRPO group in
    flight keeps the version it started under, and answers with :class:`PromptVersionActivated`.
    """

    type: Literal["prompt_version_requested"] = "prompt_version_requested"
    model: str = "policy"
    prompt_version: str | None = Field(default=None, min_length=1, max_length=64)
    components: list[PromptComponent] = Field(default_factory=list, max_length=64)
    reason: str = Field(default="", max_length=1024)


class PromptVersionActivated(EventBase):
    """A gateway serves ``prompt_version`` to new groups from now on (its answer to the request)."""

    type: Literal["prompt_version_activated"] = "prompt_version_activated"
    model: str = "policy"
    prompt_version: str | None = None
    gateway_id: str
    request_id: str = Field(default="", description="the event_id of the PromptVersionRequested")


ControlEvent = Annotated[
    WeightUpdateRequested
    | InferenceDrained
    | WeightsActivated
    | InferenceResumed
    | WeightUpdateFailed
    | TrainerStepCompleted
    | TrainerPauseRequested
    | TrainerResumeRequested
    | PromptVersionRequested
    | PromptVersionActivated,
    Field(discriminator="type"),
]

"""The events of ``flywheel.control`` (key: model): weight updates, trainer steps and pauses, prompt
versions, releases. ``schemas.events`` puts them into the unions of every event."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from schemas.common import EpisodeSource, EventBase


class WeightUpdateRequested(EventBase):
    type: Literal["weight_update_requested"] = "weight_update_requested"
    model: str = "policy"
    version: int = Field(ge=0)
    checkpoint_path: str | None = None
    drain_timeout_s: float = Field(default=30.0, gt=0)
    adapter: str | None = Field(
        default=None, max_length=128, description="the LoRA adapter this is about; None: the base (added)"
    )


class InferenceDrained(EventBase):
    type: Literal["inference_drained"] = "inference_drained"
    model: str = "policy"
    version: int = Field(ge=0, description="the version being prepared")
    gateway_id: str
    waited_ms: float = 0.0
    timed_out: bool = False
    adapter: str | None = Field(
        default=None, max_length=128, description="the LoRA adapter this is about; None: the base (added)"
    )


class WeightsActivated(EventBase):
    type: Literal["weights_activated"] = "weights_activated"
    model: str = "policy"
    version: int = Field(ge=0)
    checkpoint_path: str | None = None
    adapter: str | None = Field(
        default=None, max_length=128, description="the LoRA adapter this is about; None: the base (added)"
    )


class InferenceResumed(EventBase):
    type: Literal["inference_resumed"] = "inference_resumed"
    model: str = "policy"
    version: int = Field(ge=0)
    gateway_id: str
    adapter: str | None = Field(
        default=None, max_length=128, description="the LoRA adapter this is about; None: the base (added)"
    )


class WeightUpdateFailed(EventBase):
    """A weight load failed; the previous version keeps serving and gateways resume on it."""

    type: Literal["weight_update_failed"] = "weight_update_failed"
    model: str = "policy"
    version: int = Field(ge=0)
    serving_version: int = Field(ge=0)
    error: str
    adapter: str | None = Field(
        default=None, max_length=128, description="the LoRA adapter this is about; None: the base (added)"
    )


class StepMetrics(BaseModel):
    """One training step's figures: ``TrainerStepCompleted.metrics``, ``status.json``, checkpoints.

    On the wire a flat ``{name: number}`` object of the figures the step reported (a figure it did not
    report is absent, never 0). The fields below are what the trainer reports for every step (the batch,
    the weight update, timings) and the policy-gradient figures most readers want; an algorithm's own
    figures (``sft_loss``, ``tis_mean``, ``value_loss``, verl's ``actor_*``, ...) are extra numbers,
    read with :meth:`get`.
    """

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, float] = Field(init=False)

    # the batch (trainer/batching.py)
    groups: float | None = None
    groups_zero_variance: float | None = None
    groups_partial: float | None = None
    episodes: float | None = None
    episodes_trained: float | None = None
    transitions: float | None = None
    reward: float | None = None
    success: float | None = None
    transitions_per_episode: float | None = None
    staleness_mean: float | None = None
    staleness_max: float | None = None
    replay_episodes: float | None = None
    production_episodes: float | None = None
    samples_live: float | None = None
    samples_production: float | None = None
    samples_replay: float | None = None
    # the step and its weight update (trainer/service.py)
    version: float | None = None
    serving_version: float | None = None
    gen_seconds: float | None = None
    step_seconds: float | None = None
    gen_fraction: float | None = None
    drain_ms: float | None = None
    load_ms: float | None = None
    gateways_missing: float | None = None
    weight_update_failed: float | None = None
    skipped_events: float | None = None
    groups_dropped: float | None = None
    tokens_per_s: float | None = None
    # the backend
    loss: float | None = None
    kl: float | None = None
    clip_fraction: float | None = None
    grad_norm: float | None = None
    train_seconds: float | None = None
    train_tokens_per_s: float | None = None

    @model_serializer(mode="wrap")
    def _reported_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, float]:
        return {k: v for k, v in handler(self).items() if v is not None}

    def get(self, name: str) -> float | None:
        """A figure by name, named field or extra; None when the step did not report it."""
        if name in type(self).model_fields:
            value: float | None = getattr(self, name)
            return value
        return (self.__pydantic_extra__ or {}).get(name)

    def as_dict(self) -> dict[str, float]:
        """The reported figures, name → value (the wire shape)."""
        return self.model_dump()

    def updated(self, figures: dict[str, float]) -> StepMetrics:
        """A copy with ``figures`` set (named or extra)."""
        return StepMetrics.model_validate({**self.as_dict(), **figures})


class TrainerStepCompleted(EventBase):
    type: Literal["trainer_step_completed"] = "trainer_step_completed"
    model: str = "policy"
    step: int = Field(ge=0)
    version: int = Field(ge=0)
    metrics: StepMetrics = Field(default_factory=StepMetrics)
    samples: dict[EpisodeSource, int] = Field(
        default_factory=dict,
        description="samples (transitions) this step trained on, per episode source (added, optional)",
    )
    adapter: str | None = Field(
        default=None,
        max_length=128,
        description="the LoRA adapter (policy) this step trained; version is then the adapter's. None: "
        "the whole model (added, optional)",
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


# ------------------------------------------------------------------------------------ releases
# Which version serves production (docs/operating.md, "Releasing versions"): the trainer proposes
# candidates, gates evaluate them, an operator or a rule promotes, rolls back or pins. A gateway serves
# production calls at the version the last of these events left ("served"), training rollouts at the
# trainer's latest. ``infra/releases.py`` folds them into a ``ReleaseBook``.


class VersionProposed(EventBase):
    """The trainer kept version ``version`` as a release candidate, its weights at ``checkpoint_path``."""

    type: Literal["version_proposed"] = "version_proposed"
    model: str = "policy"
    adapter: str | None = Field(default=None, max_length=128, description="the LoRA adapter; None: the base")
    version: int = Field(ge=1)
    checkpoint_path: str = Field(min_length=1, max_length=4096)
    step: int = Field(default=0, ge=0)


class VersionEvaluated(EventBase):
    """A candidate's gates: ``passed`` and why (``rule``: the first rule it failed, or ``all``)."""

    type: Literal["version_evaluated"] = "version_evaluated"
    model: str = "policy"
    adapter: str | None = Field(default=None, max_length=128)
    version: int = Field(ge=0)
    passed: bool
    rule: str = Field(default="", max_length=1024)
    figures: dict[str, float] = Field(default_factory=dict, description="the candidate's guard metrics")
    served_figures: dict[str, float] = Field(
        default_factory=dict, description="the served version's, measured in the same evaluation"
    )
    decided_by: str = Field(default="gate", max_length=256)


class VersionPromoted(EventBase):
    """``version`` serves production from the next call on (``previous``: what served before)."""

    type: Literal["version_promoted"] = "version_promoted"
    model: str = "policy"
    adapter: str | None = Field(default=None, max_length=128)
    version: int = Field(ge=0)
    previous: int | None = Field(default=None, ge=0)
    decided_by: str = Field(min_length=1, max_length=256, description="an operator (cli:NAME) or a rule")
    reason: str = Field(default="", max_length=1024)
    figures: dict[str, float] = Field(default_factory=dict)


class VersionRolledBack(EventBase):
    """``version`` stops serving production; ``to`` serves from the next call on."""

    type: Literal["version_rolled_back"] = "version_rolled_back"
    model: str = "policy"
    adapter: str | None = Field(default=None, max_length=128)
    version: int = Field(ge=0, description="the version taken out of service")
    to: int = Field(ge=0)
    decided_by: str = Field(min_length=1, max_length=256)
    reason: str = Field(default="", max_length=1024)
    figures: dict[str, float] = Field(default_factory=dict)


class VersionPinned(EventBase):
    """Production stays on ``version`` (None: unpinned); no rule promotes or rolls back while pinned."""

    type: Literal["version_pinned"] = "version_pinned"
    model: str = "policy"
    adapter: str | None = Field(default=None, max_length=128)
    version: int | None = Field(default=None, ge=0)
    decided_by: str = Field(min_length=1, max_length=256)
    reason: str = Field(default="", max_length=1024)


class VersionCanary(EventBase):
    """A share of production sessions (sticky per session) goes to ``version``; ``share`` 0 ends the canary."""

    type: Literal["version_canary"] = "version_canary"
    model: str = "policy"
    adapter: str | None = Field(default=None, max_length=128)
    version: int = Field(ge=0)
    share: float = Field(
        ge=0.0, lt=1.0, description="the share of new production sessions; 0: the canary ends"
    )
    decided_by: str = Field(min_length=1, max_length=256)
    reason: str = Field(default="", max_length=1024)
    figures: dict[str, float] = Field(default_factory=dict)


ReleaseEvent = (
    VersionProposed | VersionEvaluated | VersionPromoted | VersionRolledBack | VersionPinned | VersionCanary
)
RELEASE_EVENTS = (
    VersionProposed,
    VersionEvaluated,
    VersionPromoted,
    VersionRolledBack,
    VersionPinned,
    VersionCanary,
)


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
    | PromptVersionActivated
    | VersionProposed
    | VersionEvaluated
    | VersionPromoted
    | VersionRolledBack
    | VersionPinned
    | VersionCanary,
    Field(discriminator="type"),
]

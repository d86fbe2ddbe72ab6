"""Topic names, keys, partition counts and the codec, defined once.

Code always uses the logical names below; a bus maps them to physical names by prepending its
prefix (``FLYWHEEL_TOPIC_PREFIX``), so tests and tenants of one broker never see each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, TypeAdapter, ValidationError

from schemas.control import (
    ControlEvent,
    InferenceDrained,
    InferenceResumed,
    PromptVersionActivated,
    PromptVersionRequested,
    TrainerPauseRequested,
    TrainerResumeRequested,
    TrainerStepCompleted,
    VersionCanary,
    VersionEvaluated,
    VersionPinned,
    VersionPromoted,
    VersionProposed,
    VersionRolledBack,
    WeightsActivated,
    WeightUpdateFailed,
    WeightUpdateRequested,
)
from schemas.events import (
    AglRecorded,
    AnyEvent,
    DeadLetter,
    EpisodeEvent,
    EpisodeFinished,
    EpisodeScored,
    EpisodeStarted,
    Event,
    LLMCallRecorded,
    RewardReported,
)
from schemas.spans import AgentSpansRecorded
from schemas.tasks import RolloutCancelled, RolloutRequested, TaskEvent

TASKS = "flywheel.tasks"
EPISODES = "flywheel.episodes"
TRANSITIONS = "flywheel.transitions"
CONTROL = "flywheel.control"
DEADLETTER = "flywheel.deadletter"
AGL = "flywheel.agl"  # Agent Lightning state served by ``flywheel agl-server`` (added, optional)
# The reward service's changelog (reward_service/changelog.py): its partition p holds the state of the
# episodes of flywheel.episodes' partition p, so it has as many partitions (added, optional).
REWARD_STATE = "flywheel.reward-state"
REWARD_STATE_RETENTION_MS = 8 * 24 * 3600 * 1000  # the default feedback window (7 days) and a day


RewardStateEvent = Annotated[
    EpisodeStarted | LLMCallRecorded | RewardReported | EpisodeFinished | EpisodeScored,
    Field(discriminator="type"),
]
"""What the reward service's changelog holds (``REWARD_STATE``)."""


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    key_field: str
    partitions: int
    event_types: frozenset[type[AnyEvent]]
    configs: tuple[tuple[str, str], ...] = ()  # Kafka topic configs set when the bus creates it


_EPISODE_PARTITIONS = 16

TOPICS: dict[str, TopicSpec] = {
    TASKS: TopicSpec(TASKS, "task_id", 8, frozenset({RolloutRequested, RolloutCancelled})),
    EPISODES: TopicSpec(
        EPISODES,
        "episode_id",
        _EPISODE_PARTITIONS,
        frozenset({EpisodeStarted, LLMCallRecorded, RewardReported, EpisodeFinished, AgentSpansRecorded}),
    ),
    TRANSITIONS: TopicSpec(TRANSITIONS, "group_id", 8, frozenset({EpisodeScored})),
    CONTROL: TopicSpec(
        CONTROL,
        "model",
        1,
        frozenset(
            {
                WeightUpdateRequested,
                InferenceDrained,
                WeightsActivated,
                InferenceResumed,
                WeightUpdateFailed,
                TrainerStepCompleted,
                TrainerPauseRequested,
                TrainerResumeRequested,
                PromptVersionRequested,
                PromptVersionActivated,
                VersionProposed,
                VersionEvaluated,
                VersionPromoted,
                VersionRolledBack,
                VersionPinned,
                VersionCanary,
            }
        ),
    ),
    DEADLETTER: TopicSpec(DEADLETTER, "original key", 1, frozenset({DeadLetter})),
    AGL: TopicSpec(AGL, "scope", 8, frozenset({AglRecorded})),
    # Every episode event the reward service kept, then its EpisodeScored (without transitions) as the
    # "scored" marker; not compacted: the records of one episode share its key (see the module above).
    REWARD_STATE: TopicSpec(
        REWARD_STATE,
        "episode_id",
        _EPISODE_PARTITIONS,
        frozenset({EpisodeStarted, LLMCallRecorded, RewardReported, EpisodeFinished, EpisodeScored}),
        (("cleanup.policy", "delete"), ("retention.ms", str(REWARD_STATE_RETENTION_MS))),
    ),
}


def tasks_topic(pool: str | None = None) -> str:
    """``flywheel.tasks`` or ``flywheel.tasks.<pool>`` for a named worker pool."""
    return TASKS if not pool else f"{TASKS}.{pool}"


def spec_for(topic: str) -> TopicSpec:
    """The spec of a logical topic; ``flywheel.tasks.<pool>`` shares the tasks spec."""
    if topic in TOPICS:
        return TOPICS[topic]
    if topic.startswith(TASKS + "."):
        return TopicSpec(topic, "task_id", TOPICS[TASKS].partitions, TOPICS[TASKS].event_types)
    raise UnknownTopicError(topic)


def key_for(event: AnyEvent) -> str:
    """The partition key docs/architecture.md gives for ``event``."""
    field = _KEY_FIELD.get(type(event))
    if field is not None:  # every publish asks: one dict lookup instead of up to 16 class patterns
        return getattr(event, field)  # type: ignore[no-any-return]
    match event:
        case RolloutRequested():
            return event.task.task_id
        case RolloutCancelled():
            return event.task_id
        case (
            EpisodeStarted() | LLMCallRecorded() | RewardReported() | EpisodeFinished() | AgentSpansRecorded()
        ):
            return event.episode_id
        case EpisodeScored():
            return event.group_id
        case (
            WeightUpdateRequested()
            | InferenceDrained()
            | WeightsActivated()
            | InferenceResumed()
            | WeightUpdateFailed()
            | TrainerStepCompleted()
            | TrainerPauseRequested()
            | TrainerResumeRequested()
            | PromptVersionRequested()
            | PromptVersionActivated()
            | VersionProposed()
            | VersionEvaluated()
            | VersionPromoted()
            | VersionRolledBack()
            | VersionPinned()
            | VersionCanary()
        ):
            return event.model
        case DeadLetter():
            return event.key or ""
    raise TypeError(f"not an event: {type(event).__name__}")


# The events whose key is one of their own string fields (the rest: the ``match`` in ``key_for``).
_KEY_FIELD: dict[type, str] = {
    RolloutCancelled: "task_id",
    EpisodeStarted: "episode_id",
    LLMCallRecorded: "episode_id",
    RewardReported: "episode_id",
    EpisodeFinished: "episode_id",
    AgentSpansRecorded: "episode_id",
    EpisodeScored: "group_id",
    WeightUpdateRequested: "model",
    InferenceDrained: "model",
    WeightsActivated: "model",
    InferenceResumed: "model",
    WeightUpdateFailed: "model",
    TrainerStepCompleted: "model",
    TrainerPauseRequested: "model",
    TrainerResumeRequested: "model",
    PromptVersionRequested: "model",
    PromptVersionActivated: "model",
    VersionProposed: "model",
    VersionEvaluated: "model",
    VersionPromoted: "model",
    VersionRolledBack: "model",
    VersionPinned: "model",
    VersionCanary: "model",
    AglRecorded: "scope",
}


def topic_for(event: AnyEvent) -> str:
    """The logical topic an event belongs on (tasks go to the default pool)."""
    for spec in TOPICS.values():
        if type(event) in spec.event_types:
            return spec.name
    raise TypeError(f"not an event: {type(event).__name__}")


class UnknownTopicError(KeyError):
    pass


class EventDecodeError(ValueError):
    """A message that is not valid JSON, not a known event, or not an event of its topic."""

    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(f"cannot decode message on {topic}: {reason}")
        self.topic = topic
        self.reason = reason


_EVENT = TypeAdapter[AnyEvent](Event)
_PER_TOPIC: dict[str, TypeAdapter[AnyEvent]] = {
    TASKS: TypeAdapter(TaskEvent),
    EPISODES: TypeAdapter(EpisodeEvent),
    TRANSITIONS: TypeAdapter(EpisodeScored),
    CONTROL: TypeAdapter(ControlEvent),
    DEADLETTER: TypeAdapter(DeadLetter),
    AGL: TypeAdapter(AglRecorded),
    REWARD_STATE: TypeAdapter(RewardStateEvent),
}


def encode(event: AnyEvent) -> bytes:
    return event.model_dump_json().encode()


def decode(topic: str, data: bytes | str) -> AnyEvent:
    """Parse and validate one message of logical ``topic``; raises :class:`EventDecodeError`."""
    base = TASKS if topic.startswith(TASKS + ".") else topic
    adapter = _PER_TOPIC.get(base, _EVENT)
    try:
        return adapter.validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {"msg": str(exc), "loc": ()}
        loc = ".".join(str(p) for p in first.get("loc", ()))
        raise EventDecodeError(topic, f"{first['msg']}" + (f" at {loc}" if loc else "")) from exc


def decode_any(data: bytes | str) -> AnyEvent:
    """Parse any event regardless of topic (used by the recorder and the fixtures test)."""
    try:
        return _EVENT.validate_json(data)
    except ValidationError as exc:
        raise EventDecodeError("*", str(exc.errors()[0]["msg"])) from exc

"""The AsyncAPI document of Flywheel's topics and events (``flywheel topics asyncapi``).

faststream writes it: one Kafka channel per logical topic of ``schemas.TOPICS``, its message the topic's
discriminated union of events (the JSON schema pydantic gives them). The buses themselves use aiokafka
directly (``infra/bus/kafka.py`` says why); the broker here is never connected.

``docs/asyncapi.json`` is this document as committed; a test regenerates it and compares, so a changed
event that is not written down fails CI.
"""

from __future__ import annotations

import json
from typing import Any

from schemas.control import ControlEvent
from schemas.events import AglRecorded, DeadLetter, EpisodeEvent, EpisodeScored
from schemas.tasks import TaskEvent
from schemas.topics import (
    AGL,
    CONTROL,
    DEADLETTER,
    EPISODES,
    REWARD_STATE,
    TASKS,
    TOPICS,
    TRANSITIONS,
    RewardStateEvent,
)

SERVER = "127.0.0.1:9092"  # `flywheel kafka start`'s default; FLYWHEEL_KAFKA_BOOTSTRAP names the real one

# what travels on each topic, in a line; the events, key and partitions come from schemas.TOPICS
PURPOSE: dict[str, tuple[str, Any]] = {
    TASKS: ("Rollouts requested of the rollout workers (flywheel.tasks.<pool> for a named pool).", TaskEvent),
    EPISODES: (
        "What happened in each episode: its start and end, every LLM call, its rewards.",
        EpisodeEvent,
    ),
    TRANSITIONS: ("Scored episodes, for the trainer.", EpisodeScored),
    CONTROL: ("Weight updates, trainer steps and pauses, prompt versions.", ControlEvent),
    DEADLETTER: ("Messages a consumer could not handle, with the error.", DeadLetter),
    AGL: ("Agent Lightning state served by `flywheel agl-server`.", AglRecorded),
    REWARD_STATE: (
        "The reward service's changelog: the episode events it kept and an EpisodeScored without"
        " transitions per (re-)score; partition p holds the state of flywheel.episodes' partition p"
        " (reward_service/changelog.py).",
        RewardStateEvent,
    ),
}


def document(version: str) -> dict[str, Any]:
    """The AsyncAPI 3.0 document of every topic, for Flywheel ``version``."""
    # Here, not at the top: faststream takes ~0.4 s to import, and the module that imports this one
    # (flywheel/cli/ops_cmd.py) also runs `flywheel healthcheck`, every few seconds under compose.
    from faststream.kafka import KafkaBroker
    from faststream.specification import AsyncAPI

    if set(PURPOSE) != set(TOPICS):  # a topic added to schemas.TOPICS must be described here
        raise ValueError(f"topics without an AsyncAPI channel: {sorted(set(TOPICS) ^ set(PURPOSE))}")
    broker = KafkaBroker(SERVER)
    for name, spec in TOPICS.items():
        purpose, union = PURPOSE[name]
        events = ", ".join(sorted(e.__name__ for e in spec.event_types))
        broker.publisher(
            name,
            title=name,
            description=(
                f"{purpose} Events: {events}. Key: {spec.key_field}; partitions: {spec.partitions}. "
                "The physical topic is FLYWHEEL_TOPIC_PREFIX + this name."
            ),
            schema=union,
        )
    written = AsyncAPI(
        broker,
        title="Flywheel",
        version=version,
        description="The topics Flywheel's services talk over, and the events on each (JSON values).",
        schema_version="3.0.0",
    ).to_specification()
    return dict(written.to_jsonable())


def render(version: str) -> str:
    """The document as sorted, indented JSON: what ``docs/asyncapi.json`` holds."""
    return json.dumps(document(version), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

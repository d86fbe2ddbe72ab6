"""Worker + gateway + reward service on both buses (in-process and real Kafka), one shared test: a group
of callable-agent rollouts (real ``openai`` SDK over HTTP) and a retried failure reach ``EpisodeScored``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from flywheel.stack import EmbeddedStack
from schemas import (
    TASKS,
    TRANSITIONS,
    AgentKind,
    AgentRef,
    EpisodeScored,
    EpisodeStatus,
    RolloutRequested,
    Task,
)
from tests.fakes.stacks import fake_model_stack
from tests.unit.worker.collect import Events

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def stack(
    bus_kind: str, topic_prefix: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[EmbeddedStack]:
    kafka = request.getfixturevalue("kafka_bootstrap") if bus_kind == "kafka" else None
    async with fake_model_stack(tmp_path, kafka=kafka, topic_prefix=topic_prefix, concurrency=8) as s:
        yield s


async def test_group_and_retry_reach_episode_scored(stack: EmbeddedStack) -> None:
    bus = stack.buses[0]
    events = await Events().attach(bus, TRANSITIONS, group="flow")
    agent = AgentRef(kind=AgentKind.callable, spec="examples.agents_for_tests.callable_agent:run_sync")
    for i in range(4):
        await bus.publish(
            TASKS,
            RolloutRequested(
                task=Task(task_id="t", input={"calls": 2, "reward": float(i)}),
                agent=agent,
                group_id="grp",
                group_size=4,
                sample_index=i,
            ),
        )
    broken = AgentRef(kind=AgentKind.callable, spec="examples.agents_for_tests.async_callables:broken")
    await bus.publish(
        TASKS, RolloutRequested(task=Task(task_id="b"), agent=broken, group_id="gb", max_attempts=2)
    )
    scored: list[EpisodeScored] = await events.wait_for(EpisodeScored, count=6, within_s=40)
    group = sorted((s for s in scored if s.group_id == "grp"), key=lambda s: s.sample_index)
    assert [s.reward for s in group] == [0.0, 1.0, 2.0, 3.0]
    assert all(len(s.transitions) == 1 and s.transitions[0].call_seqs == [0, 1] for s in group)
    failed = sorted((s for s in scored if s.group_id == "gb"), key=lambda s: s.attempt)
    assert [(s.attempt, s.superseded, s.status) for s in failed] == [
        (0, True, EpisodeStatus.error),
        (1, False, EpisodeStatus.error),
    ]
    assert all(s.unusable_reason == "no_calls" for s in failed)
    await events.stop()

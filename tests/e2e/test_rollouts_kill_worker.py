"""Kill a worker mid-episode (real Kafka, the worker a separate `flywheel worker` process): its tasks are
redelivered to another worker and run as new episodes, the dead episodes are closed as superseded, and
the group completes exactly once — nothing is lost."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from flywheel.stack import EmbeddedStack
from schemas import EPISODES, TRANSITIONS, EpisodeScored, EpisodeStarted, EpisodeStatus, LLMCallRecorded
from tests.fakes.stacks import fake_model_stack
from tests.unit.worker.collect import Events

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]
FLYWHEEL = str(Path(sys.executable).parent / "flywheel")


@pytest.fixture
async def stack(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> AsyncIterator[EmbeddedStack]:
    async with fake_model_stack(
        tmp_path,
        kafka=kafka_bootstrap,
        topic_prefix=topic_prefix,
        concurrency=4,
        abandon_grace_s=0.0,
        run_worker=False,  # the test starts its own: a `flywheel worker` to kill, then a rescuer
    ) as s:
        yield s


async def flywheel(stack: EmbeddedStack, *args: str, log: Path) -> asyncio.subprocess.Process:
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        return await asyncio.create_subprocess_exec(
            FLYWHEEL,
            *args,
            # a wide batch window: the doomed worker takes both rollouts of the group in one batch
            env={**os.environ, **stack.env(), "FLYWHEEL_LOG_LEVEL": "DEBUG", "FLYWHEEL_BATCH_WAIT_S": "1.0"},
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # the worker and its agents form one group we can kill at once
        )


async def test_killed_worker_loses_nothing(stack: EmbeddedStack, tmp_path: Path) -> None:
    events = await Events().attach(stack.buses[0], EPISODES, TRANSITIONS, group="e2e")
    doomed = await flywheel(stack, "worker", "--concurrency", "4", log=tmp_path / "worker-a.log")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        json.dumps({"task_id": "slow", "input": {"calls": 3, "pause": 1.0, "reward": 1.0}}) + "\n"
    )
    submit = await flywheel(
        stack,
        "tasks",
        "submit",
        str(tasks),
        "--agent",
        "examples.agents_for_tests.callable_agent:run",
        "--n",
        "2",
        "--deadline",
        "10",
        log=tmp_path / "submit.log",
    )
    assert await submit.wait() == 0, (tmp_path / "submit.log").read_text()
    first = await events.wait_for(EpisodeStarted, count=2, within_s=40)
    dead = {e.episode_id for e in first}
    await events.wait(lambda e: isinstance(e, LLMCallRecorded) and e.episode_id in dead, within_s=20)
    os.killpg(doomed.pid, signal.SIGKILL)  # mid-episode: no EpisodeFinished, no offset commit
    await doomed.wait()
    assert not events.of(EpisodeScored)

    await stack.add_worker("rescuer")  # joins the group; Kafka hands it the uncommitted tasks
    scored: list[EpisodeScored] = await events.wait_for(EpisodeScored, count=4, within_s=60)
    live = [s for s in scored if not s.superseded]
    gone = [s for s in scored if s.superseded]
    assert sorted(s.sample_index for s in live) == [0, 1]  # the group completes exactly once
    assert len({s.group_id for s in scored}) == 1
    assert all(s.episode_id not in dead and s.reward == 1.0 and s.status is EpisodeStatus.ok for s in live)
    assert all(len(s.transitions) == 1 and s.transitions[0].call_seqs == [0, 1, 2] for s in live)
    assert {s.episode_id for s in gone} == dead  # the dead episodes are accounted for, not lost
    assert all(s.status is EpisodeStatus.cancelled for s in gone)
    await events.stop()

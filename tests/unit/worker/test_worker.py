"""The worker on the in-process bus: episodes open and finish, retries, cancellation, hand-back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from infra.bus.memory import MemoryBus
from rollout_worker.service import RolloutWorker
from rollout_worker.settings import WorkerSettings
from schemas import (
    DEADLETTER,
    EPISODES,
    TASKS,
    AgentKind,
    AgentRef,
    DeadLetter,
    EpisodeFinished,
    EpisodeStarted,
    EpisodeStatus,
    RolloutCancelled,
    RolloutRequested,
    Task,
    is_valid_episode_id,
)
from tests.unit.worker.collect import Events

MOD = "examples.agents_for_tests.async_callables"


def request(fn: str, *, task_id: str = "t1", group: str = "g1", idx: int = 0, **kw: Any) -> RolloutRequested:
    return RolloutRequested(
        task=Task(task_id=task_id, input=kw.pop("input", None)),
        agent=AgentRef(kind=AgentKind.callable, spec=f"{MOD}:{fn}"),
        group_id=group,
        sample_index=idx,
        **kw,
    )


@pytest.fixture
async def env() -> AsyncIterator[tuple[MemoryBus, Events]]:
    async with MemoryBus() as bus:
        events = await Events().attach(bus, EPISODES, TASKS, DEADLETTER)
        yield bus, events
        await events.stop()


def settings(**kw: object) -> WorkerSettings:
    base: dict[str, object] = {"gateway_url": "http://gw:8000/", "worker_id": "w1", "batch_wait_s": 0.01}
    return WorkerSettings(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.timeout(15)
async def test_group_of_rollouts_open_and_finish(env: tuple[MemoryBus, Events]) -> None:
    bus, events = env
    worker = RolloutWorker(bus, settings(concurrency=4))
    await worker.start()
    for i in range(6):
        await bus.publish(TASKS, request("instant", idx=i, group_size=6, input={"i": i}))
    finished = await events.wait_for(EpisodeFinished, count=6)
    started = events.of(EpisodeStarted)
    assert len(started) == 6
    assert {s.sample_index for s in started} == set(range(6))
    for s in started:
        assert is_valid_episode_id(s.episode_id) and s.group_size == 6 and s.task is not None
        assert s.deadline_at is not None and s.agent is not None
    for f in finished:
        assert f.status is EpisodeStatus.ok and f.reported_reward == 1.0 and not f.superseded
        assert f.output["base_url"] == f"http://gw:8000/episodes/{f.episode_id}/v1"
        assert f.group_id == "g1" and f.task_id == "t1"
    assert {f.episode_id for f in finished} == {s.episode_id for s in started}
    assert worker.stats.finished == {"ok": 6}
    await worker.stop()


@pytest.mark.timeout(15)
async def test_failed_attempts_are_retried_as_new_episodes(env: tuple[MemoryBus, Events]) -> None:
    bus, events = env
    worker = RolloutWorker(bus, settings())
    await worker.start()
    await bus.publish(TASKS, request("broken", max_attempts=3))
    finished = await events.wait_for(EpisodeFinished, count=3)
    assert [f.attempt for f in finished] == [0, 1, 2]
    assert [f.superseded for f in finished] == [True, True, False]
    assert all(f.status is EpisodeStatus.error and "always fails" in (f.error or "") for f in finished)
    assert len({f.episode_id for f in finished}) == 3
    assert [r.attempt for r in events.of(RolloutRequested)] == [0, 1, 2]
    await worker.stop()


@pytest.mark.timeout(15)
async def test_timeout_and_unknown_agent(env: tuple[MemoryBus, Events]) -> None:
    bus, events = env
    worker = RolloutWorker(bus, settings())
    await worker.start()
    await bus.publish(TASKS, request("sleepy", deadline_s=0.2))
    await bus.publish(TASKS, request("does_not_exist", task_id="t2"))
    done = await events.wait_for(EpisodeFinished, count=2)
    by_task = {f.task_id: f for f in done}
    assert by_task["t1"].status is EpisodeStatus.timeout
    assert by_task["t2"].status is EpisodeStatus.error and "no attribute" in (by_task["t2"].error or "")
    await worker.stop()


@pytest.mark.timeout(15)
async def test_cancel_stops_running_group(env: tuple[MemoryBus, Events]) -> None:
    bus, events = env
    worker = RolloutWorker(bus, settings())
    await worker.start()
    for i in range(2):
        await bus.publish(TASKS, request("sleepy", idx=i, group="gc"))
    await bus.publish(TASKS, request("instant", task_id="other", group="keep"))
    await events.wait_for(EpisodeStarted, count=3)
    await bus.publish(TASKS, RolloutCancelled(task_id="t1", group_id="gc", reason="test"))
    done = await events.wait_for(EpisodeFinished, count=3)
    cancelled = [f for f in done if f.group_id == "gc"]
    assert len(cancelled) == 2 and all(f.status is EpisodeStatus.cancelled for f in cancelled)
    await worker.stop()


@pytest.mark.timeout(15)
async def test_stop_hands_back_running_episodes(env: tuple[MemoryBus, Events]) -> None:
    bus, events = env
    worker = RolloutWorker(bus, settings())
    await worker.start()
    await bus.publish(TASKS, request("sleepy"))
    [started] = await events.wait_for(EpisodeStarted)
    await worker.stop(drain_timeout_s=0.1)
    [fin] = await events.wait_for(EpisodeFinished)
    assert fin.episode_id == started.episode_id
    assert fin.status is EpisodeStatus.cancelled and fin.superseded
    requests = await events.wait_for(RolloutRequested, count=2)
    assert requests[1].attempt == 0 and requests[1].event_id != requests[0].event_id
    # Another worker picks the handed-back request up.
    other = RolloutWorker(bus, settings(worker_id="w2"))
    await other.start()
    await events.wait_for(EpisodeStarted, count=2)
    await other.stop(drain_timeout_s=0.1)


@pytest.mark.timeout(15)
async def test_concurrency_runs_episodes_in_parallel(env: tuple[MemoryBus, Events]) -> None:
    bus, events = env
    worker = RolloutWorker(bus, settings(concurrency=8))
    await worker.start()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for i in range(8):
        await bus.publish(TASKS, request("sleepy", task_id=f"t{i}", input={"sleep": 0.5}))
    await events.wait_for(EpisodeFinished, count=8)
    assert loop.time() - t0 < 2.5  # 8 × 0.5 s run side by side, not one after another
    await worker.stop()


@pytest.mark.timeout(15)
async def test_task_missing_fields_goes_to_deadletter(env: tuple[MemoryBus, Events]) -> None:
    bus, events = env
    worker = RolloutWorker(bus, settings())
    await worker.start()
    await bus.publish_raw(TASKS, b'{"type": "rollout_requested", "group_id": "g"}', key="k")
    await bus.publish(TASKS, request("instant"))
    [dead] = await events.wait_for(DeadLetter, consumer_group="rollout-workers")
    assert dead.original_topic == TASKS and "task" in dead.error
    await events.wait_for(EpisodeFinished)  # the worker carried on
    await worker.stop()

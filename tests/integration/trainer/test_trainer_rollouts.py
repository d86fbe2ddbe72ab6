"""The trainer's own rollout requests: at most K groups in flight, group_size requests per group."""

from __future__ import annotations

from itertools import count
from pathlib import Path

import pytest

from infra.bus.base import Message
from schemas import TASKS, TRANSITIONS, AgentKind, AgentRef, RolloutRequested, Task
from tests.fakes.events import Collector
from trainer.curriculum import SignalCurriculum
from trainer.rollouts import RolloutPlanner

from .trainer_harness import (
    FakeEngine,
    FakeGateway,
    InProcessSink,
    MemoryBus,
    group_events,
    make_trainer,
    run_steps,
)


@pytest.mark.timeout(30)
async def test_planner_keeps_k_groups_in_flight() -> None:
    async with MemoryBus() as bus:
        seen = await Collector().attach(bus, TASKS)
        tasks = iter([Task(task_id=f"t{i}", input={"q": i}) for i in range(4)])
        agent = AgentRef(kind=AgentKind.callable, spec="examples.x:agent")
        planner = RolloutPlanner(bus, tasks, agent, group_size=3, deadline_s=30)
        assert await planner.top_up(2, version=5) == 2
        assert await planner.top_up(2, version=5) == 0  # already 2 in flight
        reqs = await seen.wait_for(lambda e: isinstance(e, RolloutRequested), count=6)
        by_group: dict[str, list[RolloutRequested]] = {}
        for r in reqs:
            by_group.setdefault(r.group_id, []).append(r)
        assert len(by_group) == 2
        for group in by_group.values():
            assert sorted(r.sample_index for r in group) == [0, 1, 2]
            assert {r.group_size for r in group} == {3} and len({r.task_id for r in group}) == 1
        assert set(planner.in_flight.values()) == {5}
        planner.finished(next(iter(by_group)))
        assert await planner.top_up(2, version=6) == 1
        assert await planner.top_up(4, version=6) == 1  # the iterator ran out after 4 tasks
        assert planner.exhausted and len(planner.in_flight) == 3
        await seen.stop()


@pytest.mark.timeout(60)
async def test_async_keeps_k_groups_in_flight_while_it_trains(tmp_path: Path) -> None:
    """The groups a step takes are replaced before the step trains, not after it."""
    async with MemoryBus() as bus:
        gw = await FakeGateway().attach(bus)
        engine = FakeEngine()
        service, backend = make_trainer(
            tmp_path, bus, [InProcessSink(engine.load_weights)], mode="async", batch_groups=2, max_in_flight=5
        )
        tasks = (Task(task_id=f"t{i}") for i in count())
        agent = AgentRef(kind=AgentKind.callable, spec="examples.x:agent")
        planner = RolloutPlanner(bus, tasks, agent, group_size=2, deadline_s=30)
        service.planner = planner

        async def worker(msg: Message) -> None:  # a rollout worker that finishes every episode at once
            req = msg.event
            assert isinstance(req, RolloutRequested)
            await bus.publish(TRANSITIONS, group_events(req.group_id, [1.0, 0.0])[req.sample_index])

        sub = await bus.subscribe(TASKS, "fake-worker", worker)
        in_flight_at_step: list[int] = []
        backend.on_step = lambda: in_flight_at_step.append(len(planner.in_flight))
        await service.start()
        await run_steps(service, 3)
        assert in_flight_at_step == [5, 5, 5]  # was K − B = 3 while each step trained
        await service.stop(checkpoint=False)
        await sub.stop()
        await gw.stop()


@pytest.mark.timeout(90)
async def test_the_curriculum_requests_fewer_groups_without_signal(tmp_path: Path) -> None:
    """Odd tasks split their group (signal), even ones are solved by every episode (none): with the
    curriculum the trainer's own requests revisit the odd ones, and fewer of its batches train nothing."""

    async def run(curriculum: SignalCurriculum | None, directory: Path) -> tuple[list[str], int]:
        async with MemoryBus() as bus:
            gw = await FakeGateway().attach(bus)
            service, _ = make_trainer(
                directory,
                bus,
                [InProcessSink(FakeEngine().load_weights)],
                mode="async",
                batch_groups=1,
                max_in_flight=1,
            )
            tasks = (Task(task_id=f"t{i}") for i in count())
            agent = AgentRef(kind=AgentKind.callable, spec="examples.x:agent")
            service.planner = RolloutPlanner(
                bus, tasks, agent, group_size=2, deadline_s=30, curriculum=curriculum
            )
            requested: list[str] = []

            async def worker(msg: Message) -> None:
                req = msg.event
                assert isinstance(req, RolloutRequested)
                if req.sample_index == 0:
                    requested.append(req.task.task_id)
                rewards = [1.0, 0.0] if int(req.task.task_id[1:]) % 2 else [1.0, 1.0]
                scored = group_events(req.group_id, rewards, version=service.backend.version)  # fresh
                await bus.publish(TRANSITIONS, scored[req.sample_index])

            sub = await bus.subscribe(TASKS, "fake-worker", worker)
            await service.start()
            await run_steps(service, 12)
            flat = service.batches_without_signal
            await service.stop(checkpoint=False)
            await sub.stop()
            await gw.stop()
        return requested, flat

    plain, plain_flat = await run(None, tmp_path / "plain")
    chosen, chosen_flat = await run(
        SignalCurriculum(iter(Task(task_id=f"t{i}") for i in count()), revisit=1.0, max_visits=4),
        tmp_path / "curriculum",
    )
    share = lambda ids: sum(int(t[1:]) % 2 for t in ids) / len(ids)  # noqa: E731
    print(f"CURRICULUM plain {share(plain):.2f} ({plain_flat} flat batches), "
          f"curriculum {share(chosen):.2f} ({chosen_flat} flat batches)")  # fmt: skip
    assert share(plain) == pytest.approx(0.5, abs=0.1)
    assert share(chosen) >= 0.7, chosen
    assert chosen_flat < plain_flat, (chosen_flat, plain_flat)

"""The trainer service end to end on the in-process bus: steps, weight events, failures, pause, resume."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from schemas import (
    CONTROL,
    TRANSITIONS,
    TrainerPauseRequested,
    TrainerResumeRequested,
    TrainerStepCompleted,
    WeightsActivated,
    WeightUpdateFailed,
    WeightUpdateRequested,
)
from tests.fakes.waiting import wait_until
from trainer.weights import InProcessSink, WeightUpdate

from .trainer_harness import (
    Collector,
    FakeEngine,
    FakeGateway,
    MemoryBus,
    group_events,
    make_trainer,
    publish,
    run_steps,
)


@pytest.mark.timeout(60)
async def test_trains_groups_and_runs_the_weight_protocol(tmp_path: Path) -> None:
    async with MemoryBus() as bus:
        events = await Collector().attach(bus, CONTROL)
        gw = await FakeGateway().attach(bus)
        engine = FakeEngine()
        service, backend = make_trainer(tmp_path, bus, [InProcessSink(engine.load_weights)])
        await service.start()
        await publish(bus, group_events("g1", [1.0, 0.0]))
        await bus.publish_raw(TRANSITIONS, b"not json", key="g1")  # dead-lettered by the bus
        no_calls = group_events("g2", [1.0, 0.0])[0].model_copy(update={"transitions": [], "num_calls": 0})
        await publish(bus, [no_calls, group_events("g2", [1.0, 0.0])[1]])
        await publish(bus, group_events("flat", [1.0, 1.0]))  # zero variance: no step
        await run_steps(service, 2)
        steps = await events.wait_for(lambda e: isinstance(e, TrainerStepCompleted), count=2)
        assert [s.version for s in steps] == [1, 2]
        activated = await events.wait_for(lambda e: isinstance(e, WeightsActivated), count=2)
        assert [a.version for a in activated] == [1, 2]
        assert engine.loaded == [1, 2]
        # g2's member without transitions still counts toward the group and its baseline
        assert sorted(backend.trained, key=len) == [{"g2-e1-a0"}, {"g1-e0-a0", "g1-e1-a0"}]
        m = steps[-1].metrics.as_dict()
        for key in (
            "reward",
            "success",
            "transitions_per_episode",
            "staleness_mean",
            "kl",
            "clip_fraction",
            "tokens_per_s",
            "gen_seconds",
            "train_seconds",
            "drain_ms",
            "load_ms",
        ):
            assert key in m, key
        assert gw.version == 2 and not gw.paused
        status = (tmp_path / "trainer" / "status.json").read_text()
        assert '"version": 2' in status
        await service.stop()
        await gw.stop()
        await events.stop()


@pytest.mark.timeout(60)
async def test_failed_load_keeps_the_old_version_serving(tmp_path: Path) -> None:
    async with MemoryBus() as bus:
        events = await Collector().attach(bus, CONTROL)
        gw = await FakeGateway().attach(bus)
        engine = FakeEngine(fail=True)
        service, backend = make_trainer(tmp_path, bus, [InProcessSink(engine.load_weights)])
        await service.start()
        await publish(bus, group_events("g1", [1.0, 0.0]))
        await run_steps(service, 1)
        [failed] = await events.wait_for(lambda e: isinstance(e, WeightUpdateFailed))
        assert failed.version == 1 and failed.serving_version == 0 and "shape mismatch" in failed.error
        assert not events.of(WeightsActivated)
        assert service.weights.serving_version == 0 and backend.version == 1
        assert service.last_metrics.weight_update_failed == 1.0
        await asyncio.sleep(0)  # let the gateway see the failure
        await events.wait_for(lambda e: type(e).__name__ == "InferenceResumed")
        assert gw.version == 0 and not gw.paused
        # training goes on; the next update succeeds once the engine accepts
        engine.fail = False
        await publish(bus, group_events("g2", [0.0, 1.0]))
        await run_steps(service, 1)
        [ok] = await events.wait_for(lambda e: isinstance(e, WeightsActivated))
        assert ok.version == 2 and engine.loaded == [2]
        await service.stop()
        await gw.stop()
        await events.stop()


@pytest.mark.timeout(60)
async def test_missing_gateway_is_reported_not_waited_on(tmp_path: Path) -> None:
    async with MemoryBus() as bus:
        gw = await FakeGateway().attach(bus)
        service, _ = make_trainer(tmp_path, bus, [], expected_gateways=2, drain_timeout_s=0.2)
        await service.start()
        await publish(bus, group_events("g1", [1.0, 0.0]))
        await run_steps(service, 1, within_s=20)
        assert service.last_metrics.gateways_missing == 1.0
        assert service.weights.serving_version == 1
        await service.stop()
        await gw.stop()


@pytest.mark.timeout(60)
async def test_sync_mode_holds_inference_during_training_async_does_not(tmp_path: Path) -> None:
    for mode, expect_paused in (("sync", True), ("async", False)):
        async with MemoryBus() as bus:
            events = await Collector().attach(bus, CONTROL)
            gw = await FakeGateway().attach(bus)
            service, backend = make_trainer(tmp_path / mode, bus, [], mode=mode)
            seen: list[bool] = []
            backend.on_step = lambda: seen.append(gw.paused)  # noqa: B023
            await service.start()
            await publish(bus, group_events("g1", [1.0, 0.0]))
            await run_steps(service, 1)
            assert seen == [expect_paused], mode
            kinds = [type(e).__name__ for e in events.events if not type(e).__name__.startswith("Inference")]
            req = kinds.index("WeightUpdateRequested")
            assert kinds.index("WeightsActivated") > req
            # sync: the request (gateways hold) comes before the step; async: the update follows it
            assert (kinds.index("TrainerStepCompleted") > req) is expect_paused
            await service.stop()
            await gw.stop()
            await events.stop()


@pytest.mark.timeout(60)
async def test_pause_and_resume_through_control_events(tmp_path: Path) -> None:
    async with MemoryBus() as bus:
        events = await Collector().attach(bus, CONTROL)
        service, _ = make_trainer(tmp_path, bus, [], expected_gateways=0)
        await service.start()
        await bus.publish(CONTROL, TrainerPauseRequested(reason="test"))
        await events.wait_for(lambda e: isinstance(e, TrainerPauseRequested))
        await wait_until(lambda: service.paused)
        await publish(bus, group_events("g1", [1.0, 0.0]))
        runner = asyncio.create_task(service.run(max_steps=1))
        await asyncio.sleep(0.5)
        assert not events.of(TrainerStepCompleted) and not runner.done()
        assert '"paused": true' in (tmp_path / "trainer" / "status.json").read_text()
        await bus.publish(CONTROL, TrainerResumeRequested())
        await asyncio.wait_for(runner, 20)
        await events.wait_for(lambda e: isinstance(e, TrainerStepCompleted))
        assert [type(e) for e in events.events].count(WeightUpdateRequested) == 1
        # a pause outlives a restart: the new trainer stays paused until it hears a resume
        await bus.publish(CONTROL, TrainerPauseRequested(reason="maintenance"))
        await wait_until(lambda: service.paused)
        await service.stop()
        service, _ = make_trainer(tmp_path, bus, [], expected_gateways=0)
        await service.start()
        assert service.paused and service.status().pause_reason == "maintenance"
        await publish(bus, group_events("g2", [1.0, 0.0]))
        runner = asyncio.create_task(service.run(max_steps=1))
        await asyncio.sleep(0.7)
        assert service.paused and len(events.of(TrainerStepCompleted)) == 1
        await bus.publish(CONTROL, TrainerResumeRequested())
        await asyncio.wait_for(runner, 20)
        assert len(events.of(TrainerStepCompleted)) == 2
        assert '"paused": false' in (tmp_path / "trainer" / "status.json").read_text()
        await service.stop()
        await events.stop()


@pytest.mark.timeout(60)
async def test_deadline_trains_a_partial_group_and_bad_episodes_are_counted(tmp_path: Path) -> None:
    async with MemoryBus() as bus:
        service, backend = make_trainer(tmp_path, bus, [], expected_gateways=0, group_timeout_s=0.5)
        await service.start()
        partial = group_events("slow", [1.0, 0.0, 1.0, 0.0])[:2]  # 2 of 4 ever arrive
        out_of_vocab = group_events("bad", [1.0])[0].model_copy(
            update={
                "transitions": [
                    group_events("x", [1.0])[0].transitions[0].model_copy(update={"response_ids": [999, 5]})
                ]
            }
        )
        await publish(bus, [*partial, out_of_vocab, partial[0]])  # the last one is a redelivery
        await run_steps(service, 1, within_s=20)
        assert backend.trained == [{"slow-e0-a0", "slow-e1-a0"}]
        assert service.last_metrics.groups_partial == 1.0
        registry = service.metrics.registry
        for reason in ("malformed:token_out_of_vocab", "duplicate_event"):
            value = registry.get_sample_value("flywheel_trainer_skipped_events_total", {"reason": reason})
            assert value == 1.0, reason
        await service.stop()


class PathSink:
    """A server-like sink: it needs a file and records what it was given."""

    name = "path-sink"
    needs_path = True

    def __init__(self) -> None:
        self.paths: list[Path] = []

    async def load(self, update: WeightUpdate) -> None:
        assert update.path is not None and update.path.is_file()
        self.paths.append(update.path)


@pytest.mark.timeout(60)
async def test_sinks_that_need_a_path_get_an_exported_weights_file(tmp_path: Path) -> None:
    async with MemoryBus() as bus:
        sink = PathSink()
        service, _ = make_trainer(tmp_path, bus, [sink], expected_gateways=0, checkpoint_every=100)
        await service.start()
        for i in range(4):
            await publish(bus, group_events(f"g{i}", [1.0, 0.0]))
        await run_steps(service, 4)
        assert [p.parent.name for p in sink.paths] == ["v000001", "v000002", "v000003", "v000004"]
        assert sorted(p.name for p in (tmp_path / "trainer" / "exports").iterdir()) == [
            "v000002",
            "v000003",
            "v000004",
        ]
        await service.stop()


@pytest.mark.timeout(60)
async def test_async_updates_copy_tensors_only_for_sinks_that_read_them(tmp_path: Path) -> None:
    """Path sinks load the exported file: no in-memory copy; an in-process sink gets its version's."""
    from safetensors.torch import load_file

    async with MemoryBus() as bus:
        sink = PathSink()
        service, backend = make_trainer(
            tmp_path / "a", bus, [sink], expected_gateways=0, checkpoint_every=100
        )
        copies = 0
        real_state_dict = backend.state_dict

        def counting_state_dict() -> Any:
            nonlocal copies
            copies += 1
            return real_state_dict()

        backend.state_dict = counting_state_dict  # type: ignore[method-assign]
        await service.start()
        for i in range(2):
            await publish(bus, group_events(f"a{i}", [1.0, 0.0]))
        await run_steps(service, 2)
        await service.stop()
        assert len(sink.paths) == 2 and copies == 0

    async with MemoryBus() as bus:
        received: list[tuple[int, dict[str, Any]]] = []

        async def load(weights: Any, version: int) -> None:
            received.append((version, {k: v.clone() for k, v in weights.items()}))

        sink = PathSink()
        service, backend = make_trainer(
            tmp_path / "b", bus, [InProcessSink(load), sink], expected_gateways=0, checkpoint_every=100
        )
        await service.start()
        for i in range(3):
            await publish(bus, group_events(f"b{i}", [1.0, 0.0]))
        await run_steps(service, 3)
        await service.stop()
        assert [v for v, _ in received] == [1, 2, 3]
        for (_, tensors), path in zip(received, sink.paths, strict=True):
            exported = load_file(str(path))  # the file of the same version holds the same weights
            assert all(bool((tensors[k] == exported[k]).all()) for k in exported)

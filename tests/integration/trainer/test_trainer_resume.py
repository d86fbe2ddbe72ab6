"""Kill and restart: the trainer resumes from its checkpoint, trains nothing twice, versions continue."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas import CONTROL, DEADLETTER, TRANSITIONS, TrainerStepCompleted, WeightsActivated
from tests.fakes.waiting import wait_until
from tests.kafka_fixtures import MakeBus
from trainer.checkpoints import CheckpointStore
from trainer.weights import InProcessSink

from .trainer_harness import (
    Collector,
    FakeEngine,
    FakeGateway,
    group_events,
    make_trainer,
    publish,
    run_steps,
)


@pytest.mark.timeout(120)
async def test_restart_resumes_without_training_twice(tmp_path: Path, make_bus: MakeBus) -> None:
    """Runs on the in-process bus and (marked ``kafka``) on the live broker."""
    g1, g2 = group_events("g1", [1.0, 0.0]), group_events("g2", [0.0, 1.0])
    g3 = group_events("g3", [1.0, 0.0], version=2)
    # ---- first life: two steps, then half of g3 arrives, then the process dies (no stop, no final save)
    bus = await make_bus()
    await bus.ensure_topics([TRANSITIONS, CONTROL, DEADLETTER])
    gw = await FakeGateway().attach(bus)
    first, backend1 = make_trainer(tmp_path, bus, [], seed=0)
    await first.start()
    await publish(bus, g1 + g2)
    await run_steps(first, 2)
    await publish(bus, g3[:1])
    await wait_until(lambda: first.intake.pending_groups == 1)  # g3's first half reached the inbox
    assert first.intake.pending_groups == 1
    saved = CheckpointStore(tmp_path / "trainer").latest()
    assert saved is not None and saved.meta.version == 2 and saved.meta.step == 2
    assert set(saved.meta.consumed_groups) == {"g1", "g2"}
    weights_at_kill = {k: v.clone() for k, v in backend1.model.state_dict().items()}
    await gw.stop()
    await first.stop(checkpoint=False)  # the process dies: no final checkpoint, no inbox rewrite
    # ---- second life: a fresh process; the broker redelivers everything (as after lost commits)
    bus = await make_bus()
    events = await Collector().attach(bus, CONTROL, group="second-life")
    gw = await FakeGateway().attach(bus)
    engine = FakeEngine()
    second, backend2 = make_trainer(tmp_path, bus, [InProcessSink(engine.load_weights)], seed=1)
    await second.start()
    assert backend2.version == 2 and second.step == 2
    for k, v in backend2.model.state_dict().items():
        assert (v == weights_at_kill[k]).all(), k
    assert engine.loaded == [2]  # the resumed weights are pushed to the engine first
    await publish(bus, g1 + g2 + g3)  # redelivery of everything, g3's first half included
    await run_steps(second, 1)
    assert backend2.trained == [{"g3-e0-a0", "g3-e1-a0"}]
    [step] = await events.wait_for(lambda e: isinstance(e, TrainerStepCompleted) and e.step == 3)
    assert step.version == 3
    await events.wait_for(lambda e: isinstance(e, WeightsActivated) and e.version == 3)
    versions = [e.version for e in events.of(WeightsActivated)]
    assert versions[-2:] == [2, 3]  # on Kafka the topic still holds the first life's [1, 2] before
    assert second.intake.skipped["group_consumed"] == 4
    assert second.intake.skipped["duplicate_event"] == 1  # g3's first half: inbox + redelivery
    await second.stop()
    assert CheckpointStore(tmp_path / "trainer").latest().meta.version == 3  # type: ignore[union-attr]
    assert (tmp_path / "trainer" / "inbox.jsonl").read_text() == ""
    await gw.stop()
    await events.stop()

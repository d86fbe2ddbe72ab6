"""``objective="sft"``: cross-entropy on the episodes that pass the threshold, completion tokens only."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas import CONTROL, EpisodeStatus, TrainerStepCompleted
from tests.unit.trainer.helpers import episode, transition

from .trainer_harness import Collector, FakeGateway, MemoryBus, make_trainer, publish, run_steps


@pytest.mark.timeout(60)
async def test_sft_trains_on_successes_only_and_an_all_success_group_counts(tmp_path: Path) -> None:
    """Regression (issue 15): SFT got the GRPO batch — failures in, all-success groups out."""
    merged = transition([1, 2], [4, 5, 6, 7], mask=[1, 0, 0, 1])  # observation tokens 5, 6
    mixed = [episode("mixed", 0, 1.0, transitions=[merged]), episode("mixed", 1, 0.0)]
    all_ok = [episode("ok", 0, 1.0), episode("ok", 1, 1.0)]
    errored = episode("err", 0, 1.0, group_size=1, status=EpisodeStatus.error)
    async with MemoryBus() as bus:
        events = await Collector().attach(bus, CONTROL)
        gw = await FakeGateway().attach(bus)
        service, backend = make_trainer(tmp_path, bus, [], batch_groups=3, objective="sft")
        await service.start()
        await publish(bus, [*mixed, *all_ok, errored])
        await run_steps(service, 1)
        [step] = await events.wait_for(lambda e: isinstance(e, TrainerStepCompleted))
        assert backend.trained == [{"mixed-e0-a0", "ok-e0-a0", "ok-e1-a0"}]
        assert service.batches_without_signal == 0
        [samples] = backend.sft_samples
        [row] = [s for s in samples if s.episode_id == "mixed-e0-a0"]
        weights = row.token_rows(0)[0]
        assert weights[1] == weights[2] == 0.0 and weights[0] > 0 and weights[3] > 0
        assert step.metrics.as_dict()["sft_loss"] > 0 and step.metrics.as_dict()["grad_norm"] > 0
        assert step.metrics.as_dict()["success"] == pytest.approx(3 / 5)
        assert service.status().samples["live"] == 3
        await service.stop()
        await gw.stop()
        await events.stop()

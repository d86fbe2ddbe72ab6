"""Production sessions (groups of one) through the trainer service: they train, with a running baseline."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas import CONTROL, EpisodeScored, EpisodeSource, TrainerStepCompleted
from tests.unit.trainer.helpers import transition
from trainer.checkpoints import CheckpointStore

from .trainer_harness import Collector, FakeGateway, MemoryBus, make_trainer, publish, run_steps


def session(i: int, reward: float | None, *, tenant: str = "acme", version: int = 0) -> EpisodeScored:
    """A production session as the reward service publishes it: its own group of one."""
    eid = f"sess-{i}"
    return EpisodeScored(
        episode_id=eid,
        group_id=eid,
        group_size=1,
        source=EpisodeSource.production,
        tenant=tenant,
        reward=reward,
        reward_source="feedback" if reward is not None else "unscored",
        transitions=[transition([1, 2, 3], [4 + i % 3, 5], version=version, reward=reward or 0.0)],
        num_calls=1,
    )


@pytest.mark.timeout(60)
async def test_three_production_sessions_train_with_nonzero_advantages(tmp_path: Path) -> None:
    """Regression (issue 15): rewards 1, 0, 1 as production sessions gave 0 training samples."""
    async with MemoryBus() as bus:
        events = await Collector().attach(bus, CONTROL)
        gw = await FakeGateway().attach(bus)
        service, backend = make_trainer(tmp_path, bus, [], batch_groups=3)
        seen: list[dict[str, float]] = []
        backend.on_batch = lambda batch: seen.append({s.episode_id: s.advantage for s in batch.samples})
        await service.start()
        await publish(bus, [session(0, 1.0), session(1, 0.0), session(2, 1.0), session(3, None)])
        await run_steps(service, 1)
        [step] = await events.wait_for(lambda e: isinstance(e, TrainerStepCompleted))
        assert backend.trained == [{"sess-0", "sess-1", "sess-2"}]
        [advs] = seen
        assert len(advs) == 3 and all(a != 0.0 for a in advs.values())
        assert advs["sess-0"] == advs["sess-2"] > 0 > advs["sess-1"]
        assert step.samples == {EpisodeSource.live: 0, EpisodeSource.production: 3, EpisodeSource.replay: 0}
        assert step.metrics.as_dict()["grad_norm"] > 0
        assert service.intake.skipped["no_reward"] == 1  # no feedback, no scorer: counted, not trained
        status = service.status()
        assert status.samples == {"live": 0, "production": 3, "replay": 0}
        # the running baseline of (tenant, scorer) is saved with the checkpoint
        saved = CheckpointStore(tmp_path / "trainer").latest()
        assert saved is not None
        assert saved.meta.baselines["acme|feedback"]["mean"] == pytest.approx(2 / 3)
        assert saved.meta.samples["production"] == 3
        await service.stop()
        await gw.stop()
        await events.stop()
        # ---- a restarted trainer restores the baseline, so one lone session has signal at once
        resumed, backend2 = make_trainer(tmp_path, bus, [], batch_groups=1)
        await resumed.start()
        assert resumed.baselines.stats["acme|feedback"].mean == pytest.approx(2 / 3)
        assert resumed.samples_trained["production"] == 3
        await publish(bus, [session(9, 0.0)])
        await run_steps(resumed, 1)
        assert backend2.trained == [{"sess-9"}]
        assert resumed.status().samples["production"] == 4
        await resumed.stop()


@pytest.mark.timeout(60)
async def test_production_sessions_ride_along_with_live_groups_however_stale(tmp_path: Path) -> None:
    from .trainer_harness import group_events

    async with MemoryBus() as bus:
        gw = await FakeGateway().attach(bus)
        service, backend = make_trainer(tmp_path, bus, [], batch_groups=1)
        await service.start()
        # two production sessions wait; a live group completes: one step takes all of them
        await publish(bus, [session(0, 1.0), session(1, 0.0)])
        await publish(bus, group_events("g1", [1.0, 0.0]))
        await run_steps(service, 1)
        trained = set().union(*backend.trained)
        assert {"sess-0", "sess-1", "g1-e0-a0", "g1-e1-a0"} <= trained
        assert service.status().samples == {"live": 2, "production": 2, "replay": 0}
        # a session generated ten versions ago trains too (stale_policy="weight": corrected, not dropped)
        backend._version = 10
        await publish(bus, [session(5, 1.0, version=0), session(6, 0.0, version=9)])
        await run_steps(service, 1)
        assert backend.trained[-1] == {"sess-5", "sess-6"}
        assert not service.status().excluded
        await service.stop()
        await gw.stop()

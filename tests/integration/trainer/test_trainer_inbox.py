"""The trainer's inbox: scored episodes are durable before their offsets are committed, in batches."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infra.bus.memory import MemoryBus
from schemas import CONTROL, DEADLETTER, TRANSITIONS, EpisodeScored
from tests.fakes.waiting import wait_until
from trainer import checkpoints

from .trainer_harness import group_events, make_trainer, publish

pytestmark = pytest.mark.timeout(60)


async def test_a_burst_of_episodes_is_written_with_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsyncs: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        fsyncs.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(checkpoints.os, "fsync", counting_fsync)
    async with MemoryBus() as bus:
        await bus.ensure_topics([TRANSITIONS, CONTROL, DEADLETTER])
        service, _ = make_trainer(tmp_path, bus, [], inbox_fsync=True, intake_wait_s=0.05)
        await service.start()
        try:
            burst = group_events("g1", [1.0, 0.0, 1.0, 0.0]) + group_events("g2", [0.0, 1.0, 0.0, 1.0])
            await publish(bus, burst)
            inbox = tmp_path / "trainer" / "inbox.jsonl"
            await wait_until(lambda: inbox.exists() and len(inbox.read_text().splitlines()) == len(burst))
            lines = inbox.read_text().splitlines()
            written = {EpisodeScored.model_validate_json(line).episode_id for line in lines}
            assert written == {e.episode_id for e in burst}
            assert 1 <= len(fsyncs) < len(burst)  # one per delivered batch, not one per episode
        finally:
            await service.stop(checkpoint=False)

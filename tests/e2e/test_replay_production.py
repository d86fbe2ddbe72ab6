"""Replaying production traffic end to end: rated production sessions from ClickHouse into a fresh trainer.

Recording: the real inference engine samples six answers from a tiny model; each is one tenant's
production session (a group of one), rated up or down by its user (reward 1 or 0, ``reward_source=
feedback``), beside one live training group. The real recorder writes them to embedded ClickHouse.

Replay: ``flywheel.replay`` selects the production sessions only (``source=production``) and republishes
them as ``source=replay`` with ``recorded_source=production``. A fresh real trainer takes each as a
production session — alone, with its advantage against the tenant's running baseline — whether the
replay sends everything at once or paces it (one session = one unit of a step). Before this, a replayed
session was a group of one with no GRPO signal: a paced replay skipped it and an unpaced one trained
nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner, Result

import schemas as s
from flywheel.cli.main import app
from flywheel.replay import Pace, ReplayFilter, ReplayReport, replay
from infra.bus.base import Message
from infra.bus.memory import MemoryBus
from infra.eventlog.recorder import Recorder
from infra.eventlog.store import ChdbStore
from tests.e2e.test_replay import CORPUS, MODEL_CACHE, _fresh_trainer_settings
from tests.fakes.waiting import wait_until

if TYPE_CHECKING:
    from trainer.service import TrainerService

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

RATINGS = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]  # thumbs up / down, in the order the sessions were rated
LIVE = 4
KEY = "acme|feedback"  # trainer.baselines.baseline_key: tenant | reward source


def _transition(
    prompt: list[int], token_ids: list[int], logprobs: list[float], reward: float
) -> s.Transition:
    return s.Transition(
        prompt_ids=prompt,
        response_ids=token_ids,
        response_mask=[1] * len(token_ids),
        behaviour_logprobs=logprobs,
        weight_version=0,
        call_seqs=[0],
        reward=reward,
    )


async def _record(model: Path, store: ChdbStore) -> None:
    """Six rated production sessions of tenant acme and one live group, through the real recorder."""
    from infra.engine import InferenceEngine
    from infra.engine.sampling import SamplingParams

    engine = InferenceEngine.from_pretrained(model, threads=1, model_name="policy")
    text = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 4 plus 3?"}], add_generation_prompt=True, tokenize=False
    )
    prompt = list(engine.tokenizer.encode(text, add_special_tokens=False))
    params = SamplingParams(n=len(RATINGS) + LIVE, temperature=1.5, max_tokens=12, logprobs=0, seed=11)
    bus = MemoryBus()
    await bus.start()
    recorder = Recorder(bus, store, max_wait_s=0.05)
    await recorder.start()
    start = datetime.now(UTC) - timedelta(minutes=5)
    try:
        choices = (await engine.complete(prompt, params)).choices
        events: list[s.EpisodeScored] = []
        for i, (choice, reward) in enumerate(zip(choices, RATINGS, strict=False)):
            eid = s.new_episode_id()
            events.append(
                s.EpisodeScored(
                    emitted_at=start + timedelta(seconds=i),  # the order they were rated in
                    episode_id=eid,
                    group_id=eid,  # a production session is a group of one
                    source=s.EpisodeSource.production,
                    tenant="acme",
                    reward=reward,
                    reward_source="feedback",
                    num_calls=1,
                    transitions=[_transition(prompt, choice.token_ids, choice.logprobs, reward)],
                )
            )
        group = s.new_group_id()
        for i, choice in enumerate(choices[len(RATINGS) :]):
            events.append(
                s.EpisodeScored(
                    emitted_at=start + timedelta(seconds=len(RATINGS) + i),
                    episode_id=s.new_episode_id(),
                    group_id=group,
                    group_size=LIVE,
                    task_id="live-task",
                    sample_index=i,
                    reward=float(i % 2),
                    reward_source="exact",
                    num_calls=1,
                    transitions=[_transition(prompt, choice.token_ids, choice.logprobs, float(i % 2))],
                )
            )
        for event in events:
            await bus.publish(s.topic_for(event), event)
        await wait_until(
            lambda: recorder.stats.events >= len(events), within_s=30, what="the recorder", interval_s=0.05
        )
    finally:
        await recorder.stop()
        await bus.stop()
        await engine.close()


@pytest.fixture
async def recorded(tmp_path: Path) -> AsyncIterator[tuple[Path, ChdbStore]]:
    from trainer.models.tiny import build_tiny

    model = await asyncio.to_thread(build_tiny, MODEL_CACHE, CORPUS, vocab_size=320, hidden=64, layers=2)
    store = await asyncio.to_thread(ChdbStore, tmp_path / "chdb")
    try:
        await asyncio.to_thread(store.migrate)
        await _record(model, store)
        yield model, store
    finally:
        store.close()


async def _replay_into_fresh_trainer(
    model: Path, store: ChdbStore, tmp_path: Path, *, batch_groups: int, pace: Pace | None
) -> tuple[list[s.TrainerStepCompleted], ReplayReport, TrainerService]:
    """Replay the production sessions into a fresh trainer stepping every ``batch_groups`` units;
    returns its steps, the replay's report and the trainer service (stopped)."""
    from trainer.app import build
    from trainer.backends.torch_backend import load_backend
    from trainer.config import AlgorithmConfig

    algo = AlgorithmConfig(learning_rate=3e-3)
    settings = _fresh_trainer_settings(model, algo, tmp_path).model_copy(
        update={"trainer_batch_groups": batch_groups}
    )
    bus = MemoryBus()
    await bus.start()
    steps: list[s.TrainerStepCompleted] = []

    async def on_control(message: Message) -> None:
        if isinstance(message.event, s.TrainerStepCompleted):
            steps.append(message.event)

    await bus.ensure_topics([s.CONTROL, s.TRANSITIONS])
    watch = await bus.subscribe(s.CONTROL, "test-steps", on_control)
    service = build(settings, bus, load_backend(model, algo, torch_threads=1), [])
    await service.start()
    expected = len(RATINGS) // batch_groups
    runner = asyncio.create_task(service.run(expected))
    flt = ReplayFilter(since=datetime.now(UTC) - timedelta(hours=1), source="production")
    try:
        report = await replay(store, bus, flt, pace=pace)
        await asyncio.wait_for(runner, 60)
        await wait_until(lambda: len(steps) >= expected, within_s=10, what="the step events")
    finally:
        if not runner.done():
            service.request_stop()
            runner.cancel()
        await service.stop()
        await watch.stop()
        await bus.stop()
    return steps, report, service


@pytest.mark.timeout(180)
async def test_replayed_production_sessions_train_against_the_tenant_baseline_unpaced(
    recorded: tuple[Path, ChdbStore], tmp_path: Path
) -> None:
    model, store = recorded
    steps, report, service = await _replay_into_fresh_trainer(
        model, store, tmp_path, batch_groups=len(RATINGS), pace=None
    )
    # the filter: the six production sessions, not the live group
    assert report.selected == report.sent == report.production == len(RATINGS), report
    [step] = steps
    assert step.samples[s.EpisodeSource.replay] == len(RATINGS)
    assert step.samples[s.EpisodeSource.production] == step.samples[s.EpisodeSource.live] == 0
    figures = step.metrics.as_dict()
    assert figures["production_episodes"] == len(RATINGS)
    assert figures["advantage_abs_mean"] > 0 and 0 < figures["advantage_positive"] < 1
    stat = service.baselines.stats[KEY]
    assert stat.count == len(RATINGS) and stat.mean == pytest.approx(sum(RATINGS) / len(RATINGS))
    assert service.status().samples["replay"] == len(RATINGS)


@pytest.mark.timeout(180)
async def test_a_paced_replay_sends_each_session_as_one_unit_of_a_step(
    recorded: tuple[Path, ChdbStore], tmp_path: Path
) -> None:
    model, store = recorded
    steps, report, service = await _replay_into_fresh_trainer(
        model, store, tmp_path, batch_groups=2, pace=Pace(2, step_timeout_s=60)
    )
    # none is left out as no_signal; three steps of two sessions, each waited for
    assert not report.skipped and report.sent == report.production == len(RATINGS), report
    assert report.steps == report.steps_taken == 3, report
    assert [step.samples[s.EpisodeSource.replay] for step in steps] == [2, 2, 2]
    assert all(step.metrics.as_dict()["advantage_abs_mean"] > 0 for step in steps)
    assert service.baselines.stats[KEY].count == len(RATINGS)
    assert service.status().samples["replay"] == len(RATINGS)


@pytest.mark.timeout(120)
async def test_the_source_filter_in_a_dry_run(
    recorded: tuple[Path, ChdbStore], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, store = recorded
    store.close()  # the command opens the event log itself
    for name in ("FLYWHEEL_BUS", "FLYWHEEL_ADMIN_URL", "FLYWHEEL_CLICKHOUSE_URL", "FLYWHEEL_ENV"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path))
    cli = CliRunner()

    async def invoke(*args: str) -> Result:  # the command runs its own event loop: not on this one
        return await asyncio.to_thread(cli.invoke, app, ["replay", *args])

    shown = await invoke("--source", "production", "--dry-run")
    assert shown.exit_code == 0, shown.output
    assert "selected: 6 (source: production only)" in shown.output
    assert "production: 6 session(s), each trained against its tenant's baseline and paced as one group" in (
        shown.output
    )
    live = await invoke("--source", "live", "--dry-run", "--json")
    assert live.exit_code == 0, live.output
    data = json.loads(live.stdout)
    assert data["selected"] == LIVE and data["production"] == 0 and data["dry_run"] is True
    every = json.loads((await invoke("--dry-run", "--json")).stdout)
    assert every["selected"] == len(RATINGS) + LIVE and every["production"] == len(RATINGS)

"""Off-policy replay end to end: a recorded run, replayed from ClickHouse into a fresh trainer.

Recording: the real inference engine samples answers from a tiny model at temperature 1.5 and reports
processed logprobs (the behaviour policy μ); episodes are scored and published, and the real recorder
writes them to embedded ClickHouse (chdb). Three tasks were generated at different policy versions
(as a long-running deployment would have): A and B at version 0, C half at 0 and half at 2.

Replay: `flywheel.replay` selects them from ClickHouse and republishes them as ``source=replay`` into a fresh
trainer (`stale_policy="drop"` with max staleness 1, truncated importance sampling capped at 2, two PPO epochs). A is replayed and
trained on (trainer → v1), then B (→ v2), then C, whose version-0 transitions are now two versions
behind and are dropped by the staleness rule while its version-2 ones train. The test checks each
correction left its mark: importance weights π_old/μ ≠ 1 (the trainer's policy is not the tempered
sampler), capped weights, clipped ratios in the second epoch, staleness drops, and a policy that moved.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import schemas as s
from flywheel.replay import ReplayFilter, replay
from infra.bus.base import Message
from infra.bus.memory import MemoryBus
from infra.eventlog.models import EpisodeFilter
from infra.eventlog.recorder import Recorder
from infra.eventlog.store import ChdbStore
from tests.fakes.waiting import wait_until

if TYPE_CHECKING:
    from trainer.config import AlgorithmConfig
    from trainer.settings import TrainerSettings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

MODEL_CACHE = Path.home() / ".cache" / "flywheel" / "models" / "ops-e2e-tiny"
CORPUS = [f"What is {a} plus {b}? The answer is {a + b}." for a in range(12) for b in range(12)]
GROUP = 4


async def _record_run(model: Path, store: ChdbStore) -> None:
    """Sample a short run with the real engine and let the real recorder write it to ClickHouse."""
    from infra.engine import InferenceEngine
    from infra.engine.sampling import SamplingParams

    engine = InferenceEngine.from_pretrained(model, threads=1, model_name="policy")
    tokenizer = engine.tokenizer
    bus = MemoryBus()
    await bus.start()
    recorder = Recorder(bus, store, max_wait_s=0.05)
    await recorder.start()
    published = 0
    try:
        for task_id, versions in (("A", [0, 0, 0, 0]), ("B", [0, 0, 0, 0]), ("C", [0, 0, 2, 2])):
            messages = [{"role": "user", "content": f"What is {ord(task_id) % 7} plus 3?"}]
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            prompt = list(tokenizer.encode(text, add_special_tokens=False))
            params = SamplingParams(n=GROUP, temperature=1.5, max_tokens=12, logprobs=0, seed=7)
            result = await engine.complete(prompt, params)
            group_id = s.new_group_id()
            for i, (choice, version) in enumerate(zip(result.choices, versions, strict=True)):
                episode_id = s.new_episode_id()
                call = s.LLMCallRecorded(
                    episode_id=episode_id,
                    call_seq=0,
                    call_id=f"{episode_id[:8]}-0",
                    model="policy",
                    request=json.dumps({"model": "policy", "messages": messages, "temperature": 1.5}),
                    upstream=s.UpstreamKind.embedded,
                    token_faithful=True,
                    prompt_token_ids=prompt,
                    choices=[
                        s.CallChoice(
                            index=0, text=choice.text, token_ids=choice.token_ids, logprobs=choice.logprobs
                        )
                    ],
                    weight_version=version,
                )
                scored = s.EpisodeScored(
                    episode_id=episode_id,
                    group_id=group_id,
                    group_size=GROUP,
                    task_id=task_id,
                    sample_index=i,
                    reward=float(i % 2),  # alternating: every group has a learning signal
                    reward_source="exact",
                    num_calls=1,
                    transitions=[
                        s.Transition(
                            prompt_ids=prompt,
                            response_ids=choice.token_ids,
                            response_mask=[1] * len(choice.token_ids),
                            behaviour_logprobs=choice.logprobs,
                            weight_version=version,
                            call_seqs=[0],
                            reward=float(i % 2),
                        )
                    ],
                )
                for event in (call, scored):
                    await bus.publish(s.topic_for(event), event)
                    published += 1
        # The recorder exposes no "written" event: poll its counter under a deadline.
        await wait_until(
            lambda: recorder.stats.events >= published, within_s=30, what="the recorder", interval_s=0.05
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
        await _record_run(model, store)
        yield model, store
    finally:
        store.close()


def _fresh_trainer_settings(model: Path, algo: AlgorithmConfig, tmp_path: Path) -> TrainerSettings:
    """A fresh trainer on ``model`` that steps on every group (batches of one), in this process."""
    from trainer.settings import TrainerSettings

    return TrainerSettings(
        data_dir=tmp_path / "fresh-trainer",
        trainer_base_model=model,
        trainer_mode="sync",
        trainer_batch_groups=1,
        trainer_expected_gateways=0,
        trainer_torch_threads=1,
        trainer_algo=algo,
    )


async def test_replay_into_a_fresh_trainer(recorded: tuple[Path, ChdbStore], tmp_path: Path) -> None:
    from trainer.app import build, load_backend
    from trainer.batching import Sample
    from trainer.config import AlgorithmConfig

    model, store = recorded
    algo = AlgorithmConfig(
        stale_policy="drop",
        max_staleness=1,
        tis_cap=2.0,
        ppo_epochs=2,
        learning_rate=3e-3,
        clip_low=0.1,
        clip_high=0.1,
    )
    settings = _fresh_trainer_settings(model, algo, tmp_path)
    backend = load_backend(model, algo, torch_threads=1)
    episodes = list(store.select_scored_episodes(EpisodeFilter(limit=1000)))
    probe = [
        Sample(
            prompt_ids=t.prompt_ids,
            response_ids=t.response_ids,
            response_mask=t.response_mask,
            behaviour_logprobs=t.behaviour_logprobs,
            advantage=0.0,
            token_weight=1.0,
            episode_id=e.episode_id,
        )
        for e in episodes
        for t in e.transitions
    ]
    before = backend.sequence_logprobs(probe)

    bus = MemoryBus()
    await bus.start()
    steps: list[s.TrainerStepCompleted] = []
    stepped = asyncio.Condition()

    async def on_control(message: Message) -> None:
        if isinstance(message.event, s.TrainerStepCompleted):
            async with stepped:
                steps.append(message.event)
                stepped.notify_all()

    await bus.ensure_topics([s.CONTROL, s.TRANSITIONS])
    watch = await bus.subscribe(s.CONTROL, "test-steps", on_control)
    service = build(settings, bus, backend, [])
    await service.start()
    runner = asyncio.create_task(service.run(3))
    window = ReplayFilter(
        since=datetime.now(UTC) - timedelta(hours=1), until=datetime.now(UTC) + timedelta(hours=1)
    )

    async def replay_task(pattern: str, expect_steps: int) -> None:
        report = await replay(store, bus, window.model_copy(update={"task_pattern": pattern}))
        assert report.sent == GROUP and not report.skipped, report
        async with asyncio.timeout(60), stepped:
            await stepped.wait_for(lambda: len(steps) >= expect_steps or runner.done())
        assert len(steps) >= expect_steps, runner.exception() if runner.done() else "no step"

    try:
        await replay_task("A", 1)
        await replay_task("B", 2)
        await replay_task("C", 3)
        await asyncio.wait_for(runner, 30)
    finally:
        if not runner.done():
            service.request_stop()
            runner.cancel()
        await service.stop()
        await watch.stop()
        await bus.stop()

    a, b, c = (step.metrics.as_dict() for step in steps[:3])
    assert [st.version for st in steps[:3]] == [1, 2, 3]
    # Every step trained on replayed episodes only, with the behaviour logprobs they were recorded with.
    assert a["replay_episodes"] == b["replay_episodes"] == GROUP
    # Importance correction: the trainer's policy (T=1) is not the tempered sampler (T=1.5) → weights ≠ 1.
    assert abs(a["tis_mean"] - 1.0) > 1e-3
    assert max(m["tis_capped_fraction"] for m in (a, b, c)) > 0.0
    # PPO clipping acts in the second epoch, once the policy moved away from π_old.
    assert max(m["clip_fraction"] for m in (a, b, c)) > 0.0
    # Staleness: B was one version behind (kept), C's version-0 half was two behind (dropped).
    assert a["staleness_max"] == 0 and b["staleness_max"] == 1 and c["staleness_max"] == 2
    assert c["transitions"] == GROUP // 2
    stale = service.metrics.registry.get_sample_value(
        "flywheel_trainer_skipped_events_total", {"reason": "stale_transition"}
    )
    assert stale == GROUP // 2
    # And the policy moved: the recorded answers' log-probabilities changed under the trained weights.
    after = backend.sequence_logprobs(probe)
    assert max(abs(x - y) for x, y in zip(before, after, strict=True)) > 1e-3


async def test_a_paced_replay_through_the_admin_api_trains_the_recorded_run_in_order(
    recorded: tuple[Path, ChdbStore], tmp_path: Path
) -> None:
    """One paced replay of the whole recorded run, started through the running stack's admin API.

    Sent at once, the three groups would reach the trainer in any order (the bus works the transitions
    topic's partitions concurrently). Paced, one group per step as the fresh trainer takes them, the
    steps train A, then B, then C — the figures the hand-ordered replay above reaches — and the
    progress route reports every step taken.
    """
    import httpx
    from fastapi import FastAPI

    from flywheel.ops.api import OpsContext, create_ops_router
    from trainer.app import build, load_backend
    from trainer.config import AlgorithmConfig

    model, store = recorded
    algo = AlgorithmConfig(
        stale_policy="drop", max_staleness=1, tis_cap=2.0, ppo_epochs=1, learning_rate=3e-3
    )
    settings = _fresh_trainer_settings(model, algo, tmp_path)
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
    runner = asyncio.create_task(service.run(3))
    token = "s3cret-admin-token-for-tests"
    ctx = OpsContext(bus=bus, reader=store, admin_token=token)
    app = FastAPI()
    app.include_router(create_ops_router(ctx))
    headers = {"Authorization": f"Bearer {token}"}
    body = {
        "filter": {"since": (datetime.now(UTC) - timedelta(hours=1)).isoformat()},
        "pace": {"groups_per_step": 1, "step_timeout_s": 60},
    }
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://stack", headers=headers
        ) as client:
            started = await client.post("/admin/ops/replay", json=body)
            assert started.status_code == 202, started.text
            run_id = started.json()["run_id"]
            assert started.json()["state"] == "running"
            progress = started.json()
            async with asyncio.timeout(120):
                while progress["state"] == "running":
                    await asyncio.sleep(0.1)
                    progress = (await client.get(f"/admin/ops/replay/{run_id}")).json()
            assert progress["state"] == "done", progress
            missing = await client.get("/admin/ops/replay/nope")
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
        await asyncio.wait_for(runner, 30)
    finally:
        if not runner.done():
            service.request_stop()
            runner.cancel()
        await service.stop()
        await ctx.stop()
        await watch.stop()
        await bus.stop()

    assert progress["paced"] is True and progress["sent"] == 3 * GROUP
    assert progress["steps"] == progress["steps_taken"] == 3
    a, b, c = (step.metrics.as_dict() for step in steps[:3])
    # In the recorded order, one group per step: A (version 0) on a fresh trainer, B one version
    # behind, C's version-0 half two behind (dropped by max_staleness=1) and its version-2 half kept.
    assert a["replay_episodes"] == b["replay_episodes"] == GROUP
    assert a["staleness_max"] == 0 and b["staleness_max"] == 1 and c["staleness_max"] == 2
    assert c["transitions"] == GROUP // 2

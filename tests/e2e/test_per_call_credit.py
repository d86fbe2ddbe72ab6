"""Per-call rewards reach the loss, end to end through the stack (issue 15, finding 2).

The embedded stack (gateway, engine with the toy model, worker, reward service, trainer) runs a group
of two episodes of a callable agent that makes two chat calls through the real ``openai`` SDK, the
second continuing the first, and reports a reward per call on the gateway (+1 on the first, −1 on the
second, discount 0) and an episode reward of 0. Every episode of the group has the same reward, so
episode-level credit gives nothing to train on: only the per-call returns can move the policy. After
the trainer's one step the first calls' completions must be more likely under the checkpoint than
under the base model, and the second calls' completions less likely (measured on the token ids the
gateway recorded, with the trainer's own logprob code).
"""

from __future__ import annotations

import asyncio
from itertools import repeat
from pathlib import Path

import pytest

from flywheel.stack import EmbeddedStack, StackSettings
from infra.bus.base import Message
from schemas import (
    EPISODES,
    TRANSITIONS,
    AgentKind,
    AgentRef,
    EpisodeScored,
    LLMCallRecorded,
    ScorerSpec,
    Task,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

AGENT = AgentRef(kind=AgentKind.callable, spec="examples.agents_for_tests.per_call_agent:run")


async def test_per_call_rewards_move_each_call_in_its_own_direction(tmp_path: Path) -> None:
    from flywheel.cli.ops_up import TINY_CACHE, TINY_CORPUS
    from trainer.app import load_backend
    from trainer.batching import sft_samples
    from trainer.config import AlgorithmConfig
    from trainer.models.tiny import build_tiny

    model = await asyncio.to_thread(build_tiny, TINY_CACHE, TINY_CORPUS, vocab_size=384, hidden=64, layers=2)
    task = Task(
        task_id="per-call",
        input={"question": "What is 2 plus 3?", "call_rewards": [1.0, -1.0], "reward": 0.0},
        scorer=ScorerSpec(name="agent", options={"discount": 0.0}),
    )
    settings = StackSettings(
        data_dir=tmp_path,
        record_events=False,
        gateway_port=0,
        trainer_batch_groups=1,
        trainer_max_in_flight=1,  # one group requested before the step: the group measured is the one trained
        trainer_checkpoint_every=1,
        trainer_torch_threads=1,
        trainer_algo=AlgorithmConfig(learning_rate=2e-3),
    )
    calls: list[LLMCallRecorded] = []
    scored: list[EpisodeScored] = []

    async def on_event(msg: Message) -> None:
        if isinstance(msg.event, LLMCallRecorded):
            calls.append(msg.event)
        elif isinstance(msg.event, EpisodeScored):
            scored.append(msg.event)

    stack = EmbeddedStack(settings, model_dir=model, tasks=repeat(task), agent=AGENT, group_size=2)
    async with stack:
        assert stack.bus is not None and stack.trainer is not None
        subs = [
            await stack.bus.subscribe(t, "per-call-test", on_event, from_beginning=True)
            for t in (EPISODES, TRANSITIONS)
        ]
        await asyncio.wait_for(stack.start_training(1), 300)
        for sub in subs:
            await sub.stop()
        status = stack.trainer.status()
    groups: dict[str, list[EpisodeScored]] = {}
    for s in scored:
        groups.setdefault(s.group_id or "", []).append(s)
    group = next(g for g in groups.values() if len(g) == 2)  # the first group to complete: the step's
    trained = {s.episode_id for s in group}
    assert all(s.reward == 0.0 and s.status.value == "ok" for s in group), group
    for episode in group:  # the reward service's per-call returns: G[k] = r[k] (+ R on the last call)
        returns = [g for t in episode.transitions for g in (t.segment_returns or [t.reward])]
        assert returns == [1.0, -1.0], episode.transitions
    assert status.samples["live"] >= 2, status
    by_seq: dict[int, list[tuple[list[int], list[int]]]] = {0: [], 1: []}
    for call in calls:
        if call.episode_id in trained:
            by_seq[call.call_seq].append((list(call.prompt_token_ids), list(call.choices[0].token_ids or [])))
    assert len(by_seq[0]) == len(by_seq[1]) == 2

    backend = load_backend(model, AlgorithmConfig(), torch_threads=1)
    pairs = by_seq[0] + by_seq[1]
    before = backend.sequence_logprobs(sft_samples(pairs))
    backend.load_checkpoint(tmp_path / "trainer" / "checkpoints" / "v000001", 1)
    after = backend.sequence_logprobs(sft_samples(pairs))
    change = [a - b for a, b in zip(after, before, strict=True)]
    print(f"first calls' logprob change {change[:2]}, second calls' {change[2:]}")  # the figures, with -s
    assert sum(change[:2]) > 0 and sum(change[2:]) < 0, change

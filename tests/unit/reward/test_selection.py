"""Selective training: only the selected roles' calls become transitions; the rest is counted context."""

from __future__ import annotations

import json

import pytest

from infra.bus.memory import MemoryBus
from reward_service.selection import CallSelector
from schemas import EPISODES, TRANSITIONS, EpisodeScored, LLMCallRecorded, ScorerSpec
from tests.unit.reward.calls import call, finished, started
from tests.unit.reward.test_reward_service import service
from tests.unit.worker.collect import Events


def _as(c: LLMCallRecorded, model: str, system: str) -> LLMCallRecorded:
    body = {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "q"}],
    }
    return c.model_copy(update={"model": model, "request": json.dumps(body)})


def test_selector_by_model_and_system_prompt() -> None:
    writer = _as(call("e" * 32, 0, [1], [2]), "writer", "Write one query.")
    checker = _as(call("e" * 32, 1, [1], [2]), "checker", "Check the query.")
    assert CallSelector.parse().split([writer, checker]) == ([writer, checker], [])
    assert CallSelector.parse("writer, rewriter").split([writer, checker]) == ([writer], [checker])
    assert CallSelector.parse(system_match="^Check").split([writer, checker]) == ([checker], [writer])
    assert CallSelector.parse("writer", "^Check").split([writer, checker]) == ([], [writer, checker])
    with pytest.raises(ValueError, match="regular expression"):
        CallSelector.parse(system_match="(")


@pytest.mark.timeout(10)
async def test_only_selected_calls_become_transitions() -> None:
    async with MemoryBus() as bus:
        events = await Events().attach(bus, TRANSITIONS)
        svc = service(bus, selector=CallSelector.parse("writer,rewriter"))
        await svc.start()
        ep, spec = "5" * 32, ScorerSpec(name="exact")
        await bus.publish(EPISODES, started(ep, spec, answer="42"))
        roles = [
            ("writer", [1, 2], [3]),
            ("checker", [7, 8], [9]),
            ("rewriter", [1, 5], [6]),
            ("checker", [7], [9]),
        ]
        for seq, (model, prompt, reply) in enumerate(roles):
            await bus.publish(EPISODES, _as(call(ep, seq, prompt, reply), model, model))
        await bus.publish(EPISODES, finished(ep, "42"))
        only_checker = "6" * 32
        await bus.publish(EPISODES, started(only_checker, spec, answer="42"))
        await bus.publish(EPISODES, _as(call(only_checker, 0, [1], [2]), "checker", "c"))
        await bus.publish(EPISODES, finished(only_checker, "42"))
        [scored] = await events.wait_for(EpisodeScored, episode_id=ep)
        assert (scored.num_calls, scored.context_calls, scored.reward) == (4, 2, 1.0)
        assert sorted(seq for t in scored.transitions for seq in t.call_seqs) == [0, 2]
        assert all(t.reward == 1.0 for t in scored.transitions) and scored.unusable_reason is None
        [none] = await events.wait_for(EpisodeScored, episode_id=only_checker)
        assert (none.transitions, none.context_calls, none.unusable_reason) == ([], 1, "no_selected_calls")
        assert svc.stats.context_calls == 3
        await svc.stop()
        await events.stop()

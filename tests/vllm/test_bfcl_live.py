"""BFCL's function-calling questions (``flywheel tasks bfcl``, from the bfcl-eval wheel) answered by SmolLM2
on a live vLLM through the worker and the gateway, scored by the reward service's ``tool_call`` scorer
against BFCL's accepted values — the task set ``tests/gpu/acceptance.sh`` trains on, here without training.
Prints ``BFCL-FIGURES`` (mean partial-credit reward, all-or-nothing accuracy)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from flywheel.bfcl import bfcl_tasks
from flywheel.stack import EmbeddedStack
from schemas import (
    EPISODES,
    TASKS,
    TRANSITIONS,
    AgentKind,
    AgentRef,
    EpisodeScored,
    LLMCallRecorded,
    RolloutRequested,
)
from tests.unit.worker.collect import Events

pytestmark = pytest.mark.timeout(600)
AGENT = Path(__file__).resolve().parents[2] / "examples" / "demo_agents" / "bfcl_agent.py"


async def test_bfcl_questions_are_answered_and_scored_against_bfcls_accepted_values(
    stack: EmbeddedStack,
) -> None:
    tasks = bfcl_tasks("simple_python", limit=6, partial=True)
    bus = stack.buses[0]
    events = await Events().attach(bus, EPISODES, TRANSITIONS, group="vllm-bfcl")
    agent = AgentRef(kind=AgentKind.command, spec=f"{sys.executable} {AGENT}")
    for task in tasks:
        await bus.publish(
            TASKS, RolloutRequested(task=task, agent=agent, group_id=f"g-{task.task_id}", deadline_s=400)
        )
    scored: list[EpisodeScored] = await events.wait_for(EpisodeScored, count=len(tasks), within_s=500)
    answers: dict[str, Any] = {t.task_id: t.answer for t in tasks}
    rewards: list[float] = []
    for s in scored:
        assert s.reward_source == "tool_call" and s.reward is not None and 0.0 <= s.reward <= 1.0, (
            s.score_error
        )
        [call] = events.of(LLMCallRecorded, episode_id=s.episode_id)
        message = call.choices[0].message
        assert isinstance(message, dict)
        names = [tc["function"]["name"] for tc in message.get("tool_calls") or []]
        [expected] = answers[s.task_id or ""]
        [fn] = expected
        # the scorer read the recorded call: half the credit is for calling the right function
        assert (s.reward >= 0.5) is (names[:1] == [fn.replace(".", "_")]), (names, fn, s.reward)
        assert s.transitions and s.transitions[0].reward == s.reward  # trainable, as acceptance.sh trains
        rewards.append(s.reward)
    figures = {
        "questions": len(rewards),
        "mean_reward": round(sum(rewards) / len(rewards), 3),
        "accuracy": sum(r == 1.0 for r in rewards) / len(rewards),
    }
    print(f"BFCL-FIGURES {json.dumps(figures)}")
    await events.stop()

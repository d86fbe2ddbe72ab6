"""End to end on real Kafka: `flywheel tasks submit` → workers run command and callable agents (real
``openai`` SDK) through the real gateway over HTTP → the reward service → ``EpisodeScored`` with the
right rewards and token-exact transitions."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from flywheel.stack import EmbeddedStack
from schemas import TRANSITIONS, EpisodeScored, EpisodeStatus
from tests.fakes.stacks import fake_model_stack
from tests.fakes.upstream import END_ID, ROLE_IDS, render_prompt
from tests.unit.worker.collect import Events

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(90)]
REPLY = "The answer is 42."
FLYWHEEL = str(Path(sys.executable).parent / "flywheel")


@pytest.fixture
async def stack(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> AsyncIterator[EmbeddedStack]:
    async with fake_model_stack(
        tmp_path, kafka=kafka_bootstrap, topic_prefix=topic_prefix, worker_id="w0", concurrency=8
    ) as s:
        await s.add_worker("w1")
        yield s


async def submit(stack: EmbeddedStack, tasks: list[dict[str, object]], agent: str, n: int, tmp: Path) -> str:
    path = tmp / f"tasks-{agent.split()[-1].replace('/', '_')}.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    proc = await asyncio.create_subprocess_exec(
        FLYWHEEL,
        "tasks",
        "submit",
        str(path),
        "--agent",
        agent,
        "--n",
        str(n),
        "--deadline",
        "60",
        env={**os.environ, **stack.env()},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


def expected_ids(question: str, calls: int) -> tuple[list[int], list[int], list[int]]:
    """What the fake engine saw and produced for the example agents' conversation, merged."""
    reply = [*REPLY.encode(), END_ID]  # the engine generates the end-of-turn token too
    messages: list[dict[str, str]] = [{"role": "user", "content": question}]
    prompt = render_prompt(messages)
    response: list[int] = []
    mask: list[int] = []
    for turn in range(calls):
        response += reply
        mask += [1] * len(reply)
        messages += [
            {"role": "assistant", "content": REPLY},
            {"role": "user", "content": f"Check step {turn + 1}."},
        ]
        if turn + 1 < calls:
            nxt = render_prompt(messages)
            observation = nxt[len(prompt) + len(response) :]
            response += observation
            mask += [0] * len(observation)
    return prompt, response, mask


async def test_groups_of_command_and_callable_agents_are_scored(stack: EmbeddedStack, tmp_path: Path) -> None:
    events = await Events().attach(stack.buses[0], TRANSITIONS, group="e2e")
    exact = {"name": "exact", "options": {}}
    cmd = submit(
        stack,
        [{"task_id": "cmd-1", "input": {"question": "Q one?", "calls": 3}, "answer": REPLY, "scorer": exact}],
        "python examples/agents_for_tests/chat_agent.py",
        3,
        tmp_path,
    )
    callables = submit(
        stack,
        [
            {"task_id": "call-1", "input": {"question": "Q two?", "calls": 3, "reward": 0.25}},
            {"task_id": "call-2", "input": {"question": "Q three?", "calls": 2, "reward": 0.75}},
        ],
        "examples.agents_for_tests.callable_agent:run",
        2,
        tmp_path,
    )
    await asyncio.gather(cmd, callables)
    scored: list[EpisodeScored] = await events.wait_for(EpisodeScored, count=7, within_s=60)
    by_task: dict[str, list[EpisodeScored]] = {}
    for s in scored:
        by_task.setdefault(s.task_id or "", []).append(s)
    assert {k: len(v) for k, v in by_task.items()} == {"cmd-1": 3, "call-1": 2, "call-2": 2}
    for task_id, question, calls, reward, source in [
        ("cmd-1", "Q one?", 3, 1.0, "exact"),
        ("call-1", "Q two?", 3, 0.25, "agent"),
        ("call-2", "Q three?", 2, 0.75, "agent"),
    ]:
        group = by_task[task_id]
        assert len({s.group_id for s in group}) == 1
        assert sorted(s.sample_index for s in group) == list(range(len(group)))
        prompt, response, mask = expected_ids(question, calls)
        for s in group:
            assert s.status is EpisodeStatus.ok and not s.superseded and s.unusable_reason is None
            assert (s.reward, s.reward_source, s.num_calls, s.prefix_mismatches) == (reward, source, calls, 0)
            [t] = s.transitions  # every call extends the last: one trajectory
            assert t.call_seqs == list(range(calls))
            assert t.prompt_ids == prompt and t.prompt_ids[0] == ROLE_IDS["user"]
            assert t.response_ids == response and t.response_mask == mask
            assert len(t.behaviour_logprobs) == len(response)
            assert all(lp == 0.0 for lp, m in zip(t.behaviour_logprobs, mask, strict=True) if m == 0)
            assert all(lp < 0.0 for lp, m in zip(t.behaviour_logprobs, mask, strict=True) if m == 1)
            assert t.reward == reward
    await events.stop()

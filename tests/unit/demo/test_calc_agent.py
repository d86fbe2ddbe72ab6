"""The calculator agent and its tasks: parsing, the retry loop (real ``openai`` client), the splits."""

from __future__ import annotations

import importlib
import json
import random

import pytest
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from examples.demo_agents.calc_agent import agent, tasks

# The HTTP library the installed openai SDK is built on (httpx for openai 2.x, httpx2 for 3.x): its
# MockTransport must come from the same package as the SDK's client.
httpx_lib = importlib.import_module(DefaultAsyncHttpxClient.__mro__[1].__module__.partition(".")[0])


def test_calculate_and_refuse() -> None:
    assert agent.calculate("47*38") == 1786
    assert agent.calculate("12-34+5") == -17
    assert agent.calculate("2*(3+4)") == 14
    assert agent.calculate("07+08") == 15
    for bad in ("47/38", "1+", "__import__('os')", "2**99999", ""):
        with pytest.raises(agent.CalcError):
            agent.calculate(bad)


def test_react_accepts_only_the_exact_protocol() -> None:
    assert agent.react("CALC: 47*38") == ("calc", "RESULT: 1786")
    assert agent.react("ANSWER: -12") == ("answer", "-12")
    assert agent.react("CALC: 47/0") == ("error", agent.ERROR)
    for malformed in ("CALC 47*38", "calc: 47*38", "47*38", "ANSWER:12", "ANSWER: 12 ?", ""):
        assert agent.react(malformed) == ("error", agent.ERROR)


def _scripted(replies: list[str], seen: list[list[dict[str, str]]]) -> AsyncOpenAI:
    def handle(request):  # an httpx(2).Request → Response
        body = json.loads(request.content)
        seen.append(body["messages"])
        text = replies[len(seen) - 1]
        return httpx_lib.Response(
            200,
            json={
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                ],
            },
        )

    http = DefaultAsyncHttpxClient(transport=httpx_lib.MockTransport(handle))
    return AsyncOpenAI(base_url="http://gw/episodes/e/v1", api_key="e", http_client=http, max_retries=0)


async def test_retry_loop_then_tool_then_answer() -> None:
    seen: list[list[dict[str, str]]] = []
    client = _scripted(["calc 47*38", "CALC: 47*38", "ANSWER: 1786"], seen)
    task = tasks.make_task(47, "*", 38)
    result = await agent.solve(client, "policy", task)
    assert result == {"output": {"answer": "1786", "calls": 3}, "reward": 1.0}
    assert seen[1][-1] == {"role": "user", "content": agent.ERROR}  # the error-correction turn
    assert seen[2][-1] == {"role": "user", "content": "RESULT: 1786"}  # the tool result
    assert seen[0][0] == {"role": "system", "content": agent.SYSTEM}


async def test_gives_up_after_max_calls_with_reward_zero() -> None:
    seen: list[list[dict[str, str]]] = []
    client = _scripted(["nonsense"] * agent.MAX_CALLS, seen)
    result = await agent.solve(client, "policy", tasks.make_task(10, "+", 11))
    assert result == {"output": {"answer": "", "calls": agent.MAX_CALLS}, "reward": 0.0}


def test_splits_are_disjoint_and_cover_every_problem() -> None:
    counts = {s: 0 for s in tasks.SPLITS}
    for a in range(10, 100):
        for b in range(10, 100):
            for op in tasks.OPS:
                counts[tasks.split_of(a, op, b)] += 1
    assert sum(counts.values()) == 90 * 90 * 3
    assert 0.08 < counts["heldout"] / 24300 < 0.12
    heldout = {t["task_id"] for t in tasks.sample("heldout", 0, 200)}
    train = {t["task_id"] for t in tasks.sample("rl", 0, 500)} | {
        t["task_id"] for t in tasks.sample("sft", 0, 500)
    }
    assert len(heldout) == 200 and not heldout & train


def test_teacher_demonstrations_follow_the_agent() -> None:
    rng = random.Random(0)
    demos = [tasks.demonstration(t, rng) for t in tasks.sample("sft", 0, 300)]
    perfect = tasks.demonstration(
        tasks.make_task(47, "*", 38), rng, p_format=0, p_copy_expr=0, p_copy_answer=0
    )
    assert [m["content"] for m in perfect[2:]] == ["CALC: 47*38", "RESULT: 1786", "ANSWER: 1786"]
    for d in demos:
        assert d[0]["role"] == "system" and d[1]["role"] == "user"
        assistant = [m for m in d if m["role"] == "assistant"]
        assert 1 <= len(assistant) <= agent.MAX_CALLS
    sloppy = sum(1 for d in demos if any(m["content"] == agent.ERROR for m in d))
    assert 0.2 < sloppy / len(demos) < 0.9  # the teacher is sloppy, but not always

"""The gates' agent of ``flywheel demo --gates`` (examples/demo/gating.py): the deployed agent's loop
(examples/demo/tenants.py ``solve``), reward 1 for the right number in either form, so the gates judge
the answer and not its form."""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from examples.demo.tenants import solve


async def run(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    """The gates' agent: one episode of the deployed agent's loop; reward 1 for the right number, in
    either form (``llm`` has ``base_url``, ``api_key`` and ``model``)."""
    question = task["input"]["question"] if isinstance(task.get("input"), dict) else str(task.get("input"))
    async with AsyncOpenAI(
        base_url=llm.base_url, api_key=llm.api_key, max_retries=2, timeout=120.0
    ) as client:
        reply = await solve(client, llm.model, question)
    right = reply.answer != "" and reply.answer == str(task.get("answer"))
    return {
        "output": {"answer": reply.answer, "style": reply.style, "calls": reply.calls},
        "reward": 1.0 if right else 0.0,
    }

"""A callable agent that rewards its own calls: ``examples.agents_for_tests.per_call_agent:run``.

Two chat calls, the second continuing the first's conversation, through the real ``openai`` SDK; then
it reports a reward per call on the gateway's ``POST /episodes/{id}/reward`` (``call_index``: the
task input's ``call_rewards``, one per call) and returns its episode reward (``reward``, default 0).
"""

from __future__ import annotations

from typing import Any

import httpx
from openai import AsyncOpenAI


async def run(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    spec = task.get("input") or {}
    call_rewards = [float(r) for r in spec.get("call_rewards", [1.0, -1.0])]
    messages: list[Any] = [{"role": "user", "content": str(spec.get("question", "What is 2 plus 3?"))}]
    async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0, timeout=60.0) as client:
        for turn in range(len(call_rewards)):
            resp = await client.chat.completions.create(
                model=llm.model, messages=messages, max_tokens=int(spec.get("max_tokens", 8)), temperature=1.0
            )
            messages.append({"role": "assistant", "content": resp.choices[0].message.content or ""})
            messages.append({"role": "user", "content": f"Check step {turn + 1}."})
    episode_url = llm.base_url.rstrip("/").removesuffix("/v1")
    async with httpx.AsyncClient(timeout=30.0) as http:
        for index, value in enumerate(call_rewards):
            r = await http.post(f"{episode_url}/reward", json={"value": value, "call_index": index})
            r.raise_for_status()
    return {"reward": float(spec.get("reward", 0.0)), "output": messages[-2]["content"]}

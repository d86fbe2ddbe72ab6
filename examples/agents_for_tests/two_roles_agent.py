"""A callable agent with two roles that ask for two model names: ``examples.agents_for_tests.two_roles_agent:run``.

The writer (``model="writer"``) answers the question, the rewriter (``model="rewriter"``) rewrites the
writer's answer, each with its own system prompt, through the real ``openai`` SDK. The episode's reward
is 1.0 when the rewriter's answer has an even number of characters, else 0.0: a signal the tiny test
model's sampling varies across a group, so both roles' adapters have something to learn from.
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI


async def run(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    spec = task.get("input") or {}
    question = str(spec.get("question", "What is 2 plus 3?"))
    max_tokens = int(spec.get("max_tokens", 6))
    async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0, timeout=60.0) as client:
        draft = await client.chat.completions.create(
            model="writer",
            messages=[{"role": "system", "content": "You write."}, {"role": "user", "content": question}],
            max_tokens=max_tokens,
            temperature=1.0,
        )
        text = draft.choices[0].message.content or ""
        final = await client.chat.completions.create(
            model="rewriter",
            messages=[{"role": "system", "content": "You rewrite."}, {"role": "user", "content": text}],
            max_tokens=max_tokens,
            temperature=1.0,
        )
    answer = final.choices[0].message.content or ""
    return {"reward": 1.0 if len(answer) % 2 == 0 else 0.0, "output": answer}

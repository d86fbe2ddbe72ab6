"""Callable agents: ``examples.agents_for_tests.callable_agent:run`` (async) and ``:run_sync``.

``llm`` is anything with ``base_url``, ``api_key`` and ``model`` attributes; the agent uses the real
``openai`` SDK and imports nothing of Flywheel. Task input as in ``chat_agent.py`` (``pause``: async only).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from openai import AsyncOpenAI, OpenAI


def _setup(task: dict[str, Any]) -> tuple[list[Any], int, dict[str, Any]]:
    spec = task.get("input") or {}
    question = str(spec.get("question", "What is 6 times 7?"))
    return [{"role": "user", "content": question}], int(spec.get("calls", 3)), spec


def _result(reply: str, spec: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {"output": reply}
    if "reward" in spec:
        result["reward"] = spec["reward"]
    return result


async def run(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    messages, calls, spec = _setup(task)
    reply = ""
    async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0, timeout=30.0) as client:
        for turn in range(calls):
            if turn:
                await asyncio.sleep(float(spec.get("pause", 0)))
            resp = await client.chat.completions.create(model=llm.model, messages=messages, max_tokens=32)
            reply = resp.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": reply})
            messages.append({"role": "user", "content": f"Check step {turn + 1}."})
    return _result(reply, spec)


def run_sync(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    messages, calls, spec = _setup(task)
    reply = ""
    with OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0, timeout=30.0) as client:
        for turn in range(calls):
            resp = client.chat.completions.create(model=llm.model, messages=messages, max_tokens=32)
            reply = resp.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": reply})
            messages.append({"role": "user", "content": f"Check step {turn + 1}."})
    return _result(reply, spec)


_POOL: dict[int, Any] = {}  # event loop → httpx.AsyncClient


async def run_pooled(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    """Like :func:`run`, but every episode shares one HTTP connection pool (per event loop): the usual way
    to run many agents in one process, and what the benchmark measures."""
    loop_id = id(asyncio.get_running_loop())
    http: Any = _POOL.get(loop_id)
    if http is None:
        http = _POOL[loop_id] = httpx.AsyncClient(timeout=30.0, limits=httpx.Limits(max_connections=64))
    messages, calls, spec = _setup(task)
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0, http_client=http)
    reply = ""
    for turn in range(calls):
        resp = await client.chat.completions.create(model=llm.model, messages=messages, max_tokens=32)
        reply = resp.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        messages.append({"role": "user", "content": f"Check step {turn + 1}."})
    return _result(reply, spec)

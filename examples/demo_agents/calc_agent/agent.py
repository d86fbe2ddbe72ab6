"""A calculator-tool agent in plain ``openai`` code: it knows nothing of Flywheel.

The model is asked an arithmetic question. To answer it must call the calculator by replying
``CALC: <expression>``; the agent evaluates the expression and sends ``RESULT: <value>`` back; the model
then replies ``ANSWER: <number>``. A reply that is neither is malformed: the agent sends an error message
and lets the model retry, up to ``MAX_CALLS`` model calls per episode.

Two ways to run it:

* callable: ``examples.demo_agents.calc_agent.agent:run`` — ``await run(task, llm)`` with ``llm.base_url``,
  ``llm.api_key``, ``llm.model``; returns ``{"output": {"answer": ..., "calls": ...}, "reward": r}``.
* command: ``python -m examples.demo_agents.calc_agent.agent`` — the task as JSON on stdin (or ``$FLYWHEEL_TASK``),
  the endpoint from ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``; prints the same object as one JSON line.

A task is ``{"task_id": ..., "input": {"question": "What is 47 * 38?"}, "answer": "1786"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import weakref
from collections.abc import AsyncIterator
from typing import Any

from openai import AsyncOpenAI, DefaultAioHttpClient

SYSTEM = "Use CALC: <expr> then ANSWER: <n>."
ERROR = "ERROR: use CALC: <expr> or ANSWER: <n>."
MAX_CALLS = 4
MAX_TOKENS = 16

_CALC = re.compile(r"CALC: ([0-9+\-*() ]{1,40})")
_ANSWER = re.compile(r"ANSWER: (-?[0-9]{1,12})")
_TOKEN = re.compile(r"\s*(\d+|[-+*()])")


class CalcError(ValueError):
    pass


def calculate(expression: str) -> int:
    """Integer arithmetic with ``+ - *`` and parentheses (no ``eval``: the model wrote this text)."""
    tokens: list[str] = _TOKEN.findall(expression)
    if "".join(tokens) != expression.replace(" ", ""):
        raise CalcError(f"cannot read {expression!r}")
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise CalcError("unexpected end of expression")
        pos += 1
        return tokens[pos - 1]

    def atom() -> int:
        tok = take()
        if tok == "(":
            value = expr()
            if take() != ")":
                raise CalcError("missing )")
            return value
        if tok == "-":
            return -atom()
        if not tok.isdigit():
            raise CalcError(f"unexpected {tok!r}")
        return int(tok)

    def term() -> int:
        value = atom()
        while peek() == "*":
            take()
            value *= atom()
            if abs(value) > 10**12:
                raise CalcError("number too large")
        return value

    def expr() -> int:
        value = term()
        while peek() in ("+", "-"):
            value = value + term() if take() == "+" else value - term()
        return value

    result = expr()
    if pos != len(tokens):
        raise CalcError(f"unexpected {tokens[pos]!r}")
    return result


def react(reply: str) -> tuple[str, str]:
    """What the agent does with one model reply: ``("calc", tool message)``, ``("answer", value)``
    or ``("error", error message)``. Only an exact ``CALC: …`` / ``ANSWER: …`` reply is accepted."""
    reply = reply.strip()
    if m := _CALC.fullmatch(reply):
        try:
            return "calc", f"RESULT: {calculate(m.group(1))}"
        except CalcError:
            return "calc", "RESULT: error"
    if m := _ANSWER.fullmatch(reply):
        return "answer", m.group(1)
    return "error", ERROR


def first_messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def _question(task: dict[str, Any]) -> str:
    data = task.get("input")
    question = data.get("question") if isinstance(data, dict) else None
    if isinstance(question, str):
        return question
    if isinstance(data, str):
        return data
    raise ValueError("task.input must be {'question': str} or a string")


class _Pool:
    """One HTTP connection pool per event loop, shared by the episodes running on it, closed when the
    last of them ends. Building an HTTP client loads the system's CA bundle (~40 ms of CPU here), so a
    client per episode dominated a rollout; aiohttp's transport (the SDK's ``DefaultAioHttpClient``)
    also costs far less per request than httpx's under many concurrent connections."""

    def __init__(self) -> None:
        self.client: DefaultAioHttpClient | None = None
        self.users = 0


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()


@contextlib.asynccontextmanager
async def _shared_http() -> AsyncIterator[DefaultAioHttpClient]:
    pool = _POOLS.setdefault(asyncio.get_running_loop(), _Pool())
    if pool.client is None:
        pool.client = DefaultAioHttpClient(timeout=120.0)
    client = pool.client
    pool.users += 1
    try:
        yield client
    finally:
        pool.users -= 1
        if pool.users == 0 and pool.client is client:
            pool.client = None
            await client.aclose()


async def run(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    """One episode. ``llm`` has ``base_url``, ``api_key`` and ``model``."""
    async with _shared_http() as http:
        client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=2, http_client=http)
        return await solve(client, llm.model, task)


async def solve(client: AsyncOpenAI, model: str, task: dict[str, Any]) -> dict[str, Any]:
    messages: list[Any] = first_messages(_question(task))
    answer = ""
    calls = 0
    while calls < MAX_CALLS:
        response = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=1.0
        )
        calls += 1
        reply = response.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        kind, text = react(reply)
        if kind == "answer":
            answer = text
            break
        messages.append({"role": "user", "content": text})
    gold = task.get("answer")
    reward = 1.0 if gold is not None and answer == str(gold) else 0.0
    return {"output": {"answer": answer, "calls": calls}, "reward": reward}


def main() -> None:
    raw = os.environ.get("FLYWHEEL_TASK") or sys.stdin.read()
    task = json.loads(raw)
    client = AsyncOpenAI()  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
    model = os.environ.get("FLYWHEEL_MODEL", "policy")
    result = asyncio.run(solve(client, model, task))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

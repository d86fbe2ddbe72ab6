"""A calculator agent in the OpenAI Agents SDK (``Agent`` + ``function_tool``, ``Runner``, streamed).

A plain Agents SDK program: it knows nothing of Flywheel. The endpoint comes from ``OPENAI_BASE_URL`` /
``OPENAI_API_KEY`` (the SDK's default client reads them), the model name from ``OPENAI_MODEL``.
The task arrives as JSON on stdin (``{"input": {"question": ...}}``); the last stdout line is the result
``{"output": {"answer": <final text>, "tool_calls": [...]}}``.

    echo '{"input": {"question": "What is 3 times 4 times 5?"}}' | python examples/framework_agents/openai_agents_sdk.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from agents import Agent, Runner, function_tool, set_default_openai_api, set_tracing_disabled

# Not api.openai.com: Chat Completions (what OpenAI-compatible servers speak), and no trace upload.
set_default_openai_api("chat_completions")
set_tracing_disabled(True)

TOOL_CALLS: list[dict[str, int]] = []


@function_tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers and return the product."""
    TOOL_CALLS.append({"a": a, "b": b})
    return a * b


agent = Agent(
    name="calculator",
    instructions="You are a calculator. Use the multiply tool for every product, then state the result.",
    tools=[multiply],
    model=os.environ.get("OPENAI_MODEL", "policy"),
)


async def solve(question: str) -> str:
    result = Runner.run_streamed(agent, question, max_turns=6)
    async for _ in result.stream_events():
        pass  # a UI would render the deltas; the final output is what we need
    return str(result.final_output)


def main() -> None:
    task = json.loads(sys.stdin.read())
    answer = asyncio.run(solve(task["input"]["question"]))
    print(json.dumps({"output": {"answer": answer, "tool_calls": TOOL_CALLS}}))


if __name__ == "__main__":
    main()

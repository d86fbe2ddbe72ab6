"""A calculator agent in the OpenAI Agents SDK (``Agent`` + ``function_tool``, ``Runner``).

A plain Agents SDK program with the SDK's defaults: it knows nothing of Flywheel and talks the
Responses API, as the SDK does out of the box. The endpoint comes from ``OPENAI_BASE_URL`` /
``OPENAI_API_KEY`` (the SDK's default client reads them), the model name from ``OPENAI_MODEL``.
Streamed (``Runner.run_streamed``) unless ``--no-stream`` (``Runner.run``); with ``--chain`` the SDK
chains its turns by ``previous_response_id`` (``auto_previous_response_id``) instead of resending them.
The task arrives as JSON on stdin (``{"input": {"question": ...}}``); the last stdout line is the result
``{"output": {"answer": <final text>, "tool_calls": [...]}}``.

    echo '{"input": {"question": "What is 3 times 4 times 5?"}}' | python examples/framework_agents/openai_agents_sdk.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from agents import Agent, Runner, function_tool, set_tracing_disabled

set_tracing_disabled(True)  # no trace upload to api.openai.com

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


async def solve(question: str, stream: bool = True, chain: bool = False) -> str:
    if not stream:
        done = await Runner.run(agent, question, max_turns=6, auto_previous_response_id=chain)
        return str(done.final_output)
    streaming = Runner.run_streamed(agent, question, max_turns=6, auto_previous_response_id=chain)
    async for _ in streaming.stream_events():
        pass  # a UI would render the deltas; the final output is what we need
    return str(streaming.final_output)


def main() -> None:
    task = json.loads(sys.stdin.read())
    stream, chain = "--no-stream" not in sys.argv, "--chain" in sys.argv
    answer = asyncio.run(solve(task["input"]["question"], stream=stream, chain=chain))
    print(json.dumps({"output": {"answer": answer, "tool_calls": TOOL_CALLS}}))


if __name__ == "__main__":
    main()

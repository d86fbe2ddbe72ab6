"""An OpenAI Agents SDK agent that must use its tool first (``ModelSettings(tool_choice="required")``; the
SDK resets the choice after the tool ran, so the model then answers), on Chat Completions.

A plain Agents SDK program (nothing of Flywheel): the SDK's default client reads ``OPENAI_BASE_URL``/
``OPENAI_API_KEY``; the task as JSON on stdin, ``{"output": ...}`` as the last stdout line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

set_tracing_disabled(True)
TOOL_CALLS: list[dict[str, int]] = []


@function_tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    TOOL_CALLS.append({"a": a, "b": b})
    return a * b


agent = Agent(
    name="calculator",
    # one example of the call in the chat template's own format: a 135 M model copies it faithfully
    instructions='To multiply, call the tool like this: <tool_call>\n{"name": "multiply", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
    tools=[multiply],
    model=OpenAIChatCompletionsModel(os.environ.get("OPENAI_MODEL", "policy"), AsyncOpenAI(max_retries=1)),
    model_settings=ModelSettings(tool_choice="required", temperature=0.0, max_tokens=48),
)


async def solve(question: str) -> str:
    result = Runner.run_streamed(agent, question, max_turns=4)
    async for _ in result.stream_events():
        pass
    return str(result.final_output)


def main() -> None:
    task = json.loads(sys.stdin.read())
    answer = asyncio.run(solve(task["input"]["question"]))
    print(json.dumps({"output": {"answer": answer, "tool_calls": TOOL_CALLS}}))


if __name__ == "__main__":
    main()

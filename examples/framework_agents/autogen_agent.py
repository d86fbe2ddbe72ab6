"""A calculator agent in AutoGen AgentChat (``AssistantAgent`` with a tool, ``OpenAIChatCompletionClient``).

A plain AutoGen program: it knows nothing of Flywheel. ``OpenAIChatCompletionClient`` builds its
``openai`` client from ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``; the model name comes from
``OPENAI_MODEL``, and ``model_info`` says what a model AutoGen does not know can do. Replies stream
(``model_client_stream=True``). Task JSON on stdin, result JSON as the last stdout line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import TextMessage
from autogen_core.models import ModelFamily, ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient

TOOL_CALLS: list[dict[str, int]] = []


def multiply(a: int, b: int) -> int:
    """Multiply two integers and return the product."""
    TOOL_CALLS.append({"a": a, "b": b})
    return a * b


async def solve(question: str) -> str:
    client = OpenAIChatCompletionClient(
        model=os.environ.get("OPENAI_MODEL", "policy"),
        model_info=ModelInfo(
            vision=False,
            function_calling=True,
            json_output=False,
            structured_output=False,
            family=ModelFamily.UNKNOWN,
        ),
    )
    agent = AssistantAgent(
        "calculator",
        model_client=client,
        tools=[multiply],
        system_message="You are a calculator. Use the multiply tool for every product, then state the result.",
        max_tool_iterations=4,
        model_client_stream=True,
    )
    try:
        result = await agent.run(task=question)
    finally:
        await client.close()
    last = result.messages[-1]
    return last.content if isinstance(last, TextMessage) else str(last.to_text())


def main() -> None:
    task = json.loads(sys.stdin.read())
    answer = asyncio.run(solve(task["input"]["question"]))
    print(json.dumps({"output": {"answer": answer, "tool_calls": TOOL_CALLS}}))


if __name__ == "__main__":
    main()

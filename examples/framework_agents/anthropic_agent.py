"""A calculator agent on the ``anthropic`` SDK: the Messages API's own tool loop.

A plain ``anthropic`` program: it knows nothing of Flywheel. ``anthropic.Anthropic()`` reads
``ANTHROPIC_BASE_URL`` / ``ANTHROPIC_API_KEY``; the model name comes from ``ANTHROPIC_MODEL``. The
loop sends the conversation with the ``multiply`` tool, runs every ``tool_use`` block the reply holds,
answers each with a ``tool_result``, and stops at the first reply that is not a tool call
(``stop_reason != "tool_use"``). Task JSON on stdin, result JSON as the last stdout line.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anthropic

SYSTEM = "You are a calculator. Use the multiply tool for every product, then state the result."
TOOLS: list[Any] = [
    {
        "name": "multiply",
        "description": "Multiply two integers and return the product.",
        "input_schema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    }
]
TOOL_CALLS: list[dict[str, int]] = []


def multiply(a: int, b: int) -> int:
    TOOL_CALLS.append({"a": a, "b": b})
    return a * b


def run_tool(name: str, args: Any) -> str:
    if name != "multiply" or not isinstance(args, dict):
        return f"unknown tool {name!r}"
    return str(multiply(int(args["a"]), int(args["b"])))


def solve(question: str, max_turns: int = 6) -> str:
    client = anthropic.Anthropic(max_retries=1)
    model = os.environ.get("ANTHROPIC_MODEL", "policy")
    messages: list[Any] = [{"role": "user", "content": question}]
    for _ in range(max_turns):
        reply = client.messages.create(
            model=model, max_tokens=1024, system=SYSTEM, tools=TOOLS, messages=messages
        )
        messages.append({"role": "assistant", "content": reply.content})
        if reply.stop_reason != "tool_use":
            return "".join(block.text for block in reply.content if block.type == "text")
        results = [
            {"type": "tool_result", "tool_use_id": block.id, "content": run_tool(block.name, block.input)}
            for block in reply.content
            if block.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    raise RuntimeError(f"no answer after {max_turns} turns")


def main() -> None:
    task = json.loads(sys.stdin.read())
    answer = solve(task["input"]["question"])
    print(json.dumps({"output": {"answer": answer, "tool_calls": TOOL_CALLS}}))


if __name__ == "__main__":
    main()

"""The scripted policy of the framework-agent tests: what a model that learnt the calculator task writes.

``reply(prompt_text)`` reads the rendered prompt (the tiny model's Qwen-style template) and returns the
next assistant turn: a ``multiply`` tool call for the first product, one for the second once the first
result came back in a ``<tool_response>``, then the answer. The engine forces exactly these tokens
(infra/engine/forcing.py), so every framework's own tool loop runs on real engine output.
"""

from __future__ import annotations

import json
import re

QUESTION = "What is {a} times {b} times {c}?"
_QUESTION = re.compile(r"What is (\d+) times (\d+) times (\d+)\?")
_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)
_INT = re.compile(r"-?\d+")


# Questions whose replies the model writes as compact JSON, as real models often do: the engine hands
# the arguments back re-serialised, the framework resends them, and the template renders them with
# spaces, so the history no longer matches the generated tokens (a prefix mismatch per tool call).
COMPACT = {(6, 7, 2)}


def tool_call(a: int, b: int, compact: bool = False) -> str:
    body = json.dumps(
        {"name": "multiply", "arguments": {"a": a, "b": b}}, separators=(",", ":") if compact else None
    )
    return f"<tool_call>\n{body}\n</tool_call>"


def answer_text(value: int) -> str:
    return f"The answer is {value}."


def reply(prompt: str) -> str | None:
    question = _QUESTION.search(prompt)
    if question is None:
        return None  # not our task: sample as usual
    a, b, c = (int(g) for g in question.groups())
    compact = (a, b, c) in COMPACT
    results = [int(found[-1]) for r in _RESPONSE.findall(prompt) if (found := _INT.findall(r))]
    if not results:
        return tool_call(a, b, compact)
    if len(results) == 1:
        return tool_call(results[0], c, compact)
    return answer_text(results[-1])

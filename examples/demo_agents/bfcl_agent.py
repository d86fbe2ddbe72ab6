"""A function-calling agent for BFCL's questions (``flywheel tasks bfcl``), with the plain ``openai`` SDK.

It reads its task from stdin, asks the model once with the question's messages and the functions as
``tools``, and prints the model's tool calls as its output; the reward service's ``tool_call`` scorer
compares the recorded call with BFCL's accepted values.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from openai import OpenAI


def main() -> None:
    task = json.loads(sys.stdin.readline() or os.environ.get("FLYWHEEL_TASK", "{}"))
    spec: dict[str, Any] = task.get("input") or {}
    choice: Any = os.environ.get("BFCL_TOOL_CHOICE", "required")  # every simple question needs a call
    client = OpenAI(max_retries=0, timeout=300.0)  # OPENAI_BASE_URL / OPENAI_API_KEY from the env
    r = client.chat.completions.create(
        model=os.environ.get("FLYWHEEL_MODEL", "policy"),
        messages=spec["messages"],
        tools=spec["tools"],
        tool_choice=choice,
        max_tokens=int(os.environ.get("BFCL_MAX_TOKENS", "256")),
    )
    calls = [
        {"name": tc.function.name, "arguments": tc.function.arguments}
        for tc in r.choices[0].message.tool_calls or []
        if tc.type == "function"
    ]
    print(json.dumps({"output": {"tool_calls": calls, "content": r.choices[0].message.content}}), flush=True)


if __name__ == "__main__":
    main()

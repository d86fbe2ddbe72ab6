"""A command agent in plain OpenAI SDK code, for the compose recipe: it knows nothing of Flywheel.

Its folder is what a user mounts into the worker container (docs/operating.md, "Compose, run here"):
``-v $PWD/examples/compose_agent:/agent:ro`` and tasks submitted with ``--agent "python /agent/agent.py"``.
The service image carries the SDK (the ``agent`` extra); ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``
point at this episode on the gateway, ``FLYWHEEL_MODEL`` names the model.

The task arrives as JSON in ``FLYWHEEL_TASK`` (and on stdin): ``{"input": {"question": "..."}, ...}``.
One chat call with the question; the reply is the answer, printed as one JSON line
``{"output": {"answer": reply}}`` for the task's scorer (``numeric`` against the task's answer, say).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from openai import OpenAI

MAX_TOKENS = 16


def question(task: dict[str, Any]) -> str:
    """``task.input.question``, or ``task.input`` when it is a string."""
    data = task.get("input")
    asked = data.get("question") if isinstance(data, dict) else data
    if not isinstance(asked, str):
        raise ValueError("task.input must be {'question': str} or a string")
    return asked


def main() -> None:
    task = json.loads(os.environ.get("FLYWHEEL_TASK") or sys.stdin.read())
    client = OpenAI(max_retries=2)  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
    response = client.chat.completions.create(
        model=os.environ.get("FLYWHEEL_MODEL", "policy"),
        messages=[{"role": "user", "content": question(task)}],
        max_tokens=MAX_TOKENS,
        temperature=1.0,
    )
    print(json.dumps({"output": {"answer": response.choices[0].message.content or ""}}))


if __name__ == "__main__":
    main()

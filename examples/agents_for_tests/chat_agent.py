"""A command agent: reads its task from stdin, talks to the model with the real ``openai`` SDK (configured
only by ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``), and prints one final JSON line.

Task input (all optional): ``{"question": str, "calls": int, "reward": float, "pause": float}``. The
agent makes ``calls`` chat calls in one growing conversation (``pause`` seconds apart), answers with the
last reply, and reports ``reward`` when the task carries one.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from openai import OpenAI


def run(task: dict[str, Any], client: OpenAI, model: str) -> dict[str, Any]:
    spec = task.get("input") or {}
    question = str(spec.get("question", "What is 6 times 7?"))
    calls = int(spec.get("calls", 3))
    messages: list[Any] = [{"role": "user", "content": question}]
    reply = ""
    for turn in range(calls):
        if turn:
            time.sleep(float(spec.get("pause", 0)))
        resp = client.chat.completions.create(model=model, messages=messages, max_tokens=32)
        reply = resp.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        messages.append({"role": "user", "content": f"Check step {turn + 1}."})
    result: dict[str, Any] = {"output": reply}
    if "reward" in spec:
        result["reward"] = spec["reward"]
    return result


def main() -> None:
    task = json.loads(sys.stdin.readline() or os.environ.get("FLYWHEEL_TASK", "{}"))
    client = OpenAI(max_retries=0, timeout=30.0)  # OPENAI_BASE_URL and OPENAI_API_KEY come from the env
    print("thinking...")  # ordinary output before the final line is fine
    print(json.dumps(run(task, client, os.environ.get("FLYWHEEL_MODEL", "policy"))), flush=True)


if __name__ == "__main__":
    main()

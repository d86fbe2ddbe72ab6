"""A command agent: reads its task from stdin, talks to the model with the real ``openai`` SDK (configured
only by ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``), and prints one final JSON line.

Task input (all optional): ``{"question": str, "calls": int, "reward": float, "pause": float}``. The
agent makes ``calls`` chat calls in one growing conversation (``pause`` seconds apart), answers with the
last reply, and reports ``reward`` when the task carries one.

For the fault suite's history checker (``tests/faults/history.py``): ``CHAT_AGENT_MAX_RETRIES`` lets the
SDK retry as it does by default (0 when unset: a failed call fails the episode), and
``CHAT_AGENT_CALL_LOG`` names a file that gets one JSON line per HTTP attempt: the episode, the call's
number in this agent, the status (0: no answer) and whether a ``Retry-After`` came with it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import httpx
from openai import OpenAI


class AttemptLog(httpx.HTTPTransport):
    """An httpx transport that appends each attempt's status to a JSON-lines file."""

    def __init__(self, path: str, episode_id: str) -> None:
        super().__init__()
        self.path, self.episode_id, self.call = path, episode_id, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        status, retry_after = 0, False
        try:
            response = super().handle_request(request)
            status, retry_after = response.status_code, "retry-after" in response.headers
            return response
        finally:
            line = {
                "episode_id": self.episode_id,
                "call": self.call,
                "status": status,
                "retry_after": retry_after,
            }
            with open(self.path, "a") as out:
                out.write(json.dumps(line) + "\n")


def run(task: dict[str, Any], client: OpenAI, model: str, log: AttemptLog | None = None) -> dict[str, Any]:
    spec = task.get("input") or {}
    question = str(spec.get("question", "What is 6 times 7?"))
    calls = int(spec.get("calls", 3))
    messages: list[Any] = [{"role": "user", "content": question}]
    reply = ""
    for turn in range(calls):
        if turn:
            time.sleep(float(spec.get("pause", 0)))
        if log is not None:
            log.call = turn
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
    path = os.environ.get("CHAT_AGENT_CALL_LOG")
    log = AttemptLog(path, os.environ.get("FLYWHEEL_EPISODE_ID", "")) if path else None
    retries = int(os.environ.get("CHAT_AGENT_MAX_RETRIES", "0"))
    # OPENAI_BASE_URL and OPENAI_API_KEY come from the env
    client = OpenAI(
        max_retries=retries, timeout=30.0, http_client=httpx.Client(transport=log) if log else None
    )
    print("thinking...")  # ordinary output before the final line is fine
    print(json.dumps(run(task, client, os.environ.get("FLYWHEEL_MODEL", "policy"), log)), flush=True)


if __name__ == "__main__":
    main()

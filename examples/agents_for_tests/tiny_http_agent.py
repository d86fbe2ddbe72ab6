"""The smallest command agent: three chat calls with the standard library only (no SDK import cost), so a
benchmark measures the worker, not the agent's start-up. Reads ``OPENAI_BASE_URL``/``OPENAI_API_KEY``."""

from __future__ import annotations

import json
import os
import urllib.request


def main() -> None:
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}", "Content-Type": "application/json"}
    messages: list[dict[str, str]] = [{"role": "user", "content": "hi"}]
    reply = ""
    for _ in range(3):
        body = json.dumps(
            {"model": os.environ.get("FLYWHEEL_MODEL", "policy"), "messages": messages, "max_tokens": 8}
        )
        req = urllib.request.Request(f"{base}/chat/completions", data=body.encode(), headers=headers)
        with urllib.request.urlopen(req, timeout=30) as resp:
            reply = json.loads(resp.read())["choices"][0]["message"]["content"] or ""
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "go on"}]
    print(json.dumps({"output": reply, "reward": 1.0}))


if __name__ == "__main__":
    main()

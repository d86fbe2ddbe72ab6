"""Tool calls in generated text: the Hermes / Qwen2.5 format, parsed whole and while streaming.

Qwen2.5's chat template (and the tiny model's, trainer/models/tiny.py) asks the model to answer a
request that lists ``tools`` with one or more ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
blocks; vLLM's ``hermes`` tool parser turns those into OpenAI ``tool_calls``. This module does the same
for the embedded engine:

- ``parse_tool_calls(text)``: the whole reply → ``(content, tool_calls)``. Text before the first block
  is the content (``None`` when empty); a block that is not well-formed JSON with a ``name`` leaves the
  reply untouched as plain content, so nothing the model wrote is lost.
- ``ToolCallStream``: the same while streaming. Content is sent as it arrives except what may be the
  start of a ``<tool_call>`` tag; from the tag on, text is held back and parsed when the choice
  finishes, then sent as ``tool_calls`` deltas (one per call, whole: id, name and arguments) — or, when
  it does not parse, as content.

The argument JSON is re-serialised with ``json.dumps(..., ensure_ascii=False)`` (as vLLM's parser does),
which is how the template writes it back: a framework that resends the call as received re-renders
the very same text when the model wrote its JSON in that canonical form. When it did not (compact
separators, other key spacing), the re-rendered history differs from the generated tokens and the next
call cannot extend the trajectory; tests/e2e/test_framework_agents.py measures both cases.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

TOOL_CALL_START = "<tool_call>"
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

JSON = dict[str, Any]


def _call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex[:24]}"


def parse_tool_calls(text: str) -> tuple[str | None, list[JSON]]:
    """``(content, tool_calls)`` of a whole reply; no calls → ``(text, [])``."""
    calls: list[JSON] = []
    for match in _TOOL_CALL.finditer(text):
        try:
            body = json.loads(match.group(1))
            name = body["name"]
            args = body.get("arguments", {})
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            return text, []  # not a well-formed call: hand the text back untouched
        if not isinstance(name, str) or not name:
            return text, []
        calls.append(
            {
                "id": _call_id(),
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
                },
            }
        )
    if not calls:
        return text, []
    content = text[: text.find(TOOL_CALL_START)].strip()
    return (content or None), calls


def wants_tool_parsing(tools: list[JSON] | None, tool_choice: Any) -> bool:
    """Parse only when the request offers tools and did not forbid them (``tool_choice="none"``)."""
    return bool(tools) and tool_choice != "none"


class ToolCallStream:
    """Per-choice streaming state: which text may go out as content now, and the calls at the end."""

    def __init__(self) -> None:
        self.text = ""  # everything decoded so far
        self.sent = 0  # characters of ``text`` sent as content
        self.in_call = False

    def push(self, delta: str) -> str:
        """Add decoded text; returns the content that can be sent now."""
        self.text += delta
        if self.in_call:
            return ""
        at = self.text.find(TOOL_CALL_START, self.sent)
        if at >= 0:
            self.in_call = True
            out = self.text[self.sent : at]
            self.sent = at
            return out
        # hold back a tail that could still become "<tool_call>"
        hold = 0
        for k in range(min(len(TOOL_CALL_START) - 1, len(self.text) - self.sent), 0, -1):
            if TOOL_CALL_START.startswith(self.text[-k:]):
                hold = k
                break
        end = len(self.text) - hold
        out = self.text[self.sent : end]
        self.sent = end
        return out

    def finish(self, final_text: str, parse: bool) -> tuple[str, list[JSON]]:
        """The choice ended with ``final_text`` (the engine's, cut at any stop string): the content not
        yet sent and the tool-call deltas (``index`` set) to send with the last chunk."""
        calls: list[JSON] = []
        if parse and self.in_call:
            _, calls = parse_tool_calls(final_text)
        if calls:
            rest = final_text[self.sent : final_text.find(TOOL_CALL_START, self.sent)]
            return rest, [{"index": i, **call} for i, call in enumerate(calls)]
        rest = final_text[self.sent :]
        self.sent = len(final_text)
        return rest, []

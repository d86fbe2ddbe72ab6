"""Message content in the shape of OpenTelemetry's GenAI conventions (``gen_ai.input.messages``,
``gen_ai.output.messages``): each message a role and a list of typed parts (text, tool call, tool
call response). Call spans carry these only when content capture is on (``infra.otel.spans``).
"""

from __future__ import annotations

from typing import Any

from schemas import LLMCallRecorded


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: list[dict[str, Any]] = []
    if isinstance(content, list):
        for item in content:
            if isinstance(item, dict) and isinstance(item.get("text"), str):
                parts.append({"type": "text", "content": item["text"]})
            elif isinstance(item, str):
                parts.append({"type": "text", "content": item})
    return parts


def _message(message: dict[str, Any]) -> dict[str, Any]:
    role = message.get("role") if isinstance(message.get("role"), str) else "user"
    if role == "tool":
        return {
            "role": "tool",
            "parts": [
                {
                    "type": "tool_call_response",
                    "id": message.get("tool_call_id"),
                    "response": message.get("content"),
                }
            ],
        }
    parts = _parts(message.get("content"))
    for tc in message.get("tool_calls") or ():
        if isinstance(tc, dict):
            fn: dict[str, Any] = tc["function"] if isinstance(tc.get("function"), dict) else {}
            parts.append(
                {
                    "type": "tool_call",
                    "id": tc.get("id"),
                    "name": fn.get("name"),
                    "arguments": fn.get("arguments"),
                }
            )
    return {"role": role, "parts": parts}


def input_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's messages in the conventions' shape (``gen_ai.input.messages``)."""
    messages = request.get("messages")
    if isinstance(messages, list):
        return [_message(m) for m in messages if isinstance(m, dict)]
    for key in ("prompt", "input"):
        value = request.get(key)
        if isinstance(value, str):
            return [{"role": "user", "parts": [{"type": "text", "content": value}]}]
        if isinstance(value, list):
            if all(isinstance(v, dict) for v in value):
                return [_message(v) for v in value]
            return [{"role": "user", "parts": [{"type": "text", "content": str(v)} for v in value]}]
    return []


def output_messages(call: LLMCallRecorded) -> list[dict[str, Any]]:
    """The choices as output messages (``gen_ai.output.messages``), each with its finish reason."""
    out: list[dict[str, Any]] = []
    for choice in call.choices:
        message = (
            _message(choice.message)
            if isinstance(choice.message, dict)
            else {"role": "assistant", "parts": _parts(choice.text)}
        )
        message["role"] = "assistant"
        message["finish_reason"] = choice.finish_reason or "stop"
        out.append(message)
    return out

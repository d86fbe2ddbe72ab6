"""Anthropic's Messages API (``POST /v1/messages``) as one chat-completions call (``dialects.py``).

Request → chat:
- ``system`` (a string or text blocks) → a leading system message.
- ``messages``: content a string or blocks. ``text`` → text; ``image`` (base64 or url) → an
  ``image_url`` part; an assistant's ``tool_use`` blocks → its ``tool_calls`` (``input`` written as
  JSON the way the engine's tool parser writes arguments, so a reply sent back re-renders to the very
  tokens generated, and tokens-in recognises it); a user's ``tool_result`` blocks → ``tool``
  messages, ahead of the user's text in that turn; ``thinking`` blocks are dropped.
- ``tools`` (``name``, ``description``, ``input_schema``), ``tool_choice`` (``auto``, ``any``,
  ``tool``, ``none``; ``disable_parallel_tool_use``), ``max_tokens``, ``stop_sequences``,
  ``temperature``, ``top_p``, ``top_k``. Server tools, ``thinking``, ``mcp_servers`` and ``container``
  are a 400 naming the parameter.

Chat → message: the reply's text is a ``text`` block, each tool call a ``tool_use`` block (``id`` the
chat tool call's id, ``input`` its parsed arguments); ``stop_reason`` from ``finish_reason``
(``stop`` → ``end_turn`` or ``stop_sequence``, ``length`` → ``max_tokens``, ``tool_calls`` →
``tool_use``); ``usage`` from the engine's counts. Streaming: gateway/protocols/anthropic_stream.py.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from gateway.protocol import MAX_INT, validate
from gateway.protocols.anthropic_stream import MessagesStream
from gateway.protocols.dialects import (
    JSON,
    DialectEndpoint,
    StreamConverter,
    bad,
    obj,
    tool_arguments,
    unsupported,
)
from gateway.recording.capture import Captured

UNSUPPORTED = {
    "mcp_servers": "MCP connectors run on Anthropic's platform",
    "container": "code execution containers run on Anthropic's platform",
}
_STOP = {"length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant"]
    content: str | list[dict[str, JsonValue]]


class MessagesRequest(BaseModel):
    """``POST /v1/messages``: the fields the gateway reads; everything else is kept as sent."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(default="", max_length=512)
    max_tokens: int = Field(ge=1, le=MAX_INT)
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, JsonValue]] | None = None
    stop_sequences: list[str] | None = Field(default=None, max_length=16)
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0, le=MAX_INT)
    tools: list[dict[str, JsonValue]] | None = None
    tool_choice: dict[str, JsonValue] | None = None
    metadata: dict[str, JsonValue] | None = None
    thinking: dict[str, JsonValue] | None = None


def _text(block: JSON, where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise bad(f"{where}.text must be a string", f"{where}.text")
    return text


def _image(block: JSON, where: str) -> JSON:
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    elif isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise bad(f"{where}.source must be a base64 or url image source", f"{where}.source")
    return {"type": "image_url", "image_url": {"url": url}}


def _parts(blocks: list[JSON], where: str) -> str | list[JSON]:
    """Text and image blocks as chat content: a string when all are text (joined as vLLM joins them)."""
    parts: list[JSON] = []
    for j, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, f"{where}[{j}]")})
        elif kind == "image":
            parts.append(_image(block, f"{where}[{j}]"))
        else:
            raise bad(f"{where}[{j}]: block type {kind!r} is not supported here", f"{where}[{j}].type")
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _tool_result(block: JSON, where: str) -> JSON:
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise bad(f"{where}.tool_use_id must be a non-empty string", f"{where}.tool_use_id")
    content = block.get("content", "")
    if isinstance(content, list):
        content = _parts([c for c in content if isinstance(c, dict)], f"{where}.content")
    elif not isinstance(content, str):
        raise bad(f"{where}.content must be a string or blocks", f"{where}.content")
    return {"role": "tool", "tool_call_id": tool_use_id, "content": content}


def chat_messages(req: MessagesRequest) -> list[JSON]:
    out: list[JSON] = []
    if isinstance(req.system, str) and req.system:
        out.append({"role": "system", "content": req.system})
    elif isinstance(req.system, list) and req.system:
        out.append({"role": "system", "content": _parts(req.system, "system")})
    for i, msg in enumerate(req.messages):
        where = f"messages[{i}].content"
        if isinstance(msg.content, str):
            out.append({"role": msg.role, "content": msg.content})
            continue
        plain: list[JSON] = []
        calls: list[JSON] = []
        results: list[JSON] = []
        for j, block in enumerate(msg.content):
            kind = block.get("type")
            if kind in ("thinking", "redacted_thinking"):
                continue
            if kind == "tool_use" and msg.role == "assistant":
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                    raise bad(f"{where}[{j}]: tool_use needs an id and a name", f"{where}[{j}]")
                fn = {"name": block["name"], "arguments": tool_arguments(block.get("input", {}))}
                calls.append({"id": block["id"], "type": "function", "function": fn})
            elif kind == "tool_result" and msg.role == "user":
                results.append(_tool_result(block, f"{where}[{j}]"))
            elif kind in ("text", "image"):
                plain.append(block)
            else:
                raise bad(f"{where}[{j}]: block type {kind!r} is not supported", f"{where}[{j}].type")
        content = _parts(plain, where) if plain else None
        if msg.role == "assistant":
            out.append({"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})})
            continue
        out.extend(results)
        if content is not None or not results:
            out.append({"role": "user", "content": content if content is not None else ""})
    return out


def chat_tools(tools: list[JSON] | None) -> list[JSON] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") not in (None, "custom") or not isinstance(tool.get("name"), str):
            raise bad(
                f"tools[{i}]: only client tools (name, input_schema) are supported, not {tool.get('type')!r}",
                f"tools[{i}].type",
                "unsupported_tool",
            )
        fn: JSON = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: JSON | None) -> tuple[str | JSON | None, bool | None]:
    """(chat ``tool_choice``, ``parallel_tool_calls``)."""
    if choice is None:
        return None, None
    parallel = (
        None if choice.get("disable_parallel_tool_use") is None else not choice["disable_parallel_tool_use"]
    )
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind, parallel
    if kind == "any":
        return "required", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise bad("tool_choice.type must be auto, any, tool (with a name) or none", "tool_choice.type")


class MessagesExchange:
    """One Messages API call (gateway/protocols/dialects.py's ``Exchange``)."""

    endpoint: DialectEndpoint = "messages"
    prefix: JSON | None = None

    def __init__(self, data: JSON, req: MessagesRequest | None = None) -> None:
        """``req``: ``data`` already validated (the routes parse a body once); validated here if not."""
        req = req if req is not None else validate(MessagesRequest, data)
        unsupported(data, UNSUPPORTED)
        if isinstance(req.thinking, dict) and req.thinking.get("type") not in (None, "disabled"):
            raise bad("thinking is not supported by this gateway", "thinking", "unsupported_parameter")
        self.data = data
        self.id = f"msg_{uuid.uuid4().hex}"
        self.stops = list(req.stop_sequences or [])
        choice, parallel = chat_tool_choice(req.tool_choice)
        chat: JSON = {"model": req.model, "messages": chat_messages(req), "max_tokens": req.max_tokens}
        optional = {
            "tools": chat_tools(req.tools),
            "tool_choice": choice,
            "parallel_tool_calls": parallel,
            "stop": self.stops or None,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
        }
        chat.update({k: v for k, v in optional.items() if v is not None})
        if req.stream:
            chat["stream"] = True
            chat["stream_options"] = {"include_usage": True}
        self.chat = chat

    def stop(self, finish_reason: Any, text: str) -> tuple[str, str | None]:
        """(``stop_reason``, ``stop_sequence``) for a chat ``finish_reason``."""
        if finish_reason in _STOP:
            return _STOP[finish_reason], None
        # a stop string is cut from the text: the engine says only "stop", so which one is unknown
        return ("stop_sequence", self.stops[0]) if len(self.stops) == 1 and text else ("end_turn", None)

    def skeleton(self) -> JSON:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.data.get("model") or "",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }

    @staticmethod
    def blocks(message: JSON) -> list[JSON]:
        out: list[JSON] = []
        if message.get("content"):
            out.append({"type": "text", "text": str(message["content"])})
        for call in message.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict):
                continue
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except (TypeError, ValueError):
                args = None
            out.append(
                {
                    "type": "tool_use",
                    "id": str(call.get("id") or ""),
                    "name": str(fn.get("name") or ""),
                    "input": args if isinstance(args, dict) else {},
                }
            )
        return out

    def answer(self, chat_response: JSON) -> JSON:
        choices = [c for c in chat_response.get("choices") or [] if isinstance(c, dict)]
        choice = min(choices, key=lambda c: c.get("index", 0)) if choices else {}
        message = obj(choice.get("message"))
        body = self.skeleton()
        body["content"] = self.blocks(message)
        body["stop_reason"], body["stop_sequence"] = self.stop(
            choice.get("finish_reason"), str(message.get("content") or "")
        )
        usage = obj(chat_response.get("usage"))
        body["usage"] = {
            "input_tokens": int(usage.get("prompt_tokens") or 0),
            "output_tokens": int(usage.get("completion_tokens") or 0),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        return body

    def stream(self) -> StreamConverter:
        return MessagesStream(self)

    def recorded(self, answer: JSON, captured: Captured) -> None:
        """Nothing to keep: a Messages API agent resends its whole history."""

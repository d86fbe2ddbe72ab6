"""The OpenAI Responses API (``POST /v1/responses``) as one chat-completions call (``dialects.py``).

Request → chat:
- ``instructions`` → a leading system message; ``input`` a string → one user message; ``input`` items:
  ``message`` items (``user``/``system``/``developer``/``assistant``, text or ``input_text`` /
  ``output_text`` / ``input_image`` parts), ``function_call`` items → the assistant message's
  ``tool_calls`` (consecutive ones, and the assistant text before them, form one message, as the model
  wrote them in one turn), ``function_call_output`` items → ``tool`` messages; ``reasoning`` items are
  dropped. ``tools`` of type ``function``, ``tool_choice``, ``parallel_tool_calls``,
  ``max_output_tokens``, ``temperature``, ``top_p``, ``text.format`` map onto their chat twins.
- ``previous_response_id``: the conversation the named response ended (its input, as chat messages,
  and its reply) comes first, then this call's ``input``. Its ``instructions`` are not carried over,
  as OpenAI specifies. Responses are kept by :class:`ResponseStore`, per episode, bounded.
- Anything else that would change what the model sees (hosted tools, ``conversation``, ``prompt``
  templates, ``background``) is a 400 naming the parameter.

Chat → response: choice 0's text is one ``message`` item with an ``output_text`` part, each tool call a
``function_call`` item (``call_id`` the chat tool call's id); ``finish_reason == "length"`` is status
``incomplete``. Streaming: gateway/protocols/responses_stream.py.

Continuity: a ``previous_response_id`` chain extends its conversation exactly, so when the named
response came from the same instructions and tools, :attr:`ResponsesExchange.prefix` hands the engine
that response's prompt and reply ids (tokens-in, gateway/upstream/tokens_in.py): the call starts from the
recorded ids and merges into the same trajectory.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from gateway.episodes.registry import EpisodeState
from gateway.protocol import MAX_INT, validate
from gateway.protocols.dialects import JSON, DialectEndpoint, StreamConverter, bad, obj, unsupported
from gateway.protocols.response_store import Kept, ResponseStore
from gateway.protocols.responses_stream import ResponsesStream
from gateway.recording.capture import Captured

UNSUPPORTED = {
    "background": "responses are answered in the request",
    "conversation": "use previous_response_id or resend the items",
    "prompt": "prompt templates live on OpenAI's platform",
}
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


class ResponsesRequest(BaseModel):
    """``POST /v1/responses``: the fields the gateway reads; everything else is kept as sent."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(default="", max_length=512)
    input: str | list[dict[str, JsonValue]] | None = None
    instructions: str | None = None
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=128)
    stream: bool = False
    tools: list[dict[str, JsonValue]] | None = None
    tool_choice: str | dict[str, JsonValue] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_INT)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    text: dict[str, JsonValue] | None = None
    store: bool | None = None
    user: str | None = Field(default=None, max_length=256)
    metadata: dict[str, JsonValue] | None = None


# ------------------------------------------------------------------------------ request → chat
def _text_of(parts: list[Any], where: str) -> tuple[str | None, list[JSON]]:
    """Text parts joined (vLLM joins them with newlines), or chat parts when an image is among them."""
    texts: list[str] = []
    chat: list[JSON] = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict):
            raise bad(f"{where}[{j}] must be an object", f"{where}[{j}]")
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            text = part.get("text", part.get("refusal"))
            if not isinstance(text, str):
                raise bad(f"{where}[{j}].text must be a string", f"{where}[{j}].text")
            texts.append(text)
            chat.append({"type": "text", "text": text})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            chat.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise bad(f"{where}[{j}]: content part {kind!r} is not supported", f"{where}[{j}].type")
    if len(chat) == len(texts):
        return "\n".join(texts), []
    return None, chat


def _content(value: Any, where: str) -> str | list[JSON]:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad(f"{where} must be a string or a list of content parts", where)
    text, parts = _text_of(value, where)
    return text if text is not None else parts


def _str(item: JSON, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or (key != "arguments" and not value):
        raise bad(f"{where}.{key} must be a non-empty string", f"{where}.{key}")
    return value


def input_messages(items: str | list[JSON] | None) -> list[JSON]:
    """The chat messages an ``input`` stands for (module docstring)."""
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[JSON] = []
    turn: JSON | None = None  # the assistant message the current model turn's items go into
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise bad(f"{where}.role must be user, assistant, system or developer", f"{where}.role")
            content = _content(item.get("content"), f"{where}.content")
            if role == "assistant":
                if not isinstance(content, str):
                    raise bad(f"{where}.content: an assistant message holds text only", f"{where}.content")
                turn = {"role": "assistant", "content": content}
                out.append(turn)
                continue
            out.append({"role": "system" if role == "developer" else role, "content": content})
            turn = None
        elif kind == "function_call":
            call = {
                "id": _str(item, "call_id", where),
                "type": "function",
                "function": {"name": _str(item, "name", where), "arguments": _str(item, "arguments", where)},
            }
            if turn is None:
                turn = {"role": "assistant", "content": None}
                out.append(turn)
            turn.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _content(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": _str(item, "call_id", where), "content": text})
            turn = None
        elif kind == "reasoning":
            continue  # the model's own reasoning summary: no chat twin, nothing the template renders
        else:
            raise bad(
                f"{where}: input item type {kind!r} is not supported", f"{where}.type", "unsupported_item"
            )
    return out


def chat_tools(tools: list[JSON] | None) -> list[JSON] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise bad(
                f"tools[{i}]: tool type {tool.get('type')!r} is not supported (function tools only)",
                f"tools[{i}].type",
                "unsupported_tool",
            )
        fn = {"name": _str(tool, "name", f"tools[{i}]")}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                fn[key] = tool[key]
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: str | JSON | None) -> str | JSON | None:
    if choice is None or isinstance(choice, str):
        if choice not in (None, "auto", "none", "required"):
            raise bad("tool_choice must be auto, none, required or a function", "tool_choice")
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad(
        f"tool_choice of type {choice.get('type')!r} is not supported", "tool_choice", "unsupported_tool"
    )


def response_format(text: JSON | None) -> JSON | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    raise bad(f"text.format of type {fmt.get('type')!r} is not supported", "text.format.type")


def _digest(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


# ------------------------------------------------------------------------------- the exchange
class ResponsesExchange:
    """One Responses API call (gateway/protocols/dialects.py's ``Exchange``)."""

    endpoint: DialectEndpoint = "responses"

    def __init__(
        self, data: JSON, episode: EpisodeState, store: ResponseStore, req: ResponsesRequest | None = None
    ) -> None:
        """``req``: ``data`` already validated (the routes parse a body once); validated here if not."""
        req = req if req is not None else validate(ResponsesRequest, data)
        unsupported(data, UNSUPPORTED)
        self.data = data
        self.episode = episode
        self.store = store
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.instructions = req.instructions
        tools = chat_tools(req.tools)
        self.setting = _digest([req.instructions, tools])
        self.history: list[JSON] = []
        self.prefix: JSON | None = None
        if req.previous_response_id is not None:
            kept = store.resolve(req.previous_response_id, episode)
            self.history = list(kept.history)
            if kept.setting == self.setting and kept.prompt_token_ids and kept.reply_token_ids:
                self.prefix = {
                    "messages": len(self.history) + (1 if req.instructions else 0),
                    "prompt_token_ids": kept.prompt_token_ids,
                    "response_token_ids": kept.reply_token_ids,
                }
        self.history += input_messages(req.input)
        if not self.history:
            raise bad("input must hold at least one item", "input")
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        chat: JSON = {"model": req.model, "messages": system + self.history}
        optional = {
            "tools": tools,
            "tool_choice": chat_tool_choice(req.tool_choice),
            "parallel_tool_calls": req.parallel_tool_calls,
            "max_tokens": req.max_output_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "response_format": response_format(req.text),
        }
        chat.update({k: v for k, v in optional.items() if v is not None})
        if req.stream:
            chat["stream"] = True
            chat["stream_options"] = {"include_usage": True}
        self.chat = chat
        self.keep = req.store is not False

    # ------------------------------------------------------------------------------- answers
    def message_id(self) -> str:
        return f"msg_{self.id[5:]}"

    def call_item_id(self, j: int) -> str:
        return f"fc_{self.id[5:]}_{j}"

    def skeleton(self, status: str) -> JSON:
        """The response object without its output (``response.created`` carries this)."""
        d = self.data
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "instructions": self.instructions,
            "max_output_tokens": d.get("max_output_tokens"),
            "model": d.get("model") or "",
            "output": [],
            "parallel_tool_calls": d.get("parallel_tool_calls", True),
            "previous_response_id": d.get("previous_response_id"),
            "store": d.get("store", True),
            "temperature": d.get("temperature", 1.0),
            "text": d.get("text") or {"format": {"type": "text"}},
            "tool_choice": d.get("tool_choice") or "auto",
            "tools": d.get("tools") or [],
            "top_p": d.get("top_p", 1.0),
            "truncation": d.get("truncation") or "disabled",
            "usage": None,
            "user": d.get("user"),
            "metadata": d.get("metadata") or {},
        }

    def output(self, message: JSON) -> list[JSON]:
        """A chat reply message as output items: its text, then one item per tool call."""
        items: list[JSON] = []
        text = message.get("content")
        calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        if text or not calls:
            items.append(
                {
                    "id": self.message_id(),
                    "type": "message",
                    "status": "completed",
                    "role": "assistant",
                    "content": [
                        {"type": "output_text", "text": text or "", "annotations": [], "logprobs": []}
                    ],
                }
            )
        for j, call in enumerate(calls):
            fn = call.get("function") or {}
            items.append(
                {
                    "id": self.call_item_id(j),
                    "type": "function_call",
                    "status": "completed",
                    "call_id": str(call.get("id") or self.call_item_id(j)),
                    "name": str(fn.get("name") or ""),
                    "arguments": str(fn.get("arguments") or ""),
                }
            )
        return items

    def answer(self, chat_response: JSON) -> JSON:
        choices = [c for c in chat_response.get("choices") or [] if isinstance(c, dict)]
        choice = min(choices, key=lambda c: c.get("index", 0)) if choices else {}
        message = obj(choice.get("message"))
        incomplete = choice.get("finish_reason") == "length"
        body = self.skeleton("incomplete" if incomplete else "completed")
        body["output"] = self.output(message)
        if incomplete:
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        usage = obj(chat_response.get("usage"))
        prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        body["usage"] = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }
        self._reply = {
            "role": "assistant",
            "content": message.get("content"),
            **({"tool_calls": message["tool_calls"]} if message.get("tool_calls") else {}),
        }
        return body

    def stream(self) -> StreamConverter:
        return ResponsesStream(self)

    def recorded(self, answer: JSON, captured: Captured) -> None:
        if not self.keep:
            return
        history = [*self.history, self._reply]
        choice = min(captured.choices, key=lambda c: c.index) if captured.choices else None
        ep = self.episode
        kept = Kept(
            episode_id=ep.episode_id,
            tenant=ep.tenant,
            session_id=ep.session_id,
            history=history,
            setting=self.setting,
            prompt_token_ids=captured.prompt_token_ids if captured.token_faithful else None,
            reply_token_ids=choice.token_ids if choice is not None and captured.token_faithful else None,
            size=len(orjson.dumps([self.data.get("input"), self._reply]))
            + 8 * len(captured.prompt_token_ids or []),
        )
        self.store.put(self.id, kept)

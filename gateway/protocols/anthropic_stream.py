"""A Messages API stream from the engine's chat chunks, in Anthropic's event types.

    message_start                                   (the message, no content yet, input tokens)
    content_block_start (text)      content_block_delta (text_delta) ...      content_block_stop
    content_block_start (tool_use)  content_block_delta (input_json_delta) ... content_block_stop
    message_delta                                   (stop_reason, stop_sequence, output tokens)
    message_stop

Text goes out as the engine's chunks come; the blocks still open, ``message_delta`` and
``message_stop`` come from the recorded answer (:meth:`MessagesStream.finish`). A stream that breaks
ends with an ``error`` event (Anthropic's error body).
"""

from __future__ import annotations

from typing import Any, Protocol

from gateway.errors import GatewayError
from gateway.protocols.dialects import JSON, anthropic_error, obj, sse, tool_arguments


class Skeleton(Protocol):
    """What the stream needs of its exchange (gateway/protocols/anthropic.py)."""

    def skeleton(self) -> JSON: ...


class MessagesStream:
    def __init__(self, exchange: Skeleton) -> None:
        self.x = exchange
        self.started = False
        self.blocks = 0  # content blocks started
        self.open: str | None = None  # the type of the block open now
        self.tools: dict[int, int] = {}  # chat tool-call index → its block's index
        self.args: dict[int, str] = {}  # block index → the argument JSON sent for it

    def _start(self, chunk: JSON | None) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        message = self.x.skeleton()
        ids = chunk.get("prompt_token_ids") if chunk is not None else None
        message["usage"]["input_tokens"] = len(ids) if isinstance(ids, list) else 0
        return [sse("message_start", {"type": "message_start", "message": message})]

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [sse("content_block_stop", {"type": "content_block_stop", "index": self.blocks - 1})]

    def _begin(self, block: JSON) -> list[bytes]:
        out = self._close()
        self.open = str(block["type"])
        self.blocks += 1
        start = {"type": "content_block_start", "index": self.blocks - 1, "content_block": block}
        return [*out, sse("content_block_start", start)]

    def _delta(self, index: int, delta: JSON) -> bytes:
        return sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})

    def feed(self, chunk: JSON) -> list[bytes]:
        out = self._start(chunk)
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta: Any = obj(choice.get("delta"))
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self.open != "text":
                    out += self._begin({"type": "text", "text": ""})
                out.append(self._delta(self.blocks - 1, {"type": "text_delta", "text": text}))
            for tc in delta.get("tool_calls") or []:
                if not isinstance(tc, dict):
                    continue
                index = int(tc.get("index", len(self.tools)))
                fn = obj(tc.get("function"))
                if index not in self.tools:
                    block = {
                        "type": "tool_use",
                        "id": str(tc.get("id") or ""),
                        "name": str(fn.get("name") or ""),
                    }
                    out += self._begin({**block, "input": {}})
                    self.tools[index] = self.blocks - 1
                args = fn.get("arguments")
                if isinstance(args, str) and args and self.tools[index] == self.blocks - 1:
                    self.args[self.tools[index]] = self.args.get(self.tools[index], "") + args
                    out.append(
                        self._delta(self.tools[index], {"type": "input_json_delta", "partial_json": args})
                    )
        return out

    def finish(self, answer: JSON) -> list[bytes]:
        out = self._start(None)
        blocks = answer.get("content") or []
        for index, block in enumerate(blocks):
            if index >= self.blocks:  # not streamed yet (a reply with no deltas): send it whole now
                if block["type"] == "text":
                    out += self._begin({"type": "text", "text": ""})
                    out.append(self._delta(index, {"type": "text_delta", "text": block["text"]}))
                else:
                    out += self._begin({**block, "input": {}})
                    out.append(
                        self._delta(
                            index,
                            {"type": "input_json_delta", "partial_json": tool_arguments(block["input"])},
                        )
                    )
        out += self._close()
        usage = answer.get("usage") or {}
        delta = {"stop_reason": answer.get("stop_reason"), "stop_sequence": answer.get("stop_sequence")}
        out.append(
            sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": delta,
                    "usage": {"output_tokens": usage.get("output_tokens", 0)},
                },
            )
        )
        out.append(sse("message_stop", {"type": "message_stop"}))
        return out

    def error(self, exc: GatewayError) -> bytes:
        return b"".join([*self._start(None), sse("error", anthropic_error(exc))])

"""A Responses API stream from the engine's chat chunks: the event sequence the OpenAI SDKs consume.

    response.created, response.in_progress
    response.output_item.added (message), response.content_part.added, response.output_text.delta ...
    response.output_text.done, response.content_part.done, response.output_item.done
    response.output_item.added (function_call), response.function_call_arguments.delta ...
    response.function_call_arguments.done, response.output_item.done
    response.completed (or response.incomplete), whose ``response`` is the call's whole answer

Deltas go out as the engine's chunks come; the ``.done`` events of what is still open and
``response.completed`` come from the recorded answer (:meth:`ResponsesStream.finish`), so the final
response object is exactly the non-streamed answer, item ids included. A stream that breaks ends with
an ``error`` event and ``response.failed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from gateway.errors import GatewayError
from gateway.protocols.dialects import JSON, obj, sse


class Items(Protocol):
    """What the stream needs of its exchange (gateway/protocols/responses.py): the answer's ids and shapes."""

    def skeleton(self, status: str) -> JSON: ...
    def message_id(self) -> str: ...
    def call_item_id(self, j: int) -> str: ...
    def output(self, message: JSON) -> list[JSON]: ...


@dataclass(slots=True)
class _Call:
    j: int
    output_index: int
    call_id: str
    name: str
    arguments: str = ""


class ResponsesStream:
    def __init__(self, exchange: Items) -> None:
        self.x = exchange
        self.seq = 0
        self.started = False
        self.outputs = 0  # output items announced so far
        self.text: list[str] = []
        self.message_index: int | None = None  # the message item's output_index once announced
        self.message_done = False
        self.calls: dict[int, _Call] = {}

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(kind, data)

    def _start(self) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        skeleton = self.x.skeleton("in_progress")
        return [
            self._event("response.created", response=skeleton),
            self._event("response.in_progress", response=skeleton),
        ]

    def _open_message(self) -> list[bytes]:
        self.message_index = self.outputs
        self.outputs += 1
        item = {"id": self.x.message_id(), "type": "message", "status": "in_progress", "role": "assistant"}
        return [
            self._event(
                "response.output_item.added", output_index=self.message_index, item={**item, "content": []}
            ),
            self._event(
                "response.content_part.added",
                item_id=self.x.message_id(),
                output_index=self.message_index,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
            ),
        ]

    def _close_message(self, item: JSON) -> list[bytes]:
        self.message_done = True
        part = item["content"][0]
        at = {"item_id": item["id"], "output_index": self.message_index}
        return [
            self._event("response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[]),
            self._event("response.content_part.done", **at, content_index=0, part=part),
            self._event("response.output_item.done", output_index=self.message_index, item=item),
        ]

    def _message_item(self) -> JSON:
        return self.x.output({"content": "".join(self.text)})[0]

    def _open_call(self, index: int, call_id: str, name: str) -> list[bytes]:
        out: list[bytes] = []
        if self.message_index is not None and not self.message_done:
            out += self._close_message(self._message_item())
        call = self.calls[index] = _Call(len(self.calls), self.outputs, call_id, name)
        self.outputs += 1
        item = {
            "id": self.x.call_item_id(call.j),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call_id,
            "name": name,
            "arguments": "",
        }
        return [*out, self._event("response.output_item.added", output_index=call.output_index, item=item)]

    def feed(self, chunk: JSON) -> list[bytes]:
        out = self._start()
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # the Responses API has one output: choice 0
            delta = obj(choice.get("delta"))
            text = delta.get("content")
            if isinstance(text, str) and text and not self.message_done:
                if self.message_index is None:
                    out += self._open_message()
                self.text.append(text)
                out.append(
                    self._event(
                        "response.output_text.delta",
                        item_id=self.x.message_id(),
                        output_index=self.message_index,
                        content_index=0,
                        delta=text,
                        logprobs=[],
                    )
                )
            for tc in delta.get("tool_calls") or []:
                if not isinstance(tc, dict):
                    continue
                index = int(tc.get("index", len(self.calls)))
                fn = obj(tc.get("function"))
                if index not in self.calls:
                    out += self._open_call(index, str(tc.get("id") or ""), str(fn.get("name") or ""))
                args = fn.get("arguments")
                if isinstance(args, str) and args:
                    call = self.calls[index]
                    call.arguments += args
                    out.append(
                        self._event(
                            "response.function_call_arguments.delta",
                            item_id=self.x.call_item_id(call.j),
                            output_index=call.output_index,
                            delta=args,
                        )
                    )
        return out

    def finish(self, answer: JSON) -> list[bytes]:
        out = self._start()
        by_j = {c.j: c for c in self.calls.values()}
        j = 0
        for index, item in enumerate(answer.get("output") or []):
            if item.get("type") == "message":
                if self.message_index is None:
                    out += self._open_message()
                if not self.message_done:
                    out += self._close_message(item)
                continue
            call = by_j.get(j)
            if call is None:
                out.append(
                    self._event(
                        "response.output_item.added", output_index=index, item={**item, "arguments": ""}
                    )
                )
                call = _Call(j, index, item["call_id"], item["name"])
            fields = {"item_id": item["id"], "output_index": call.output_index}
            if not call.arguments and item["arguments"]:
                out.append(
                    self._event("response.function_call_arguments.delta", **fields, delta=item["arguments"])
                )
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    **fields,
                    arguments=item["arguments"],
                    name=item["name"],
                )
            )
            out.append(self._event("response.output_item.done", output_index=call.output_index, item=item))
            j += 1
        kind = "response.incomplete" if answer.get("status") == "incomplete" else "response.completed"
        out.append(self._event(kind, response=answer))
        return out

    def error(self, exc: GatewayError) -> bytes:
        failed = self.x.skeleton("failed")
        failed["error"] = {"code": "server_error", "message": exc.message}
        return b"".join(
            [
                *self._start(),
                self._event(
                    "error", code=str(exc.code or exc.error_type), message=exc.message, param=exc.param
                ),
                self._event("response.failed", response=failed),
            ]
        )

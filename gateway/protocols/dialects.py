"""Agent protocols other than chat completions, served through the chat-completions engine path.

An agent speaks the protocol its framework speaks: the OpenAI Responses API (``POST /v1/responses``,
``responses.py``) or Anthropic's Messages API (``POST /v1/messages``, ``anthropic.py``). Each call
is translated into one chat-completions call (:class:`Exchange.chat`), which ``CallService``
serves exactly as it serves an agent's own chat call: admission, the engine, token ids, logprobs,
weight version, tokens-in, the durable record. Only the way back differs: the engine's chat response
(or its stream of chunks) becomes the protocol's body (or its SSE events) in :meth:`Exchange.answer`
and :class:`StreamConverter`. The recorded ``LLMCallRecorded`` keeps the agent's request as it was
sent and the response as the agent got it, with ``endpoint`` naming the protocol.

Errors keep one channel: the gateway's exceptions (gateway/errors.py), written in the protocol's own
error shape at the boundary (:func:`error_response`): OpenAI's for the Responses API, Anthropic's
``{"type": "error", "error": {"type", "message"}}`` for the Messages API.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, Protocol

import orjson
from starlette.responses import Response

from gateway.errors import GatewayError, InvalidRequestError
from gateway.recording.capture import Captured

DialectEndpoint = Literal["responses", "messages"]
Route = Literal["chat.completions", "completions", "responses", "messages"]
JSON = dict[str, Any]


class StreamConverter(Protocol):
    """The engine's chat chunks as the protocol's SSE events, one call's worth."""

    def feed(self, chunk: JSON) -> list[bytes]:
        """Events for one chat chunk (as the engine sent it, ids included)."""
        ...

    def finish(self, answer: JSON) -> list[bytes]:
        """The closing events, once the call is recorded; ``answer`` is :meth:`Exchange.answer`'s."""
        ...

    def error(self, exc: GatewayError) -> bytes:
        """The event that ends a stream that broke."""
        ...


class Exchange(Protocol):
    """One agent call in a protocol other than chat: the chat body the engine gets, and the way back."""

    endpoint: DialectEndpoint
    chat: JSON  # the chat-completions body served for it
    prefix: JSON | None  # a tokens-in ``prompt_prefix`` the protocol itself vouches for, if any

    def answer(self, chat_response: JSON) -> JSON:
        """The protocol's body for the engine's complete chat response."""
        ...

    def stream(self) -> StreamConverter: ...

    def recorded(self, answer: JSON, captured: Captured) -> None:
        """The call is durable: keep what a later call may refer to (``previous_response_id``)."""
        ...


def tool_arguments(value: Any) -> str:
    """Tool-call arguments from a JSON value, written as the engine's (and vLLM's) hermes parser writes
    them: an agent's resent call then renders to the very tokens the model generated."""
    return json.dumps(value, ensure_ascii=False)


def obj(value: Any) -> JSON:
    """``value`` when it is a JSON object, else an empty one (engine output read defensively)."""
    return value if isinstance(value, dict) else {}


def sse(event: str, data: Mapping[str, Any]) -> bytes:
    """One server-sent event with its name: both protocols' SDKs dispatch on ``event:``."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def bad(message: str, param: str, code: str = "invalid_value") -> InvalidRequestError:
    """A 400 naming the field at fault, in the protocol's format once it reaches the boundary."""
    return InvalidRequestError(message, param=param, code=code)


def unsupported(data: Mapping[str, Any], names: Mapping[str, str]) -> None:
    """Refuse parameters the gateway cannot honour, by name (``names``: parameter → why), when set."""
    for name, why in names.items():
        value = data.get(name)
        if value not in (None, False, [], {}):
            raise bad(f"{name} is not supported by this gateway: {why}", name, "unsupported_parameter")


# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_error(exc: GatewayError) -> JSON:
    kind = _ANTHROPIC_TYPES.get(exc.status_code, "api_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def error_response(endpoint: Route, exc: GatewayError) -> Response:
    """``exc`` in the error shape of the protocol ``endpoint`` speaks."""
    if endpoint != "messages":
        return exc.response()
    return Response(
        orjson.dumps(anthropic_error(exc)),
        status_code=exc.status_code,
        media_type="application/json",
        headers=exc.headers,
    )

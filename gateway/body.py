"""The one body reader at the gateway: a request's body, read whole and bounded, before any route.

Both doors read a body here: :class:`gateway.app.HotCalls` (the LLM calls, straight from the ASGI server)
and :class:`BodyLimit` (the middleware in front of every other route of the gateway and of
``flywheel agl-server``). A body over the limit is a 413, by its Content-Length or counted while a
chunked body comes in; a client that hangs up first raises :class:`Disconnected` (nothing to answer).
:func:`parse_json` reads a body as JSON within ``gateway.limits`` (the routes' calls), and
:func:`check_json_body` holds a body to the same limits at the door.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import GatewayError, InvalidRequestError, PayloadTooLargeError
from gateway.limits import (
    MAX_JSON_DEPTH,
    MAX_JSON_ITEMS,
    check_int_range,
    check_json,
    too_deep_for_parser,
)
from infra.body import declared_length


class Disconnected(Exception):
    """The client went away before its request body was read: nothing to answer."""


def check_length(scope: Scope, max_bytes: int) -> None:
    """413 when the declared Content-Length is over ``max_bytes`` (before the body is read at all)."""
    if declared_length(scope) > max_bytes:
        raise PayloadTooLargeError(f"request body over {max_bytes} bytes", code="body_too_large")


async def read_body(scope: Scope, receive: Receive, max_bytes: int) -> bytes:
    """The request's body, whole: a 413 past ``max_bytes``, :class:`Disconnected` if the client left."""
    check_length(scope, max_bytes)
    chunks: list[bytes] = []
    seen = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk: bytes = message.get("body", b"")
        if chunk:
            seen += len(chunk)
            if seen > max_bytes:
                raise PayloadTooLargeError(f"request body over {max_bytes} bytes", code="body_too_large")
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def parse_json(raw: bytes) -> Any:
    """The body as JSON; malformed JSON is a 400 in OpenAI's format, and so is JSON that nests deeper
    than ``gateway.limits.MAX_JSON_DEPTH`` (a container too large is a 413)."""
    if not raw.strip():
        raise InvalidRequestError("request body is empty; expected a JSON object", code="invalid_json")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if too_deep_for_parser(exc):
            raise InvalidRequestError(
                f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels", code="json_too_deep"
            ) from exc
        raise InvalidRequestError(f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if isinstance(data, dict | list):
        check_json(data, raw)
    return data


def check_json_body(raw: bytes) -> None:
    """The limits of ``gateway.limits`` (depth, members, integer range) on a body not parsed yet, at
    the door; a body that is not JSON is left to its route."""
    check_int_range(raw)
    if raw.count(b"[") + raw.count(b"{") < MAX_JSON_DEPTH and raw.count(b",") < MAX_JSON_ITEMS:
        return
    try:
        parse_json(raw)
    except InvalidRequestError as exc:
        if exc.code == "json_too_deep":
            raise


class BodyLimit:
    """The door for every route but the hot ones: the body read by :func:`read_body`, and a JSON body
    beyond ``gateway.limits`` (depth, members) a 4xx, all before the route runs.

    The body is read whole here (it is bounded) and handed on: a limit hit while the route itself
    reads would reach FastAPI's body parsing, which answers any error there as a 400.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        try:
            body = await read_body(scope, receive, self.max_bytes)
            check_json_body(body)
        except Disconnected:
            return
        except GatewayError as exc:
            await exc.response()(scope, receive, send)
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)

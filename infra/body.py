"""A request body bounded before any route reads it, for the services that are not the gateway.

:class:`BodyBound` sits in front of an app (the engine, the recorder's API, the web view): a request
whose ``Content-Length`` is over ``max_bytes`` is answered 413 before a byte of its body is read, and a
body without one (chunked) is counted as it comes and answered 413 as soon as it passes the limit (the
server discards what the client still sends, holding none of it); a request within the limit reaches
the app with its body replayed whole. So an unauthenticated client
costs at most ``max_bytes`` of memory per request whatever it sends. The gateway has its own door with
the same rule and its JSON limits (``gateway.body.BodyLimit``).
"""

from __future__ import annotations

from collections.abc import Callable

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infra.http import error_body


def openai_too_large(max_bytes: int) -> bytes:
    """The 413's body in OpenAI's error shape (the default)."""
    message = f"request body over {max_bytes} bytes"
    return orjson.dumps(error_body(message, "invalid_request_error", code="body_too_large"))


def declared_length(scope: Scope) -> int:
    """The request's Content-Length, 0 when absent or unreadable (the body is then counted as it comes)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


class BodyBound:
    """The bound (module docstring); ``answer`` writes the 413's JSON body (a service's own error shape)."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, answer: Callable[[int], bytes] = openai_too_large
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.answer = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if declared_length(scope) > self.max_bytes:
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk: bytes = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        body = self.answer(self.max_bytes)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})

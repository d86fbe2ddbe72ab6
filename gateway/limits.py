"""Limits applied at the door, before any work: JSON depth and size, header size and count.

Why these numbers:

- ``MAX_JSON_DEPTH = 64``: the deepest real OpenAI request is a tool's JSON Schema inside
  ``tools[].function.parameters`` (a dozen levels or so for nested objects); 64 leaves room for that
  and stays far below what the encoders accept: orjson, which re-encodes every body for the upstream
  and the recorded event (that event wraps the body a few levels deeper), refuses more than 254
  levels, and the standard library's parser recurses in C up to Python's recursion limit. A body
  that nests deeper is refused with 400 ``json_too_deep`` instead of failing later with a 500.
- ``MAX_JSON_ITEMS = 262_144`` members in one array or object: a completions prompt of 128k token
  ids fits twice; more is a body built to burn CPU in the validator. Strings are bounded by the body
  limit (``GatewaySettings.max_body_bytes``, 8 MiB by default) and nothing else.
- Integers fit in 64 bits (``-2**63`` to ``2**64 - 1``): orjson writes no larger ones, and every
  body is recorded with orjson. Routes whose body FastAPI parses (the standard library, which keeps
  integers of any size) would otherwise fail late with a 500 (found by the fuzzer: an AGL event whose
  ``data`` held ``14556506565315812917248``). A body with a run of 19 digits or more is parsed with
  the standard library and walked; one with such an integer is refused with 400
  ``integer_out_of_range`` (the hot routes parse with orjson, which reads such an integer as a float).
- Headers: at most ``MAX_HEADERS = 100`` and ``MAX_HEADER_BYTES = 32 KiB`` in all (request line
  included), answered 431 by :class:`GatewayHttpProtocol` while they are still being read (uvicorn's
  httptools protocol has no such limit: a 200 KB header and 2,000 headers were accepted).

Protocol errors uvicorn detects itself (bad header bytes, conflicting ``Content-Length`` and
``Transfer-Encoding: chunked``, a malformed request line) are answered by
:class:`GatewayHttpProtocol` in OpenAI's JSON error format instead of uvicorn's plain text.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.errors import InvalidRequestError, PayloadTooLargeError
from infra.http import error_body

MAX_JSON_DEPTH = 64
MAX_JSON_ITEMS = 262_144
MAX_HEADERS = 100
MAX_HEADER_BYTES = 32 * 1024
INT_RANGE = range(-(1 << 63), 1 << 64)
_LONG_DIGITS = re.compile(rb"[0-9]{19,}")  # -2**63 - 1 has 19 digits


def check_json(data: Any, raw: bytes) -> None:
    """Raise a 4xx if ``data`` (parsed from ``raw``) nests deeper than ``MAX_JSON_DEPTH`` or holds an
    array or object of more than ``MAX_JSON_ITEMS`` members.

    Byte counts decide first, at C speed: a body with fewer than ``MAX_JSON_DEPTH`` brackets cannot
    nest that deep, one with fewer commas holds no container that large. Only a body that might break
    a limit is walked (iteratively: the walk itself must not recurse).
    """
    brackets = raw.count(b"[") + raw.count(b"{")
    commas = raw.count(b",")
    if brackets < MAX_JSON_DEPTH and commas < MAX_JSON_ITEMS:
        return
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        members = node.values() if isinstance(node, dict) else node
        if len(node) > MAX_JSON_ITEMS:
            raise PayloadTooLargeError(
                f"a JSON array or object in the body has more than {MAX_JSON_ITEMS} members",
                code="json_too_large",
            )
        for child in members:
            if isinstance(child, dict | list) and child:
                if depth + 1 > MAX_JSON_DEPTH:
                    raise InvalidRequestError(
                        f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels", code="json_too_deep"
                    )
                stack.append((child, depth + 1))


def too_deep_for_parser(exc: orjson.JSONDecodeError) -> bool:
    """orjson refused the body for its nesting (over 1024 levels), not for its syntax."""
    message = str(exc).lower()
    return "depth limit" in message or "recursion" in message


def check_int_range(raw: bytes) -> None:
    """Refuse a JSON body holding an integer that orjson cannot write (see the module's notes)."""
    if _LONG_DIGITS.search(raw) is None:
        return
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return  # not JSON (or nested past what the check above admits): left to the route
    stack: list[Any] = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, int) and node not in INT_RANGE:
            raise InvalidRequestError(
                "the JSON body holds an integer outside the 64-bit range", code="integer_out_of_range"
            )


def _error_response(status: int, reason: bytes, message: str, code: str) -> bytes:
    kind = "invalid_request_error"
    body = orjson.dumps(error_body(message, kind, code=code))
    return b"".join(
        (
            b"HTTP/1.1 %d %s\r\n" % (status, reason),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        )
    )


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header limits and OpenAI-format protocol errors."""

    _head_bytes = 0  # bytes received while a request head is being read
    _head_size = 0  # bytes of the header fields parsed so far
    _header_count = 0
    _in_head = True

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes, self._head_size, self._header_count, self._in_head = 0, 0, 0, True

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            # Still inside a request head after this read: count it, so a header that never ends
            # cannot grow the parser's buffer without bound (a read's body bytes are not counted:
            # the head was complete by then).
            self._head_bytes += len(data)
            if self._head_bytes > 2 * MAX_HEADER_BYTES:
                self._reject_headers()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._head_size += len(name) + len(value) + 4
        if self._header_count > MAX_HEADERS or self._head_size > MAX_HEADER_BYTES:
            raise _HeadersTooLarge
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def _reject_headers(self) -> None:
        if self.transport.is_closing():
            return
        self.transport.write(
            _error_response(
                431,
                b"Request Header Fields Too Large",
                f"request headers over {MAX_HEADERS} fields or {MAX_HEADER_BYTES} bytes",
                "headers_too_large",
            )
        )
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        if self._header_count > MAX_HEADERS or self._head_size > MAX_HEADER_BYTES:
            self._reject_headers()
            return
        if self.transport.is_closing():
            return
        self.transport.write(
            _error_response(400, b"Bad Request", f"malformed HTTP request: {msg}", "invalid_http")
        )
        self.transport.close()


class _HeadersTooLarge(Exception):
    """Raised from a parser callback: httptools turns it into a parser error, answered 431 above."""

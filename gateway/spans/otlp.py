"""OTLP/HTTP trace payloads → :class:`schemas.AgentSpan`, decoded with the ``opentelemetry-proto`` package.

Both encodings of the OTLP/HTTP spec are read: binary protobuf (``application/x-protobuf``) and
OTLP/JSON (``application/json``: protobuf's JSON mapping, except that trace and span ids are hex,
not base64, and that unknown fields are ignored), each optionally ``Content-Encoding: gzip``. Free of
the HTTP framework: :func:`decode_request` takes the body and two headers and raises the gateway's
own errors, which the route turns into OpenAI-format bodies:

    PayloadTooLargeError   413  body (or, gzipped, its inflated size) over the intake's limit
    InvalidRequestError    400  not protobuf / not OTLP JSON / gzip that does not inflate / a span
                                without a 16-byte trace id or an 8-byte span id / no spans
    UnsupportedMediaError  415  a content type other than the two above

Each decoded span keeps its resource's and scope's attributes apart (:class:`DecodedSpan`), because
the episode a span belongs to may be named on the resource (``flywheel.episode_id``,
``gen_ai.conversation.id``, ``session.id``) rather than on every span.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from pydantic import JsonValue

from gateway.errors import InvalidRequestError, PayloadTooLargeError, UnsupportedMediaError
from schemas import AgentSpan, AgentSpanEvent
from schemas.spans import MAX_ATTRIBUTE_CHARS, SpanKindName

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MAX_ATTRIBUTES = 128  # per span, per event, per resource: the OpenTelemetry SDK's own default limit
MAX_EVENTS = 128
MAX_ARRAY_ITEMS = 128
MAX_DEPTH = 8  # nested arrays / key-value lists inside one attribute value
_KINDS: dict[int, SpanKindName] = {
    Span.SPAN_KIND_UNSPECIFIED: "unspecified",
    Span.SPAN_KIND_INTERNAL: "internal",
    Span.SPAN_KIND_SERVER: "server",
    Span.SPAN_KIND_CLIENT: "client",
    Span.SPAN_KIND_PRODUCER: "producer",
    Span.SPAN_KIND_CONSUMER: "consumer",
}
_STATUS: dict[int, Literal["unset", "ok", "error"]] = {
    Status.STATUS_CODE_UNSET: "unset",
    Status.STATUS_CODE_OK: "ok",
    Status.STATUS_CODE_ERROR: "error",
}


@dataclass(frozen=True, slots=True)
class DecodedSpan:
    span: AgentSpan
    resource: Mapping[str, JsonValue]  # the resource's attributes (service.name, and maybe the episode)


def decode_request(
    body: bytes, content_type: str, content_encoding: str, max_bytes: int
) -> list[DecodedSpan]:
    """Every span of one OTLP/HTTP export request, in the order sent; raises the errors above."""
    if len(body) > max_bytes:
        raise PayloadTooLargeError(f"OTLP body over {max_bytes} bytes", code="body_too_large")
    encoding = content_encoding.strip().lower()
    if encoding == "gzip":
        body = _gunzip(body, max_bytes)
    elif encoding not in ("", "identity"):
        raise InvalidRequestError(
            f"unsupported Content-Encoding {encoding[:32]!r} (gzip or none)", code="unsupported_encoding"
        )
    media = content_type.split(";", 1)[0].strip().lower()
    if media == PROTOBUF:
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except (DecodeError, RuntimeError, ValueError) as exc:
            raise InvalidRequestError(
                f"not an OTLP ExportTraceServiceRequest (protobuf): {str(exc)[:200]}", code="invalid_otlp"
            ) from None
    elif media == JSON:
        request = _from_json(body)
    else:
        raise UnsupportedMediaError(
            f"Content-Type {media[:64]!r}: OTLP/HTTP is {PROTOBUF} or {JSON}", code="unsupported_media_type"
        )
    spans = list(_spans(request))
    if not spans:
        raise InvalidRequestError("the OTLP request holds no spans", code="no_spans")
    return spans


def _gunzip(body: bytes, max_bytes: int) -> bytes:
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflate.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise InvalidRequestError(f"gzip body does not inflate: {exc}", code="invalid_gzip") from None
    if len(out) > max_bytes or inflate.unconsumed_tail:
        raise PayloadTooLargeError(f"OTLP body over {max_bytes} bytes once inflated", code="body_too_large")
    return out


# ------------------------------------------------------------------------------------- JSON


def _from_json(body: bytes) -> ExportTraceServiceRequest:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"malformed JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise InvalidRequestError("OTLP JSON must be an object with resourceSpans", code="invalid_otlp")
    try:
        for rs in _items(data, "resourceSpans", "resource_spans"):
            for ss in _items(rs, "scopeSpans", "scope_spans"):
                for span in _items(ss, "spans"):
                    _hex_ids(span)
                    for link in _items(span, "links"):
                        _hex_ids(link)
        request = ExportTraceServiceRequest()
        json_format.ParseDict(data, request, ignore_unknown_fields=True, max_recursion_depth=64)
    except (json_format.ParseError, _BadId, TypeError, ValueError) as exc:
        raise InvalidRequestError(f"not OTLP JSON: {str(exc)[:300]}", code="invalid_otlp") from None
    return request


class _BadId(ValueError):
    pass


def _items(obj: object, *names: str) -> list[dict[str, Any]]:
    if not isinstance(obj, dict):
        raise _BadId("expected an object")
    for name in names:
        value = obj.get(name)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise _BadId(f"{name} must be a list of objects")
        return cast(list[dict[str, Any]], value)
    return []


def _hex_ids(obj: dict[str, Any]) -> None:
    """OTLP/JSON writes ids as hex; protobuf's JSON mapping reads bytes as base64: convert in place."""
    for camel, snake in (("traceId", "trace_id"), ("spanId", "span_id"), ("parentSpanId", "parent_span_id")):
        for key in (camel, snake):
            value = obj.get(key)
            if value is None or value == "":
                continue
            if not isinstance(value, str):
                raise _BadId(f"{key} must be a hex string")
            try:
                obj[key] = base64.b64encode(bytes.fromhex(value)).decode()
            except ValueError:
                raise _BadId(f"{key} is not hex: {value[:40]!r}") from None


# ----------------------------------------------------------------------------------- spans


def _spans(request: ExportTraceServiceRequest) -> Iterable[DecodedSpan]:
    for rs in request.resource_spans:
        resource = _attributes(rs.resource.attributes)
        service = resource.get("service.name")
        for ss in rs.scope_spans:
            for span in ss.spans:
                yield DecodedSpan(
                    _span(span, ss.scope.name, service if isinstance(service, str) else ""), resource
                )


def _hex(raw: bytes, size: int, what: str, name: str) -> str:
    if len(raw) != size or not any(raw):
        raise InvalidRequestError(
            f"span {name[:80]!r}: {what} must be {size} bytes, not all zero (got {len(raw)})",
            code="invalid_span_id",
        )
    return binascii.hexlify(raw).decode()


# the event log keeps times as ClickHouse DateTime64(6), whose last instant is 2299-12-31 23:59:59.999999
LAST_NS = int(datetime(2299, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()) * 10**9 + 999_999_000


def _time(ns: int, what: str = "time", name: str = "") -> datetime:
    if ns > LAST_NS:
        raise InvalidRequestError(
            f"span {name[:80]!r}: {what} ({ns} ns) is past 2299-12-31, the last instant the event log keeps",
            code="invalid_timestamp",
        )
    return datetime.fromtimestamp(ns / 1e9, UTC)


def _span(span: Span, scope: str, service: str) -> AgentSpan:
    trace_id = _hex(span.trace_id, 16, "trace_id", span.name)
    span_id = _hex(span.span_id, 8, "span_id", span.name)
    parent = _hex(span.parent_span_id, 8, "parent_span_id", span.name) if span.parent_span_id else None
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    return AgentSpan(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        name=span.name[:1024],
        kind=_KINDS.get(span.kind, "unspecified"),
        start_time=_time(start, "start_time_unix_nano", span.name),
        end_time=_time(max(end, start), "end_time_unix_nano", span.name),
        duration_ms=max(0, end - start) / 1e6,
        status=_STATUS.get(span.status.code, "unset"),
        status_message=span.status.message[:MAX_ATTRIBUTE_CHARS],
        attributes=_attributes(span.attributes),
        events=[
            AgentSpanEvent(
                name=e.name[:256],
                time=_time(e.time_unix_nano, "an event's time_unix_nano", span.name),
                attributes=_attributes(e.attributes),
            )
            for e in span.events[:MAX_EVENTS]
        ],
        scope=scope[:256],
        service_name=service[:256],
    )


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, JsonValue]:
    out: dict[str, JsonValue] = {}
    for kv in pairs:
        if len(out) >= MAX_ATTRIBUTES:
            break
        out[kv.key[:256]] = _value(kv.value, 0)
    return out


def _value(value: AnyValue, depth: int) -> JsonValue:
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value[:MAX_ATTRIBUTE_CHARS]
    if which == "bool_value":
        return value.bool_value
    if which == "int_value":
        return value.int_value
    if which == "double_value":
        number = value.double_value
        return number if number == number and abs(number) != float("inf") else str(number)
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value[:MAX_ATTRIBUTE_CHARS]).decode()
    if depth >= MAX_DEPTH:
        return None
    if which == "array_value":
        return [_value(v, depth + 1) for v in value.array_value.values[:MAX_ARRAY_ITEMS]]
    if which == "kvlist_value":
        return {
            kv.key[:256]: _value(kv.value, depth + 1) for kv in value.kvlist_value.values[:MAX_ARRAY_ITEMS]
        }
    return None

"""The gateway's OTLP intake (gateway/spans/otlp.py, gateway/spans/intake.py): decoding, validation, the two
ways in (the episode's URL, a tenant key), tenant isolation, and its 4xx answers.

Payloads come from the OpenTelemetry SDK itself (its spans, encoded by the OTLP exporter's own
encoder) or, for OTLP/JSON, written as the spec's examples are; the gateway is the real app on the
in-process bus, in front of a canned upstream.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags

from flywheel.cli.episodes_cmd import print_spans
from gateway.errors import InvalidRequestError, PayloadTooLargeError, UnsupportedMediaError
from gateway.spans.intake import MAX_EVENT_BYTES, THREAD_ABOVE_BYTES, _chunks
from gateway.spans.otlp import JSON, PROTOBUF, decode_request
from infra.otel.spans import trace_id_for
from schemas import AgentSpan, AgentSpansRecorded, LLMCallRecorded
from tests.fakes.gateway_harness import GatewayHarness

pytestmark = pytest.mark.timeout(30)
MSGS = [{"role": "user", "content": "hi"}]
PB = {"Content-Type": PROTOBUF}


def sdk_payload(build: Callable[[trace_api.Tracer], None], resource: dict[str, Any] | None = None) -> bytes:
    """What the SDK's OTLP/HTTP exporter would send for the spans ``build`` makes."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(resource or {"service.name": "agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    build(provider.get_tracer("test.agent"))
    provider.shutdown()
    return bytes(encode_spans(memory.get_finished_spans()).SerializeToString())


def agent_run(tracer: trace_api.Tracer, **attrs: Any) -> None:
    with tracer.start_as_current_span("agent run", attributes=attrs) as root:
        root.add_event("step", {"n": 1})
        with tracer.start_as_current_span("multiply", attributes={"tool.args": [3, 4], "ok": True}):
            pass
        with tracer.start_as_current_span("broken tool") as bad:
            bad.set_status(Status(StatusCode.ERROR, "boom"))


def continuing(episode_id: str) -> Callable[[trace_api.Tracer], None]:
    """Spans that continue the episode's trace (the trace id Flywheel's exporter derives from it)."""

    def build(tracer: trace_api.Tracer) -> None:
        parent = SpanContext(int(trace_id_for(episode_id), 16), 0x1234, True, TraceFlags(TraceFlags.SAMPLED))
        context = trace_api.set_span_in_context(NonRecordingSpan(parent))
        with tracer.start_as_current_span("tool call", context=context):
            pass

    return build


# ----------------------------------------------------------------------------- decoding


def test_sdk_protobuf_decodes_into_agent_spans_with_tree_times_status_and_attributes() -> None:
    spans = decode_request(sdk_payload(agent_run), PROTOBUF, "", 1 << 20)
    by_name = {d.span.name: d.span for d in spans}
    root, tool, bad = by_name["agent run"], by_name["multiply"], by_name["broken tool"]
    assert root.parent_span_id is None and tool.parent_span_id == bad.parent_span_id == root.span_id
    assert len({s.trace_id for s in by_name.values()}) == 1 and len(root.trace_id) == 32
    assert tool.attributes == {"tool.args": [3, 4], "ok": True}
    assert tool.start_time >= root.start_time and tool.end_time <= root.end_time
    assert root.duration_ms >= tool.duration_ms >= 0
    assert bad.status == "error" and bad.status_message == "boom" and tool.status == "unset"
    assert [e.name for e in root.events] == ["step"] and root.events[0].attributes == {"n": 1}
    assert root.scope == "test.agent" and root.service_name == "agent" and root.kind == "internal"
    assert spans[0].resource["service.name"] == "agent"


def test_otlp_json_reads_hex_ids_string_nanos_and_ignores_unknown_fields() -> None:
    body = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "lc"}}]},
                "scopeSpans": [
                    {
                        "scope": {"name": "langchain"},
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                                "parentSpanId": "eee19b7ec3c1b173",
                                "name": "search",
                                "kind": 3,
                                "startTimeUnixNano": "1544712660000000000",
                                "endTimeUnixNano": "1544712661500000000",
                                "attributes": [
                                    {"key": "n", "value": {"intValue": "7"}},
                                    {"key": "kv", "value": {"kvlistValue": {"values": [
                                        {"key": "a", "value": {"doubleValue": 0.5}}
                                    ]}}},
                                ],
                                "status": {"code": 2, "message": "no"},
                                "futureField": {"x": 1},
                            }
                        ],
                    }
                ],
            }
        ]
    }  # fmt: skip
    (decoded,) = decode_request(orjson.dumps(body), "application/json; charset=utf-8", "", 1 << 20)
    span = decoded.span
    assert span.trace_id == "5b8efff798038103d269b633813fc60c" and span.span_id == "eee19b7ec3c1b174"
    assert span.parent_span_id == "eee19b7ec3c1b173" and span.kind == "client" and span.status == "error"
    assert span.duration_ms == 1500.0 and span.attributes == {"n": 7, "kv": {"a": 0.5}}
    assert span.service_name == "lc" and span.scope == "langchain"


def test_gzip_inflates_and_a_bomb_is_too_large() -> None:
    raw = sdk_payload(agent_run)
    assert len(decode_request(gzip.compress(raw), PROTOBUF, "gzip", 1 << 20)) == 3
    with pytest.raises(PayloadTooLargeError):
        decode_request(gzip.compress(b"\0" * (2 << 20)), PROTOBUF, "gzip", 1 << 20)


@pytest.mark.parametrize(
    ("body", "ctype", "encoding", "error", "code"),
    [
        (b"\xff\xff\xff not protobuf", PROTOBUF, "", InvalidRequestError, "invalid_otlp"),
        (b"{not json", JSON, "", InvalidRequestError, "invalid_json"),
        (b"[1, 2]", JSON, "", InvalidRequestError, "invalid_otlp"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "01"}]}]}]}',
         JSON, "", InvalidRequestError, "invalid_otlp"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "0102", "spanId": "0102030405060708",'
         b' "name": "short"}]}]}]}', JSON, "", InvalidRequestError, "invalid_span_id"),
        (b'{"resourceSpans": []}', JSON, "", InvalidRequestError, "no_spans"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "5b8efff798038103d269b633813fc60c",'
         b' "spanId": "eee19b7ec3c1b174", "name": "late", "startTimeUnixNano": "18000000000000000000"}]}]}]}',
         JSON, "", InvalidRequestError, "invalid_timestamp"),
        (b'{"resourceSpans": "x"}', JSON, "", InvalidRequestError, "invalid_otlp"),
        (b"not gzip", PROTOBUF, "gzip", InvalidRequestError, "invalid_gzip"),
        (b"{}", JSON, "br", InvalidRequestError, "unsupported_encoding"),
        (b"{}", "text/plain", "", UnsupportedMediaError, "unsupported_media_type"),
        (b"x" * 2048, PROTOBUF, "", PayloadTooLargeError, "body_too_large"),
    ],
)  # fmt: skip
def test_malformed_or_oversized_payloads_are_refused(
    body: bytes, ctype: str, encoding: str, error: type[Exception], code: str
) -> None:
    with pytest.raises(error) as caught:
        decode_request(body, ctype, encoding, 1024)
    assert type(caught.value) is error and getattr(caught.value, "code", None) == code


def test_events_are_split_to_stay_under_the_broker_limit() -> None:
    big = decode_request(sdk_payload(agent_run), PROTOBUF, "", 1 << 20)[0].span
    fat = big.model_copy(update={"attributes": {f"k{i}": "v" * 8000 for i in range(12)}})  # ~96 KB
    chunks = list(_chunks([fat] * 5 + [big]))
    assert [len(c) for c in chunks] == [2, 2, 2]
    assert all(
        len(AgentSpansRecorded(episode_id="e", spans=c).model_dump_json()) < MAX_EVENT_BYTES + 512
        for c in chunks
    )
    huge = big.model_copy(update={"attributes": {f"k{i}": "v" * 8000 for i in range(128)}})
    (alone,) = list(_chunks([huge]))
    assert alone[0].attributes == {"flywheel.attributes_dropped": 128} and alone[0].span_id == big.span_id


# ------------------------------------------------------------------------------- HTTP


async def _spans_of(h: GatewayHarness, episode_id: str, count: int = 1) -> list[AgentSpansRecorded]:
    return await h.events.wait_for(
        lambda e: isinstance(e, AgentSpansRecorded) and e.episode_id == episode_id, count=count
    )


async def test_the_episode_url_takes_the_agents_spans_for_its_episode(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    async with GatewayHarness(tmp_path) as h:
        episode_id = await h.open_episode()
        r = await h.client.post(
            f"/episodes/{episode_id}/v1/traces", content=sdk_payload(agent_run), headers=PB
        )
        assert r.status_code == 200 and r.headers["content-type"] == PROTOBUF
        reply = ExportTraceServiceResponse.FromString(r.content)
        assert reply.partial_success.rejected_spans == 0
        (event,) = await _spans_of(h, episode_id)
        assert event.via == "ticket" and event.matched_by == "url" and len(event.spans) == 3
        assert {s.name for s in event.spans} == {"agent run", "multiply", "broken tool"}
        shown = (
            await h.client.get(
                f"/admin/episodes/{episode_id}", headers={"Authorization": "Bearer test-admin"}
            )
        ).json()
        assert shown["spans"][0]["name"] == "agent run"
        print_spans(shown["spans"])  # what `flywheel episodes show` prints after the calls
        printed = capsys.readouterr().out
        assert "  multiply" in printed and "3 span(s) from the agent" in printed

        unknown = await h.client.post("/episodes/" + "0" * 32 + "/v1/traces", content=b"x", headers=PB)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "episode_not_found"
        bad = await h.client.post(f"/episodes/{episode_id}/v1/traces", content=b"\xff\xff", headers=PB)
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


async def test_a_tenant_key_attaches_spans_only_to_its_own_tenants_episodes(tmp_path: Any) -> None:
    async with GatewayHarness(tmp_path) as h:
        _, key_a = h.keystore.create("acme")
        _, key_b = h.keystore.create("globex")
        a = {"Authorization": f"Bearer {key_a}", **PB}
        b = {"Authorization": f"Bearer {key_b}", **PB}
        call = await h.client.post(
            "/v1/chat/completions", json={"messages": MSGS}, headers={**a, "X-Flywheel-Session": "s1"}
        )
        ep_a = call.headers["X-Flywheel-Episode"]
        await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded))
        training = await h.open_episode()

        def named(episode: str) -> bytes:
            return sdk_payload(lambda t: agent_run(t, **{"gen_ai.conversation.id": episode}))

        # tenant B's key cannot attach to tenant A's episode, by any means; nothing is recorded
        for payload in (named(ep_a), sdk_payload(continuing(ep_a)), named(training)):
            refused = await h.client.post("/v1/traces", content=payload, headers=b)
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["code"] == "episode_not_yours"
        by_session = sdk_payload(agent_run, {"service.name": "agent", "session.id": "s1"})
        assert (await h.client.post("/v1/traces", content=by_session, headers=b)).status_code == 404
        assert (await h.client.post("/v1/traces", content=named(ep_a), headers=PB)).status_code == 401
        wrong = {"Authorization": "Bearer nope", **PB}
        assert (await h.client.post("/v1/traces", content=named(ep_a), headers=wrong)).status_code == 401

        # tenant A's key: by attribute, by session, by the episode's trace context
        assert (await h.client.post("/v1/traces", content=named(ep_a), headers=a)).status_code == 200
        assert (await h.client.post("/v1/traces", content=by_session, headers=a)).status_code == 200
        assert (
            await h.client.post("/v1/traces", content=sdk_payload(continuing(ep_a)), headers=a)
        ).is_success
        events = await _spans_of(h, ep_a, count=3)
        assert [e.matched_by for e in events] == ["attribute", "session", "trace"]
        assert {e.via for e in events} == {"tenant_key"} and {e.tenant for e in events} == {"acme"}
        assert events[2].spans[0].trace_id == trace_id_for(ep_a)
        assert not [
            e for e in h.events.events if isinstance(e, AgentSpansRecorded) and e.episode_id == training
        ]

        # OTLP/JSON, with a span that matches nothing: recorded in part, the rest refused as OTLP says
        two = {
            "resourceSpans": [{"scopeSpans": [{"spans": [
                {"traceId": "11" * 16, "spanId": "22" * 8, "name": "mine", "startTimeUnixNano": "1",
                 "endTimeUnixNano": "2", "attributes": [{"key": "flywheel.episode_id",
                                                         "value": {"stringValue": ep_a}}]},
                {"traceId": "33" * 16, "spanId": "44" * 8, "name": "stray"},
            ]}]}]
        }  # fmt: skip
        partial = await h.client.post(
            "/v1/traces", content=orjson.dumps(two), headers={"x-api-key": key_a, "Content-Type": JSON}
        )
        assert partial.status_code == 200, partial.text
        assert partial.json()["partialSuccess"]["rejectedSpans"] == "1"
        last = (await _spans_of(h, ep_a, count=4))[-1]
        assert [s.name for s in last.spans] == ["mine"]


async def test_oversized_otlp_bodies_get_413_in_the_gateways_error_format(tmp_path: Any) -> None:
    async with GatewayHarness(tmp_path, otlp_max_body_bytes=4096) as h:
        episode_id = await h.open_episode()
        payload = sdk_payload(lambda t: agent_run(t, blob="x" * 8000))
        r = await h.client.post(f"/episodes/{episode_id}/v1/traces", content=payload, headers=PB)
        assert r.status_code == 413
        assert r.json()["error"] == {
            "message": "OTLP body over 4096 bytes",
            "type": "invalid_request_error",
            "code": "body_too_large",
            "param": None,
        }
        small = sdk_payload(agent_run)
        assert (
            await h.client.post(f"/episodes/{episode_id}/v1/traces", content=small, headers=PB)
        ).is_success
        media = await h.client.post(
            f"/episodes/{episode_id}/v1/traces", content=small, headers={"Content-Type": "text/plain"}
        )
        assert media.status_code == 415


def test_agent_span_ids_are_checked() -> None:
    with pytest.raises(ValueError):
        AgentSpan.model_validate(
            {
                "trace_id": "XYZ",
                "span_id": "01" * 8,
                "name": "n",
                "start_time": 0,
                "end_time": 0,
                "duration_ms": 0,
            }
        )


async def test_a_large_export_is_decoded_off_the_loop_and_split_into_events(tmp_path: Any) -> None:
    def many(tracer: trace_api.Tracer) -> None:
        with tracer.start_as_current_span("agent run"):
            for i in range(299):
                with tracer.start_as_current_span(f"step {i}", attributes={"input.value": "x" * 1000}):
                    pass

    payload = sdk_payload(many)
    assert len(payload) > THREAD_ABOVE_BYTES
    async with GatewayHarness(tmp_path) as h:
        episode_id = await h.open_episode()
        r = await h.client.post(f"/episodes/{episode_id}/v1/traces", content=payload, headers=PB)
        assert r.status_code == 200
        events = await _spans_of(h, episode_id, count=2)
        assert sum(len(e.spans) for e in events) == 300
        assert all(len(e.model_dump_json()) < MAX_EVENT_BYTES + 1024 for e in events)

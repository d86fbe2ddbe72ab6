"""The OpenTelemetry export's mapping and its consumer, with the SDK's own in-memory exporter.

The exporter runs on the in-process bus and hands its spans to the real OpenTelemetry SDK (a
``SimpleSpanProcessor`` into ``InMemorySpanExporter``, both the SDK's): ids, parents, attributes and
events are read back as any OTLP exporter would send them. Against a live Arize Phoenix:
``tests/e2e/test_otel_phoenix.py``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from infra.bus.memory import MemoryBus
from infra.otel.exporter import OtelExporter, SpanWriter, traces_url
from infra.otel.forward import ExportForwarder
from infra.otel.settings import OtelSettings
from infra.otel.spans import call_span, call_span_id, episode_span_id, trace_id_for
from schemas import (
    EPISODES,
    TRANSITIONS,
    AgentKind,
    AgentRef,
    AgentSpan,
    AgentSpansRecorded,
    CallChoice,
    EpisodeFinished,
    EpisodeScored,
    EpisodeSource,
    EpisodeStarted,
    EpisodeStatus,
    LLMCallRecorded,
    RewardOrigin,
    RewardReported,
    Transition,
)
from schemas.ids import new_episode_id

pytestmark = pytest.mark.timeout(60)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def call(ep: str, seq: int, **kw: object) -> LLMCallRecorded:
    fields: dict[str, object] = {
        "episode_id": ep,
        "call_seq": seq,
        "call_id": f"call-{seq}",
        "model": "policy",
        "request": json.dumps(
            {"model": "policy", "messages": [{"role": "user", "content": "secret question"}]}
        ),
        "response": json.dumps({"id": f"chatcmpl-{seq}", "model": "policy-v1"}),
        "choices": [
            CallChoice(
                index=0,
                message={"role": "assistant", "content": "secret answer"},
                finish_reason="stop",
                token_ids=[5, 6],
                logprobs=[-0.5, -1.5],
            )
        ],
        "prompt_tokens": 7,
        "completion_tokens": 2,
        "latency_ms": 20.0,
        "started_at": T0 + timedelta(seconds=seq),
        "emitted_at": T0 + timedelta(seconds=seq, milliseconds=25),
        "weight_version": 3,
        "prompt_version": "p2",
        "token_faithful": True,
        "extends_previous": seq > 0 or None,
    }
    fields.update(kw)
    return LLMCallRecorded(**fields)


def scored(ep: str, **kw: object) -> EpisodeScored:
    fields: dict[str, object] = {
        "episode_id": ep,
        "group_id": "g",
        "reward": 0.75,
        "reward_source": "exact",
        "score_note": "expected 5",
        "num_calls": 2,
        "transitions": [
            Transition(
                prompt_ids=[1],
                response_ids=[2, 3],
                response_mask=[1, 1],
                behaviour_logprobs=[0.0, 0.0],
                weight_version=3,
                call_seqs=[0, 1],
                prompt_version="p2",
            )
        ],
    }
    fields.update(kw)
    return EpisodeScored(**fields)


def test_an_episodes_spans_share_one_trace_derived_from_its_id() -> None:
    ep = new_episode_id()
    span = call_span(call(ep, 0))
    assert f"{span.trace_id:032x}" == trace_id_for(ep) != trace_id_for(new_episode_id())
    assert span.parent_span_id == episode_span_id(ep) and span.span_id == call_span_id(ep, "call-0")
    assert trace_id_for(ep) == trace_id_for(ep)  # the same in any process, at any time


def test_call_span_carries_genai_attributes_and_content_only_when_asked() -> None:
    ep = new_episode_id()
    plain = call_span(
        call(ep, 1, request=json.dumps({"model": "policy", "messages": [], "temperature": 0.7}))
    )
    a = plain.attributes
    assert plain.name == "chat policy" and plain.kind == "client"
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.conversation.id"] == ep
    assert a["gen_ai.request.model"] == "policy" and a["gen_ai.response.model"] == "policy-v1"
    assert a["gen_ai.usage.input_tokens"] == 7 and a["gen_ai.usage.output_tokens"] == 2
    assert a["gen_ai.response.finish_reasons"] == ["stop"] and a["gen_ai.request.temperature"] == 0.7
    assert a["flywheel.weight_version"] == 3 and a["flywheel.prompt_version"] == "p2"
    assert a["flywheel.token_faithful"] is True and a["flywheel.extends_previous"] is True
    assert a["flywheel.logprob.mean"] == -1.0 and a["flywheel.logprob.min"] == -1.5
    assert plain.end_ns - plain.start_ns == 20_000_000
    assert not any("secret" in str(v) for v in a.values())  # content stays home by default
    content = call_span(call(ep, 0), capture_content=True).attributes
    assert json.loads(str(content["gen_ai.input.messages"])) == [
        {"role": "user", "parts": [{"type": "text", "content": "secret question"}]}
    ]
    assert json.loads(str(content["gen_ai.output.messages"]))[0]["parts"][0]["content"] == "secret answer"
    lora = call_span(call(ep, 4, adapter="sql", adapter_version=2)).attributes
    assert lora["flywheel.adapter"] == "sql" and lora["flywheel.adapter_version"] == 2
    assert "flywheel.adapter" not in a  # the base alone served it
    completion = call_span(call(ep, 2, endpoint="completions", request='{"model": "m", "prompt": "x"}'))
    assert completion.name == "text_completion m"
    failed = call_span(call(ep, 3, status_code=502, error="upstream down", choices=[]))
    assert failed.error == "upstream down" and failed.attributes["error.type"] == "502"


@pytest.fixture
async def export() -> AsyncIterator[tuple[MemoryBus, InMemorySpanExporter, OtelExporter]]:
    memory = InMemorySpanExporter()
    async with MemoryBus() as bus:
        exporter = OtelExporter(
            bus,
            SpanWriter(SimpleSpanProcessor(memory), service_name="test"),
            score_wait_s=0.2,
            sweep_interval_s=0.05,
        )
        await exporter.start()
        yield bus, memory, exporter
        await exporter.stop()


async def spans_when(
    memory: InMemorySpanExporter, ready: Callable[[list[ReadableSpan]], bool]
) -> list[ReadableSpan]:
    for _ in range(500):
        spans = list(memory.get_finished_spans())
        if ready(spans):
            return spans
        await asyncio.sleep(0.02)  # the consumer runs on the bus's tasks: poll what it exported
    raise AssertionError(f"the spans expected did not come in 10 s: {[s.name for s in spans]}")


async def test_an_episode_becomes_a_root_span_with_its_calls_and_evaluations(
    export: tuple[MemoryBus, InMemorySpanExporter, OtelExporter],
) -> None:
    bus, memory, _ = export
    ep = new_episode_id()
    agent = AgentRef(kind=AgentKind.callable, spec="pkg.agent:run")
    await bus.publish(EPISODES, EpisodeStarted(episode_id=ep, agent=agent, group_id="g", emitted_at=T0))
    await bus.publish(EPISODES, call(ep, 0))
    await bus.publish(EPISODES, call(ep, 1))
    await bus.publish(
        EPISODES, RewardReported(episode_id=ep, value=1.0, call_seq=1, origin=RewardOrigin.agent)
    )
    await bus.publish(
        EPISODES,
        EpisodeFinished(episode_id=ep, status=EpisodeStatus.ok, emitted_at=T0 + timedelta(seconds=3)),
    )
    await bus.publish(TRANSITIONS, scored(ep))
    spans = await spans_when(memory, lambda s: len(s) == 3)
    root = next(s for s in spans if s.parent is None)
    assert root.name == "invoke_agent pkg.agent:run" and root.kind is SpanKind.INTERNAL
    assert root.context is not None and f"{root.context.trace_id:032x}" == trace_id_for(ep)
    assert root.start_time == int(T0.timestamp() * 1e9) and root.end_time == root.start_time + 3_000_000_000
    assert root.resource.attributes["service.name"] == "test"
    a = root.attributes or {}
    assert a["gen_ai.conversation.id"] == ep and a["flywheel.reward"] == 0.75
    assert a["flywheel.transitions"] == 1 and a["flywheel.merged_calls"] == 1
    assert a["flywheel.weight_versions"] == ("3",) and a["flywheel.prompt_versions"] == ("p2",)
    assert a["gen_ai.usage.input_tokens"] == 14
    evaluations = [dict(e.attributes or {}) for e in root.events if e.name == "gen_ai.evaluation.result"]
    assert [(e["gen_ai.evaluation.name"], e["gen_ai.evaluation.score.value"]) for e in evaluations] == [
        ("agent", 1.0),
        ("exact", 0.75),
    ]
    assert evaluations[0]["gen_ai.response.id"] == "chatcmpl-1"
    assert evaluations[1]["gen_ai.evaluation.explanation"] == "expected 5"
    children = [s for s in spans if s.parent is not None]
    assert {s.parent.span_id for s in children if s.parent} == {root.context.span_id}
    assert all(s.kind is SpanKind.CLIENT for s in children)


async def test_late_scores_become_evaluation_spans_and_an_unscored_episode_still_leaves(
    export: tuple[MemoryBus, InMemorySpanExporter, OtelExporter],
) -> None:
    bus, memory, _ = export
    ep = new_episode_id()
    await bus.publish(EPISODES, EpisodeStarted(episode_id=ep, source=EpisodeSource.production, tenant="acme"))
    await bus.publish(EPISODES, EpisodeFinished(episode_id=ep, status=EpisodeStatus.timeout, error="slow"))
    spans = await spans_when(memory, lambda s: len(s) == 1)  # after score_wait_s, without a score
    assert (
        spans[0].status.status_code is StatusCode.ERROR
        and (spans[0].attributes or {})["flywheel.tenant"] == "acme"
    )
    await bus.publish(TRANSITIONS, scored(ep, score_revision=1, reward=-1.0, reward_source="feedback"))
    await bus.publish(
        EPISODES, RewardReported(episode_id=ep, value=1.0, rating=5, origin=RewardOrigin.feedback)
    )
    spans = await spans_when(memory, lambda s: len(s) == 3)
    late = [s for s in spans if s.parent is not None]
    assert all(s.parent and s.parent.span_id == episode_span_id(ep) for s in late)
    names = sorted(s.name for s in late)
    assert names == ["evaluation feedback", "evaluation feedback"]
    labels = [dict(e.attributes or {}).get("gen_ai.evaluation.score.label") for s in late for e in s.events]
    assert "5" in labels


async def test_replayed_episodes_are_not_exported_again(
    export: tuple[MemoryBus, InMemorySpanExporter, OtelExporter],
) -> None:
    bus, memory, exporter = export
    ep = new_episode_id()
    await bus.publish(EPISODES, call(ep, 0, source=EpisodeSource.replay))
    await bus.publish(TRANSITIONS, scored(ep, source=EpisodeSource.replay))
    other = new_episode_id()
    await bus.publish(EPISODES, call(other, 0))
    spans = await spans_when(memory, lambda s: len(s) == 1)
    assert (spans[0].attributes or {})["gen_ai.conversation.id"] == other
    assert exporter.stats.episodes == 0


async def test_the_agents_own_spans_are_exported_under_the_episodes_span(
    export: tuple[MemoryBus, InMemorySpanExporter, OtelExporter],
) -> None:
    bus, memory, _ = export
    ep = new_episode_id()

    def sent(span_id: str, parent: str | None, name: str, ms: int, **attrs: object) -> AgentSpan:
        return AgentSpan(
            trace_id="ab" * 16,
            span_id=span_id,
            parent_span_id=parent,
            name=name,
            start_time=T0,
            end_time=T0 + timedelta(milliseconds=ms),
            duration_ms=ms,
            status="error" if name == "broken" else "unset",
            status_message="boom" if name == "broken" else "",
            attributes=attrs,
            service_name="calculator",
        )

    spans_in = [
        sent("01" * 8, None, "calculator", 90, **{"openinference.span.kind": "AGENT"}),
        sent("02" * 8, "01" * 8, "multiply", 20, args={"a": 3}, tags=["x", "y"]),
        sent("03" * 8, "01" * 8, "broken", 5),
    ]
    await bus.publish(EPISODES, AgentSpansRecorded(episode_id=ep, spans=spans_in))
    spans = await spans_when(memory, lambda s: len(s) == 3)
    by_name = {s.name: s for s in spans}
    assert {f"{s.context.trace_id:032x}" for s in spans if s.context} == {trace_id_for(ep)}
    root, tool, broken = by_name["calculator"], by_name["multiply"], by_name["broken"]
    assert root.parent is not None and root.parent.span_id == episode_span_id(ep)
    assert tool.parent is not None and tool.parent.span_id == 0x0101010101010101
    assert tool.context is not None and tool.context.span_id == 0x0202020202020202
    assert tool.end_time is not None and tool.start_time is not None
    assert tool.end_time - tool.start_time == 20_000_000
    a = tool.attributes or {}
    assert a["args"] == '{"a":3}' and a["tags"] == ("x", "y") and a["gen_ai.conversation.id"] == ep
    assert a["flywheel.agent_trace_id"] == "ab" * 16 and a["flywheel.agent_service"] == "calculator"
    assert broken.status.status_code is StatusCode.ERROR and broken.status.description == "boom"


def test_traces_url_appends_the_otlp_path_once() -> None:
    assert traces_url("http://h:6006") == "http://h:6006/v1/traces"
    assert traces_url("http://h:4318/v1/traces/") == "http://h:4318/v1/traces"


async def test_a_forwarder_whose_child_falls_behind_drops_and_counts_instead_of_blocking() -> None:
    """``infra.otel.forward``: the gateway's side of the export child. Here the child never reads its
    stdin (a stalled exporter): once the bounded buffer is full, later batches are dropped and counted,
    and every event is accounted for at once rather than waiting for the child."""
    registry = CollectorRegistry()
    async with MemoryBus() as bus:
        forwarder = ExportForwarder(
            bus,
            OtelSettings(otlp_endpoint="http://127.0.0.1:9"),
            flush_interval_s=0.01,
            max_buffer_bytes=256 * 1024,
            stop_timeout_s=1.0,
            registry=registry,
            command=[sys.executable, "-c", "import time; time.sleep(60)"],
        )
        await forwarder.start()
        big = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "x" * 100_000}]})
        ep, sent = new_episode_id(), 0
        for _round in range(10):
            for _ in range(5):
                await bus.publish(EPISODES, call(ep, sent, request=big), key=ep)
                sent += 1
            await asyncio.sleep(0.05)
        for _ in range(200):
            if forwarder.stats.events + forwarder.stats.dropped == sent:
                break
            await asyncio.sleep(0.01)
        assert forwarder.stats.events + forwarder.stats.dropped == sent
        assert 0 < forwarder.stats.events < sent  # the first batches were written, the rest dropped
        assert (
            registry.get_sample_value("flywheel_otel_forward_dropped_events_total") == forwarder.stats.dropped
        )
        await forwarder.stop()  # the child does not read to the end: killed after stop_timeout_s
        assert forwarder.stats.child_exit is not None and forwarder.stats.child_exit != 0

"""The ``otel-export`` consumer group: recorded episodes → OTLP/HTTP spans, off the gateway's hot path.

It reads ``flywheel.episodes`` (calls, rewards, the spans the agent sent the gateway's OTLP intake,
the episode's start and finish) and
``flywheel.transitions`` (scores) like any other consumer, after the gateway has answered; the gateway
does not know it exists. Each call becomes a span as soon as it is read; the episode's span leaves
when the episode is scored (or ``score_wait_s`` after it finished, without a score); a later score or
feedback becomes an evaluation span under it (``infra.otel.spans``).

Spans go through the OpenTelemetry SDK's ``BatchSpanProcessor`` to an ``OTLPSpanExporter``
(protobuf over HTTP) on the SDK's own thread: a slow or absent collector never blocks the consumer,
the queue is bounded (``max_queue``) and what does not fit is dropped (the SDK logs it). Export is best
effort past the bus: offsets are committed once the spans are queued, so spans still queued when the
process dies are lost (``stop`` flushes them). Replayed episodes (``source=replay``) are not exported
again: their spans would repeat the original episode's ids.

Run one exporter per stack: an episode's calls (keyed by episode) and its score (keyed by group)
travel on different topics, and one process must see both to join them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from infra.bus.base import Bus, Message, Subscription
from infra.logging import get_logger
from infra.otel.spans import (
    EpisodeTrace,
    SpanData,
    agent_span,
    call_span,
    episode_span,
    evaluation_span,
    reward_evaluation,
    score_evaluation,
)
from schemas import (
    EPISODES,
    TRANSITIONS,
    AgentSpansRecorded,
    EpisodeFinished,
    EpisodeScored,
    EpisodeSource,
    EpisodeStarted,
    LLMCallRecorded,
    RewardReported,
)

log = get_logger(__name__)

EXPORT_GROUP = "otel-export"
MAX_EPISODES = 50_000  # episodes kept in memory until their span leaves (the oldest go first)


def traces_url(endpoint: str) -> str:
    """``endpoint`` as an OTLP/HTTP traces URL: a base URL gets ``/v1/traces``, a full one is kept."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"


class _PresetIds(IdGenerator):
    """Hands the SDK the ids :class:`SpanWriter` chose (the SDK asks its generator for every new span)."""

    def __init__(self) -> None:
        self.trace_id = 0
        self.span_id = 0

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        return self.span_id


class SpanWriter:
    """:class:`SpanData` → SDK spans with those exact ids and times, handed to ``processor``."""

    def __init__(self, processor: SpanProcessor, *, service_name: str) -> None:
        self._ids = _PresetIds()
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": service_name}),
            id_generator=self._ids,
            sampler=ALWAYS_ON,
        )
        self.provider.add_span_processor(processor)
        self._tracer = self.provider.get_tracer("flywheel.otel")

    def write(self, data: SpanData) -> None:
        self._ids.trace_id, self._ids.span_id = data.trace_id, data.span_id
        context: Context | None = None
        if data.parent_span_id is not None:
            parent = SpanContext(
                data.trace_id,
                data.parent_span_id,
                is_remote=False,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
            context = trace_api.set_span_in_context(NonRecordingSpan(parent))
        else:
            context = Context()  # a root: never the caller's current span
        span = self._tracer.start_span(
            data.name,
            context=context,
            kind=SpanKind.CLIENT if data.kind == "client" else SpanKind.INTERNAL,
            attributes=data.attributes,
            start_time=data.start_ns,
        )
        for event in data.events:
            span.add_event(event.name, event.attributes, timestamp=event.time_ns)
        if data.error is not None:
            span.set_status(Status(StatusCode.ERROR, data.error[:1024]))
        span.end(end_time=data.end_ns)

    def flush(self, timeout_s: float = 10.0) -> bool:
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self.provider.shutdown()


@dataclass
class ExportStats:
    spans: int = 0  # handed to the SDK's queue
    episodes: int = 0  # episode spans among them
    evicted: int = 0  # episodes forgotten before their span left (MAX_EPISODES)


class OtelExporter:
    """Consumes episodes and scores as ``group`` and writes their spans with ``writer``."""

    def __init__(
        self,
        bus: Bus,
        writer: SpanWriter,
        *,
        capture_content: bool = False,
        score_wait_s: float = 30.0,
        group: str = EXPORT_GROUP,
        max_episodes: int = MAX_EPISODES,
        sweep_interval_s: float = 1.0,
    ) -> None:
        self.bus = bus
        self.writer = writer
        self.capture_content = capture_content
        self.score_wait_s = score_wait_s
        self.group = group
        self.stats = ExportStats()
        self._max_episodes = max_episodes
        self._sweep_interval_s = sweep_interval_s
        self._episodes: OrderedDict[str, EpisodeTrace] = OrderedDict()
        self._due: dict[str, float] = {}  # finished, not scored: when its span leaves unscored
        self._subs: list[Subscription] = []
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.bus.ensure_topics([EPISODES, TRANSITIONS])
        # A new group starts at the end of each topic: enabling export does not send the whole history
        for topic in (EPISODES, TRANSITIONS):
            sub = await self.bus.subscribe_batch(
                topic, self.group, self._handle, max_batch=1000, max_wait_s=0.2, from_beginning=False
            )
            self._subs.append(sub)
        self.start_sweeping()
        log.info("otel_export.started", group=self.group)

    def start_sweeping(self) -> None:
        """Send finished episodes that wait too long for their score (``start`` does it; a process that
        feeds :meth:`consume` itself, ``infra.otel.child``, calls it instead of ``start``)."""
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_loop(), name="otel-export-sweep")

    def consume(self, events: Sequence[object]) -> None:
        """Events read elsewhere (``infra.otel.child``: forwarded by the gateway's process) → spans."""
        for event in events:
            for span in self._spans_of(event):
                self.writer.write(span)
                self.stats.spans += 1

    async def stop(self) -> None:
        """Stop consuming, send the episodes still waiting for a score, flush the SDK's queue."""
        subs, self._subs = self._subs, []
        for sub in subs:
            await sub.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        for episode_id in list(self._due):
            self._export_episode(episode_id, None)
        await asyncio.to_thread(self.writer.flush)
        await asyncio.to_thread(self.writer.shutdown)
        log.info("otel_export.stopped", spans=self.stats.spans, episodes=self.stats.episodes)

    async def _handle(self, messages: Sequence[Message]) -> None:
        self.consume([message.event for message in messages])

    def _spans_of(self, event: object) -> Iterator[SpanData]:
        if isinstance(event, LLMCallRecorded):
            if event.source is EpisodeSource.replay:
                return
            span = call_span(event, capture_content=self.capture_content)
            self._trace(event.episode_id).add_call(span)
            yield span
        elif isinstance(event, AgentSpansRecorded):  # the agent's own spans, under the episode's
            for sent in event.spans:
                yield agent_span(event.episode_id, sent)
        elif isinstance(event, EpisodeStarted):
            if event.source is not EpisodeSource.replay:
                self._trace(event.episode_id).started = event
        elif isinstance(event, RewardReported):
            trace = self._episodes.get(event.episode_id)
            evaluation = reward_evaluation(event, trace)
            if trace is not None and not trace.exported:
                trace.evaluations.append(evaluation)
            else:
                yield evaluation_span(event.episode_id, event.event_id, [evaluation])
        elif isinstance(event, EpisodeFinished):
            if event.source is EpisodeSource.replay:
                return
            self._trace(event.episode_id).finished = event
            self._due[event.episode_id] = time.monotonic() + self.score_wait_s
        elif isinstance(event, EpisodeScored):
            if event.source is EpisodeSource.replay:
                return
            trace = self._episodes.get(event.episode_id)
            if (trace is not None and trace.exported) or event.score_revision > 0:
                yield evaluation_span(event.episode_id, event.event_id, [score_evaluation(event)])
            else:
                yield from self._episode_spans(event.episode_id, event)

    def _trace(self, episode_id: str) -> EpisodeTrace:
        trace = self._episodes.get(episode_id)
        if trace is None:
            trace = self._episodes[episode_id] = EpisodeTrace(episode_id)
            while len(self._episodes) > self._max_episodes:
                old, _ = self._episodes.popitem(last=False)
                self._due.pop(old, None)
                self.stats.evicted += 1
        return trace

    def _episode_spans(self, episode_id: str, scored: EpisodeScored | None) -> Iterator[SpanData]:
        trace = self._episodes.get(episode_id) or EpisodeTrace(episode_id)
        self._due.pop(episode_id, None)
        self._episodes.pop(episode_id, None)
        # a small tombstone: a late score or feedback becomes an evaluation span, not a second root
        self._episodes[episode_id] = EpisodeTrace(episode_id, exported=True, response_ids=trace.response_ids)
        self.stats.episodes += 1
        yield episode_span(trace, scored, now_ns=time.time_ns())

    def _export_episode(self, episode_id: str, scored: EpisodeScored | None) -> None:
        for span in self._episode_spans(episode_id, scored):
            self.writer.write(span)
            self.stats.spans += 1

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_interval_s)
            now = time.monotonic()
            for episode_id in [e for e, due in self._due.items() if due <= now]:
                self._export_episode(episode_id, None)


def make_exporter(
    bus: Bus,
    endpoint: str,
    *,
    service_name: str = "flywheel",
    capture_content: bool = False,
    score_wait_s: float = 30.0,
    max_queue: int = 8192,
    span_exporter: SpanExporter | None = None,
) -> OtelExporter:
    """An exporter sending to ``endpoint`` over OTLP/HTTP (or to ``span_exporter``), batched."""
    processor = BatchSpanProcessor(
        span_exporter or OTLPSpanExporter(endpoint=traces_url(endpoint)),
        max_queue_size=max_queue,
        max_export_batch_size=min(512, max_queue),
        schedule_delay_millis=1000,
    )
    writer = SpanWriter(processor, service_name=service_name)
    return OtelExporter(bus, writer, capture_content=capture_content, score_wait_s=score_wait_s)

"""The OTLP intake: spans an agent emits itself, attached to its episode and published beside its calls.

An agent instrumented with OpenTelemetry points its OTLP/HTTP trace exporter at the gateway:

    POST /episodes/{id or ticket}/v1/traces   the episode's URL is the capability: every span of the
                                              request is that episode's (``OPENAI_BASE_URL + "/traces"``)
    POST /v1/traces                           a tenant key (``Authorization: Bearer`` / ``x-api-key``);
                                              each span names its episode, and it must be the tenant's

With a tenant key a span is tied to an episode by, in this order: the attribute ``flywheel.episode_id``
or ``gen_ai.conversation.id`` (on the span or its resource), ``session.id`` (the tenant's session, as
``X-Flywheel-Session`` names it), or its trace id when that is the one Flywheel's exporter derives from
an open episode's id (``infra.otel.spans.trace_id_for``: an agent that continues the episode's trace).
A trace follows the first of its spans that names an episode. Then:

- a span tied to an episode of another tenant (or to a training episode, which no tenant owns) makes
  the whole request a 403, and nothing of it is recorded;
- spans tied to no open episode are refused in OTLP's ``partial_success`` (a 404 when that is all of them);
- the rest are published as ``AgentSpansRecorded`` on ``flywheel.episodes`` (keyed by episode, split
  into events of at most ``MAX_EVENT_BYTES``), durably like a call (bus, else the spool), and the
  answer is OTLP's ``ExportTraceServiceResponse`` in the request's encoding.

Only open episodes take spans (an agent's exporter flushes when it exits, before its episode finishes).
The LLM-call path does not pass here: this route is FastAPI's, the calls are ``gateway.app.HotCalls``.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from pydantic import JsonValue

from gateway.episodes.registry import EpisodeState
from gateway.errors import NotFoundError, PermissionDeniedError
from gateway.routes import tenant_for_key
from gateway.service import Gateway
from gateway.spans.otlp import PROTOBUF, DecodedSpan, decode_request
from infra.http import bearer_token
from infra.otel.spans import trace_id_for
from schemas import AgentSpan, AgentSpansRecorded
from schemas.spans import SpanAuth, SpanMatch

EPISODE_ATTRIBUTES = ("flywheel.episode_id", "gen_ai.conversation.id")
SESSION_ATTRIBUTE = "session.id"
MAX_EVENT_BYTES = 256 * 1024  # one event well under Kafka's default message size (1 MiB)
KEEP_EPISODES = 256  # episodes whose spans `flywheel episodes show` can list from this gateway
KEEP_SPANS = 1024
THREAD_ABOVE_BYTES = 64 * 1024  # bodies this large are decoded off the event loop


@dataclass
class Accepted:
    """What one export request did: spans published per episode, and the spans refused."""

    episodes: dict[str, int] = field(default_factory=dict)
    rejected: int = 0
    reason: str = ""


class SpanIntake:
    def __init__(self, gateway: Gateway, max_body_bytes: int) -> None:
        self.gateway = gateway
        self.max_body_bytes = max_body_bytes
        self._trace_of: dict[str, str] = {}  # episode id → its derived trace id (open episodes)
        self._by_trace: dict[str, str] = {}
        self._indexed_at = 0.0
        self._recent: OrderedDict[str, list[AgentSpan]] = OrderedDict()

    # ----------------------------------------------------------------------------- requests
    async def by_episode_url(
        self, segment: str, body: bytes, content_type: str, content_encoding: str
    ) -> Accepted:
        """Every span of the request is the episode's whose URL (id or ticket) it was sent to."""
        state = await self.gateway.training_episode(segment)
        spans = await self._decode(body, content_type, content_encoding)
        accepted = Accepted()
        await self._publish(state, [d.span for d in spans], "ticket", "url", accepted)
        return accepted

    async def by_tenant_key(
        self, key: str | None, body: bytes, content_type: str, content_encoding: str
    ) -> Accepted:
        tenant = tenant_for_key(self.gateway, key)
        spans = await self._decode(body, content_type, content_encoding)
        groups: dict[str, tuple[EpisodeState, SpanMatch, list[AgentSpan]]] = {}
        unmatched = 0
        for trace_spans in _by_trace(spans):
            found = self._resolve(tenant, trace_spans)
            if found is None:
                unmatched += len(trace_spans)
                continue
            state, matched_by = found
            if state.tenant != tenant:
                raise PermissionDeniedError(
                    "a span names an episode that is not this key's tenant's",
                    code="episode_not_yours",
                    episode_id=state.episode_id,
                )
            groups.setdefault(state.episode_id, (state, matched_by, []))[2].extend(
                d.span for d in trace_spans
            )
        if not groups:
            raise NotFoundError(
                f"no open episode of tenant {tenant!r} matches these {unmatched} span(s): name it with "
                "flywheel.episode_id or gen_ai.conversation.id (or session.id), or send them to the "
                "episode's URL",
                code="episode_not_found",
            )
        accepted = Accepted(rejected=unmatched)
        if unmatched:
            accepted.reason = f"{unmatched} span(s) matched no open episode of this tenant"
        for state, matched_by, episode_spans in groups.values():
            await self._publish(state, episode_spans, "tenant_key", matched_by, accepted)
        return accepted

    async def _decode(self, body: bytes, content_type: str, content_encoding: str) -> list[DecodedSpan]:
        """Decoded on a thread when large (a 4 MiB body is thousands of spans: ~0.1 s of CPU), so the
        event loop keeps serving the calls meanwhile."""
        if len(body) < THREAD_ABOVE_BYTES:
            return decode_request(body, content_type, content_encoding, self.max_body_bytes)
        return await asyncio.to_thread(
            decode_request, body, content_type, content_encoding, self.max_body_bytes
        )

    # --------------------------------------------------------------------------- matching
    def _resolve(self, tenant: str, spans: Sequence[DecodedSpan]) -> tuple[EpisodeState, SpanMatch] | None:
        """The episode a trace's spans belong to, and how it was found (first span that names one)."""
        registry = self.gateway.episodes
        for d in spans:
            for attrs in (d.span.attributes, d.resource):
                episode_id = _first_str(attrs, EPISODE_ATTRIBUTES)
                if episode_id is not None:
                    state = registry.get(episode_id)
                    if state is not None:
                        return state, "attribute"
                session = _first_str(attrs, (SESSION_ATTRIBUTE,))
                if session is not None:
                    state = registry.session(tenant, session[:256])
                    if state is not None:
                        return state, "session"
        episode_id = self._episode_of_trace(spans[0].span.trace_id)
        state = registry.get(episode_id) if episode_id is not None else None
        return (state, "trace") if state is not None else None

    def _episode_of_trace(self, trace_id: str) -> str | None:
        """The open episode whose derived trace id this is (the index is refreshed at most every 0.5 s)."""
        found = self._by_trace.get(trace_id)
        if found is not None or time.monotonic() - self._indexed_at < 0.5:
            return found
        self._indexed_at = time.monotonic()
        open_ids = {s.episode_id for s in self.gateway.episodes.open_episodes()}
        self._trace_of = {e: self._trace_of.get(e) or trace_id_for(e) for e in open_ids}
        self._by_trace = {t: e for e, t in self._trace_of.items()}
        return self._by_trace.get(trace_id)

    # ------------------------------------------------------------------------- publishing
    async def _publish(
        self,
        state: EpisodeState,
        spans: list[AgentSpan],
        via: SpanAuth,
        matched_by: SpanMatch,
        accepted: Accepted,
    ) -> None:
        chunks = _chunks(spans) if len(spans) < 64 else await asyncio.to_thread(lambda: list(_chunks(spans)))
        for chunk in chunks:
            event = AgentSpansRecorded(
                producer=f"gateway:{self.gateway.id}",
                episode_id=state.episode_id,
                tenant=state.tenant,
                via=via,
                matched_by=matched_by,
                spans=chunk,
            )
            await self.gateway.publish(event)
        accepted.episodes[state.episode_id] = accepted.episodes.get(state.episode_id, 0) + len(spans)
        self._remember(state.episode_id, spans)

    def _remember(self, episode_id: str, spans: list[AgentSpan]) -> None:
        kept = self._recent.get(episode_id)
        if kept is None:
            kept = self._recent[episode_id] = []
            while len(self._recent) > KEEP_EPISODES:
                self._recent.popitem(last=False)
        kept.extend(spans[: max(0, KEEP_SPANS - len(kept))])

    def recent(self, episode_id: str) -> list[AgentSpan]:
        """The spans this gateway took in for the episode lately, in start order."""
        return sorted(self._recent.get(episode_id, []), key=lambda s: s.start_time)


def _first_str(attrs: dict[str, JsonValue] | object, names: Sequence[str]) -> str | None:
    if not isinstance(attrs, dict):
        return None
    for name in names:
        value = attrs.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def _by_trace(spans: Sequence[DecodedSpan]) -> Iterator[list[DecodedSpan]]:
    traces: dict[str, list[DecodedSpan]] = {}
    for d in spans:
        traces.setdefault(d.span.trace_id, []).append(d)
    yield from traces.values()


def _chunks(spans: list[AgentSpan]) -> Iterator[list[AgentSpan]]:
    """Consecutive runs of spans whose JSON stays under MAX_EVENT_BYTES (a larger span goes alone, cut
    to its identity and timing)."""
    chunk: list[AgentSpan] = []
    size = 0
    for span in spans:
        n = len(span.model_dump_json())
        if n > MAX_EVENT_BYTES:
            span = span.model_copy(
                update={"attributes": {"flywheel.attributes_dropped": len(span.attributes)}, "events": []}
            )
            n = len(span.model_dump_json())
        if chunk and size + n > MAX_EVENT_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(span)
        size += n
    if chunk:
        yield chunk


# ---------------------------------------------------------------------------------- HTTP


def export_response(accepted: Accepted, content_type: str) -> Response:
    """OTLP's ExportTraceServiceResponse, protobuf or JSON as the request was."""
    if content_type.split(";", 1)[0].strip().lower() == PROTOBUF:
        message = ExportTraceServiceResponse()
        if accepted.rejected:
            message.partial_success.rejected_spans = accepted.rejected
            message.partial_success.error_message = accepted.reason
        return Response(message.SerializeToString(), media_type=PROTOBUF)
    body: dict[str, object] = {}
    if accepted.rejected:
        body["partialSuccess"] = {"rejectedSpans": str(accepted.rejected), "errorMessage": accepted.reason}
    return Response(orjson.dumps(body), media_type="application/json")


def build_otlp_router() -> APIRouter:
    router = APIRouter()

    def intake(request: Request) -> SpanIntake:
        found: SpanIntake = request.app.state.span_intake
        return found

    @router.post("/episodes/{episode_id}/v1/traces", tags=["episodes"])
    async def episode_traces(episode_id: str, request: Request) -> Response:
        ctype = request.headers.get("content-type", "")
        accepted = await intake(request).by_episode_url(
            episode_id, await request.body(), ctype, request.headers.get("content-encoding", "")
        )
        return export_response(accepted, ctype)

    @router.post("/v1/traces", tags=["production"])
    async def traces(request: Request) -> Response:
        ctype = request.headers.get("content-type", "")
        key = bearer_token(request.headers, "x-api-key") or None
        accepted = await intake(request).by_tenant_key(
            key, await request.body(), ctype, request.headers.get("content-encoding", "")
        )
        return export_response(accepted, ctype)

    return router

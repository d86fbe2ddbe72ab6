"""Spans an agent emitted itself (OpenTelemetry), attached to its episode by the gateway's OTLP intake.

An agent instrumented with OpenTelemetry (the OpenAI Agents SDK's tracing through OpenInference, a
LangChain callback, its own tracer) sends OTLP/HTTP to the gateway (``gateway/spans/otlp.py``); the gateway
decides which episode each span belongs to and publishes them on ``flywheel.episodes`` as
:class:`AgentSpansRecorded`, keyed by the episode like its calls. Tool durations and agent steps then
sit beside the calls in the event log (``agent_spans``, infra/eventlog/ddl.py).

Ids are OpenTelemetry's, as lowercase hex; times are the agent's clock. Attribute values are what OTLP
carries (strings, numbers, booleans, arrays, nested key-value lists), long strings cut to
:data:`MAX_ATTRIBUTE_CHARS`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from schemas.common import EventBase

MAX_ATTRIBUTE_CHARS = 8192
SpanKindName = Literal["unspecified", "internal", "server", "client", "producer", "consumer"]
SpanAuth = Literal["ticket", "tenant_key"]
SpanMatch = Literal["url", "trace", "attribute", "session"]


class AgentSpanEvent(BaseModel):
    """A timed event inside a span (an exception, a log line, a GenAI evaluation)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(max_length=256)
    time: datetime
    attributes: dict[str, JsonValue] = Field(default_factory=dict)


class AgentSpan(BaseModel):
    """One finished span as the agent reported it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trace_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    span_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    parent_span_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{16}$")
    name: str = Field(max_length=1024)
    kind: SpanKindName = "internal"
    start_time: datetime
    end_time: datetime
    duration_ms: float = Field(ge=0, description="end_time - start_time (0 when the agent's end is earlier)")
    status: Literal["unset", "ok", "error"] = "unset"
    status_message: str = Field(default="", max_length=MAX_ATTRIBUTE_CHARS)
    attributes: dict[str, JsonValue] = Field(default_factory=dict)
    events: list[AgentSpanEvent] = Field(default_factory=list)
    scope: str = Field(default="", max_length=256, description="the instrumentation scope's name")
    service_name: str = Field(default="", max_length=256, description="the resource's service.name")


class AgentSpansRecorded(EventBase):
    """Spans of one episode the gateway took in over OTLP (added, optional).

    ``via``: how the sender proved it may write into the episode: the episode's URL (``ticket``: its
    id or signed ticket in the path) or a tenant key (``tenant_key``: the episode is that tenant's).
    ``matched_by``: how the spans were tied to the episode (``url``, ``trace``: their trace id is the
    one Flywheel's exporter derives from the episode id, ``attribute``: ``flywheel.episode_id`` or
    ``gen_ai.conversation.id``, ``session``: ``session.id`` names the tenant's session).
    """

    type: Literal["agent_spans_recorded"] = "agent_spans_recorded"
    episode_id: str = Field(min_length=1, max_length=64)
    tenant: str | None = Field(default=None, max_length=128)
    via: SpanAuth = "ticket"
    matched_by: SpanMatch = "url"
    spans: list[AgentSpan] = Field(min_length=1)

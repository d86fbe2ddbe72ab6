"""Recorded events → span data following OpenTelemetry's GenAI semantic conventions.

One trace per episode, with ids derived from the episode id, so spans exported at different times
(each call as it is recorded, the episode when it is scored, late feedback days later) land in one
trace without any state shared between them:

    trace id          = SHA-256("flywheel.trace:" + episode_id)[:16]      (trace_id_for)
    episode span id   = SHA-256("flywheel.episode:" + episode_id)[:8]
    call span id      = SHA-256("flywheel.call:" + episode_id + ":" + call_id)[:8]
    evaluation span   = SHA-256("flywheel.evaluation:" + event_id)[:8]

    invoke_agent {agent}            root, INTERNAL: the episode (gen_ai.operation.name = invoke_agent)
    ├── chat {model}                CLIENT: one per LLMCallRecorded (text_completion for /v1/completions)
    ├── {the agent's own span}      the spans the agent sent the gateway (AgentSpansRecorded), their own
    │                               ids and tree kept, their roots under the episode's span
    └── evaluation {name}           only for a score or feedback that came after the episode's span left

Rewards, scores and feedback are ``gen_ai.evaluation.result`` span events (``gen_ai.evaluation.name``,
``gen_ai.evaluation.score.value``, ``.score.label``, ``.explanation``, ``gen_ai.response.id`` of the call
a per-call reward is for). Flywheel's own fields are ``flywheel.*`` attributes. Message content is put on
call spans (``gen_ai.input.messages``, ``gen_ai.output.messages``, shaped by :mod:`infra.otel.messages`)
only when ``capture_content`` is set.

Nothing here imports OpenTelemetry: the exporter (``infra.otel.exporter``) turns :class:`SpanData` into
SDK spans, so the mapping is tested on its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal
from urllib.parse import urlsplit

import orjson

from infra.otel.messages import input_messages, output_messages
from schemas import AgentSpan, EpisodeFinished, EpisodeScored, EpisodeStarted, LLMCallRecorded, RewardReported

AttrValue = str | bool | int | float | list[str]
Attrs = dict[str, AttrValue]
EVALUATION_EVENT = "gen_ai.evaluation.result"


@dataclass
class SpanEvent:
    name: str
    time_ns: int
    attributes: Attrs


@dataclass
class SpanData:
    """One finished span, ready for any OpenTelemetry SDK (ids as integers, times in ns since the epoch)."""

    name: str
    trace_id: int
    span_id: int
    parent_span_id: int | None
    kind: Literal["internal", "client"]
    start_ns: int
    end_ns: int
    attributes: Attrs
    events: list[SpanEvent] = field(default_factory=list)
    error: str | None = None  # set: the span's status is ERROR with this description


def _digest(text: str, size: int) -> int:
    value = int.from_bytes(hashlib.sha256(text.encode()).digest()[:size], "big")
    return value or 1  # 0 is the invalid id in OpenTelemetry (one chance in 2**64)


def trace_id_for(episode_id: str) -> str:
    """The trace id (32 hex characters) of an episode's spans in any OpenTelemetry backend."""
    return f"{_digest('flywheel.trace:' + episode_id, 16):032x}"


def _trace(episode_id: str) -> int:
    return _digest("flywheel.trace:" + episode_id, 16)


def episode_span_id(episode_id: str) -> int:
    return _digest("flywheel.episode:" + episode_id, 8)


def call_span_id(episode_id: str, call_id: str) -> int:
    return _digest(f"flywheel.call:{episode_id}:{call_id}", 8)


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000_000)


def _put(attrs: Attrs, key: str, value: Any) -> None:
    """Set ``key`` when ``value`` is a value OpenTelemetry can carry (None is left out)."""
    if value is None:
        return
    if isinstance(value, bool | int | float | str):
        attrs[key] = value
    else:
        attrs[key] = str(value)


def _json(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


# ----------------------------------------------------------------------------------- calls


def call_span(call: LLMCallRecorded, *, capture_content: bool = False) -> SpanData:
    """The span of one recorded call, a child of its episode's span."""
    request = _json(call.request)
    response = _json(call.response)
    operation = "text_completion" if call.endpoint == "completions" else "chat"
    request_model = request.get("model") if isinstance(request.get("model"), str) else call.model
    end = call.emitted_at
    start = call.started_at or (end - timedelta(milliseconds=call.latency_ms))
    end_ns = max(_ns(start) + int(call.latency_ms * 1_000_000), _ns(start))
    attrs: Attrs = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": call.upstream.value,
        "gen_ai.conversation.id": call.episode_id,
        "gen_ai.usage.input_tokens": call.prompt_tokens,
        "gen_ai.usage.output_tokens": call.completion_tokens,
    }
    _put(attrs, "gen_ai.request.model", request_model or None)
    _put(attrs, "gen_ai.response.model", response.get("model") or call.model or None)
    _put(attrs, "gen_ai.response.id", response.get("id"))
    reasons = [c.finish_reason for c in call.choices if c.finish_reason]
    if reasons:
        attrs["gen_ai.response.finish_reasons"] = reasons
    for key, name in (
        ("temperature", "gen_ai.request.temperature"),
        ("top_p", "gen_ai.request.top_p"),
        ("max_tokens", "gen_ai.request.max_tokens"),
        ("max_completion_tokens", "gen_ai.request.max_tokens"),
        ("seed", "gen_ai.request.seed"),
    ):
        value = request.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attrs[name] = value
    if isinstance(request.get("n"), int) and request["n"] != 1:
        attrs["gen_ai.request.choice.count"] = request["n"]
    if call.streamed:
        attrs["gen_ai.request.stream"] = True
    if call.upstream_url:
        parts = urlsplit(call.upstream_url)
        _put(attrs, "server.address", parts.hostname)
        _put(attrs, "server.port", parts.port)
    _call_flywheel_attrs(attrs, call)
    error = None
    if call.error or call.status_code >= 400:
        error = call.error or f"status {call.status_code}"
        attrs["error.type"] = str(call.status_code) if call.status_code >= 400 else "error"
    if capture_content:
        attrs["gen_ai.input.messages"] = orjson.dumps(input_messages(request)).decode()
        attrs["gen_ai.output.messages"] = orjson.dumps(output_messages(call)).decode()
    return SpanData(
        name=f"{operation} {request_model}" if request_model else operation,
        trace_id=_trace(call.episode_id),
        span_id=call_span_id(call.episode_id, call.call_id),
        parent_span_id=episode_span_id(call.episode_id),
        kind="client",
        start_ns=_ns(start),
        end_ns=end_ns,
        attributes=attrs,
        error=error,
    )


def _call_flywheel_attrs(attrs: Attrs, call: LLMCallRecorded) -> None:
    attrs["flywheel.call_seq"] = call.call_seq
    attrs["flywheel.call_id"] = call.call_id
    attrs["flywheel.endpoint"] = call.endpoint
    attrs["flywheel.source"] = call.source.value
    attrs["flywheel.weight_version"] = call.weight_version
    attrs["flywheel.token_faithful"] = call.token_faithful
    attrs["flywheel.prefix_mismatch"] = call.prefix_mismatch
    attrs["flywheel.logprobs_mode"] = call.logprobs_mode.value
    _put(attrs, "flywheel.tenant", call.tenant)
    _put(attrs, "flywheel.weight_version_source", call.weight_version_source)
    _put(attrs, "flywheel.prompt_version", call.prompt_version)
    # merge: True when this call's prompt is the previous prompt + the previous reply, so the two
    # become one trajectory (reward_service/transitions.py); False with prefix_mismatch: split
    _put(attrs, "flywheel.extends_previous", call.extends_previous)
    _put(attrs, "flywheel.temperature", call.temperature)
    _put(attrs, "flywheel.adapter", call.adapter)  # the LoRA policy that served it (infra/policies.py)
    _put(attrs, "flywheel.adapter_version", call.adapter_version)
    if call.prompt_substitutions:
        attrs["flywheel.prompt_substitutions"] = [s.component for s in call.prompt_substitutions]
    logprobs = [lp for c in call.choices for lp in (c.logprobs or ())]
    if logprobs:
        # how unsure the model was: the mean and the lowest behaviour logprob of what it generated
        attrs["flywheel.logprob.mean"] = sum(logprobs) / len(logprobs)
        attrs["flywheel.logprob.min"] = min(logprobs)


# -------------------------------------------------------------------------------- episodes


@dataclass
class EpisodeTrace:
    """What the exporter keeps of an episode until its span leaves (a few hundred bytes)."""

    episode_id: str
    started: EpisodeStarted | None = None
    finished: EpisodeFinished | None = None
    first_call_ns: int | None = None
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    request_model: str | None = None
    response_ids: dict[int, str] = field(default_factory=dict)  # call_seq → gen_ai.response.id
    evaluations: list[SpanEvent] = field(default_factory=list)
    exported: bool = False

    def add_call(self, span: SpanData) -> None:
        self.calls += 1
        self.first_call_ns = min(self.first_call_ns or span.start_ns, span.start_ns)
        self.input_tokens += int(span.attributes.get("gen_ai.usage.input_tokens", 0))  # type: ignore[arg-type]
        self.output_tokens += int(span.attributes.get("gen_ai.usage.output_tokens", 0))  # type: ignore[arg-type]
        model = span.attributes.get("gen_ai.request.model")
        if isinstance(model, str) and self.request_model is None:
            self.request_model = model
        response_id = span.attributes.get("gen_ai.response.id")
        seq = span.attributes.get("flywheel.call_seq")
        if isinstance(response_id, str) and isinstance(seq, int) and len(self.response_ids) < 1024:
            self.response_ids[seq] = response_id


def reward_evaluation(event: RewardReported, trace: EpisodeTrace | None) -> SpanEvent:
    """A reported reward (the agent's, per call or for the episode) or production feedback."""
    attrs: Attrs = {"gen_ai.evaluation.name": event.origin.value}
    _put(attrs, "gen_ai.evaluation.score.value", event.value)
    if event.rating is not None:
        attrs["gen_ai.evaluation.score.label"] = str(event.rating)
        attrs["flywheel.feedback.rating"] = event.rating
    if event.message:
        attrs["gen_ai.evaluation.explanation"] = event.message
    if event.call_seq is not None:
        attrs["flywheel.call_seq"] = event.call_seq
        if trace is not None and event.call_seq in trace.response_ids:
            attrs["gen_ai.response.id"] = trace.response_ids[event.call_seq]
    _put(attrs, "flywheel.call_id", event.call_id)
    _put(attrs, "flywheel.tenant", event.tenant)
    return SpanEvent(EVALUATION_EVENT, _ns(event.emitted_at), attrs)


def score_evaluation(scored: EpisodeScored) -> SpanEvent:
    """The reward service's score of the episode (its reward, by scorer, with the scorer's note)."""
    attrs: Attrs = {"gen_ai.evaluation.name": scored.reward_source or "reward"}
    _put(attrs, "gen_ai.evaluation.score.value", scored.reward)
    if scored.score_note:
        attrs["gen_ai.evaluation.explanation"] = scored.score_note
    if scored.score_error:
        attrs["error.type"] = "score_error"
        attrs["flywheel.score_error"] = scored.score_error
    attrs["flywheel.score_revision"] = scored.score_revision
    return SpanEvent(EVALUATION_EVENT, _ns(scored.emitted_at), attrs)


def episode_span(trace: EpisodeTrace, scored: EpisodeScored | None, *, now_ns: int) -> SpanData:
    """The episode's root span from what was seen of it (start, calls, finish, score)."""
    started, finished = trace.started, trace.finished
    end_ns = _ns(finished.emitted_at) if finished is not None else None
    if end_ns is None and scored is not None and scored.finished_at is not None:
        end_ns = _ns(scored.finished_at)
    end_ns = end_ns or now_ns
    start_ns = _ns(started.emitted_at) if started is not None else None
    if start_ns is None and finished is not None and finished.duration_s:
        start_ns = end_ns - int(finished.duration_s * 1e9)
    candidates = [t for t in (start_ns, trace.first_call_ns) if t is not None]
    start_ns = min(candidates) if candidates else end_ns
    agent = started.agent.spec[:256] if started is not None and started.agent is not None else None
    attrs: Attrs = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.conversation.id": trace.episode_id,
        "gen_ai.usage.input_tokens": trace.input_tokens,
        "gen_ai.usage.output_tokens": trace.output_tokens,
        "flywheel.calls_seen": trace.calls,
    }
    _put(attrs, "gen_ai.agent.name", agent)
    _put(attrs, "gen_ai.request.model", trace.request_model or (started.model if started else None))
    if started is not None:
        attrs["flywheel.source"] = started.source.value
        attrs["flywheel.mode"] = started.mode.value
        attrs["flywheel.group_size"] = started.group_size
        attrs["flywheel.sample_index"] = started.sample_index
        attrs["flywheel.attempt"] = started.attempt
        _put(attrs, "flywheel.task_id", started.task_id)
        _put(attrs, "flywheel.group_id", started.group_id)
        _put(attrs, "flywheel.tenant", started.tenant)
        _put(attrs, "flywheel.session_id", started.session_id)
    error = None
    if finished is not None:
        attrs["flywheel.status"] = finished.status.value
        _put(attrs, "flywheel.num_calls", finished.num_calls)
        _put(attrs, "flywheel.reported_reward", finished.reported_reward)
        if finished.superseded:
            attrs["flywheel.superseded"] = True
        if finished.status.value != "ok":
            error = finished.error or finished.status.value
            attrs["error.type"] = finished.status.value
    events = list(trace.evaluations)
    if scored is not None:
        _scored_attrs(attrs, scored)
        events.append(score_evaluation(scored))
    return SpanData(
        name=f"invoke_agent {agent}" if agent else "invoke_agent",
        trace_id=_trace(trace.episode_id),
        span_id=episode_span_id(trace.episode_id),
        parent_span_id=None,
        kind="internal",
        start_ns=start_ns,
        end_ns=max(end_ns, start_ns),
        attributes=attrs,
        events=sorted(events, key=lambda e: e.time_ns),
        error=error,
    )


def _scored_attrs(attrs: Attrs, scored: EpisodeScored) -> None:
    _put(attrs, "flywheel.reward", scored.reward)
    attrs["flywheel.reward_source"] = scored.reward_source
    attrs["flywheel.transitions"] = len(scored.transitions)
    calls_in = sum(len(t.call_seqs) for t in scored.transitions)
    # merge: calls that joined an earlier call's trajectory (each extended it exactly)
    attrs["flywheel.merged_calls"] = max(0, calls_in - len(scored.transitions))
    attrs["flywheel.prefix_mismatches"] = scored.prefix_mismatches
    attrs["flywheel.context_calls"] = scored.context_calls
    attrs["flywheel.score_revision"] = scored.score_revision
    _put(attrs, "flywheel.unusable_reason", scored.unusable_reason)
    versions = sorted({t.weight_version for t in scored.transitions})
    if versions:
        attrs["flywheel.weight_versions"] = [str(v) for v in versions]
    prompts = sorted({t.prompt_version for t in scored.transitions if t.prompt_version})
    if prompts:
        attrs["flywheel.prompt_versions"] = prompts
    if "flywheel.task_id" not in attrs:
        _put(attrs, "flywheel.task_id", scored.task_id)
        attrs["flywheel.group_id"] = scored.group_id
        attrs["flywheel.source"] = scored.source.value


def evaluation_span(episode_id: str, event_id: str, evaluations: Iterable[SpanEvent]) -> SpanData:
    """A zero-length child of the episode's span for evaluations that came after that span left."""
    events = list(evaluations)
    at = min(e.time_ns for e in events)
    name = str(events[0].attributes.get("gen_ai.evaluation.name", "evaluation"))
    return SpanData(
        name=f"evaluation {name}",
        trace_id=_trace(episode_id),
        span_id=_digest("flywheel.evaluation:" + event_id, 8),
        parent_span_id=episode_span_id(episode_id),
        kind="internal",
        start_ns=at,
        end_ns=at,
        attributes={"gen_ai.conversation.id": episode_id},
        events=events,
    )


# ------------------------------------------------------------------------------ agent spans


def _attr(value: object) -> AttrValue:
    """An OTLP attribute value as the SDK takes it: scalars and lists of strings as they are, the rest
    (nested lists and key-value lists) as JSON text."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [str(v) for v in value]
    return orjson.dumps(value).decode()


def agent_span(episode_id: str, span: AgentSpan) -> SpanData:
    """A span the agent sent the gateway, re-homed into its episode's trace: its own span id and
    parent kept, a root of the agent's tree placed under the episode's span."""
    parent = int(span.parent_span_id, 16) if span.parent_span_id else episode_span_id(episode_id)
    attrs: Attrs = {k: _attr(v) for k, v in span.attributes.items() if v is not None}
    attrs["gen_ai.conversation.id"] = episode_id
    attrs["flywheel.agent_trace_id"] = span.trace_id
    _put(attrs, "flywheel.agent_service", span.service_name or None)
    return SpanData(
        name=span.name,
        trace_id=_trace(episode_id),
        span_id=int(span.span_id, 16),
        parent_span_id=parent,
        kind="client" if span.kind == "client" else "internal",
        start_ns=_ns(span.start_time),
        end_ns=_ns(span.end_time),
        attributes=attrs,
        events=[
            SpanEvent(e.name, _ns(e.time), {k: _attr(v) for k, v in e.attributes.items() if v is not None})
            for e in span.events
        ],
        error=(span.status_message or "error") if span.status == "error" else None,
    )

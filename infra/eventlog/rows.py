"""Turning events into ``events`` rows: typed identifier columns plus the full event JSON.

Rows are built column-wise into one Arrow table per batch: the fastest insert path into ClickHouse
(chdb reads Arrow natively; clickhouse-connect sends it as Arrow too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson
import pyarrow as pa
from pydantic import BaseModel

from infra.bus.base import Message
from schemas import (
    AnyEvent,
    DeadLetter,
    EpisodeFinished,
    EpisodeScored,
    EpisodeStarted,
    InferenceDrained,
    InferenceResumed,
    LLMCallRecorded,
    RewardReported,
    RolloutCancelled,
    RolloutRequested,
    TrainerStepCompleted,
    WeightsActivated,
    WeightUpdateFailed,
    WeightUpdateRequested,
    key_for,
    topic_for,
)

_MS = pa.timestamp("ms", tz="UTC")

SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("type", pa.string()),
        ("schema_version", pa.uint16()),
        ("topic", pa.string()),
        ("key", pa.string()),
        ("emitted_at", _MS),
        ("producer", pa.string()),
        ("episode_id", pa.string()),
        ("task_id", pa.string()),
        ("group_id", pa.string()),
        ("tenant", pa.string()),
        ("source", pa.string()),
        ("mode", pa.string()),
        ("model", pa.string()),
        ("status", pa.string()),
        ("call_seq", pa.int32()),
        ("attempt", pa.int32()),
        ("weight_version", pa.int64()),
        ("reward", pa.float64()),
        ("num_calls", pa.int32()),
        ("num_transitions", pa.int32()),
        ("prompt_tokens", pa.uint32()),
        ("completion_tokens", pa.uint32()),
        ("latency_ms", pa.float32()),
        ("token_faithful", pa.uint8()),
        ("prefix_mismatch", pa.uint8()),
        ("error", pa.string()),
        ("bus_partition", pa.int32()),
        ("bus_offset", pa.int64()),
        ("recorded_at", _MS),
        ("payload", pa.string()),
    ]
)


@dataclass(frozen=True, slots=True)
class Origin:
    """Where an event was read from; -1 when it did not come off the bus."""

    topic: str
    key: str
    partition: int = -1
    offset: int = -1


def _fields(event: AnyEvent) -> tuple[str, str, str, str, str, str, str, str, int, int, int, float | None]:
    """(episode_id, task_id, group_id, tenant, source, mode, model, status,
    call_seq, attempt, weight_version, reward)."""
    match event:
        case LLMCallRecorded():
            return (
                event.episode_id, "", "", event.tenant or "", event.source.value, "", event.model, "",
                event.call_seq, -1, event.weight_version, None,
            )  # fmt: skip
        case EpisodeStarted():
            return (
                event.episode_id, event.task_id or "", event.group_id or "", event.tenant or "",
                event.source.value, event.mode.value, event.model, "", -1, event.attempt, -1, None,
            )  # fmt: skip
        case EpisodeFinished():
            return (
                event.episode_id, event.task_id or "", event.group_id or "", event.tenant or "",
                event.source.value, "", "", event.status.value, -1, event.attempt, -1, event.reported_reward,
            )  # fmt: skip
        case EpisodeScored():
            versions = [t.weight_version for t in event.transitions]
            return (
                event.episode_id, event.task_id or "", event.group_id, event.tenant or "",
                event.source.value, event.mode.value, event.model, event.status.value, -1, event.attempt,
                min(versions) if versions else -1, event.reward,
            )  # fmt: skip
        case RewardReported():
            return (
                event.episode_id, "", "", event.tenant or "", "", "", "", "",
                -1 if event.call_seq is None else event.call_seq, -1, -1, event.value,
            )  # fmt: skip
        case RolloutRequested():
            return (
                "", event.task.task_id, event.group_id, "", "", event.mode.value, event.model, "",
                -1, event.attempt, -1, None,
            )  # fmt: skip
        case RolloutCancelled():
            return ("", event.task_id, event.group_id, "", "", "", "", "", -1, -1, -1, None)
        case WeightUpdateRequested() | WeightsActivated() | InferenceDrained() | InferenceResumed():
            return ("", "", "", "", "", "", event.model, "", -1, -1, event.version, None)
        case WeightUpdateFailed() | TrainerStepCompleted():
            return ("", "", "", "", "", "", event.model, "", -1, -1, event.version, None)
        case DeadLetter():
            return ("", "", "", "", "", "", "", "", -1, -1, -1, None)
    return _generic_fields(event)


def _str(value: object) -> str:
    if value is None:
        return ""
    return str(getattr(value, "value", value))


def _generic_fields(
    event: object,
) -> tuple[str, str, str, str, str, str, str, str, int, int, int, float | None]:
    """Events added to ``schemas`` after this module: take the identifiers they happen to carry."""
    get = event.__dict__.get
    task = get("task")
    version = get("weight_version", get("version"))
    reward = get("reward")
    call_seq, attempt = get("call_seq"), get("attempt")
    return (
        _str(get("episode_id")),
        _str(get("task_id") or getattr(task, "task_id", None)),
        _str(get("group_id")),
        _str(get("tenant")),
        _str(get("source")),
        _str(get("mode")),
        _str(get("model")),
        _str(get("status")),
        call_seq if isinstance(call_seq, int) else -1,
        attempt if isinstance(attempt, int) else -1,
        version if isinstance(version, int) else -1,
        float(reward) if isinstance(reward, int | float) else None,
    )


def _ms(value: datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp() * 1000)


def _extra(event: AnyEvent) -> tuple[int, int, int, int, float, int, int, str]:
    """(num_calls, num_transitions, prompt_tokens, completion_tokens, latency_ms, token_faithful,
    prefix_mismatch, error)."""
    if isinstance(event, LLMCallRecorded):
        return (
            -1, -1, event.prompt_tokens, event.completion_tokens, event.latency_ms,
            int(event.token_faithful), int(event.prefix_mismatch), event.error or "",
        )  # fmt: skip
    if isinstance(event, EpisodeScored):
        err = event.score_error or event.unusable_reason or ""
        return (event.num_calls, len(event.transitions), 0, 0, 0.0, 0, int(event.prefix_mismatches > 0), err)
    if isinstance(event, EpisodeFinished):
        num_calls = -1 if event.num_calls is None else event.num_calls
        return (num_calls, -1, 0, 0, 0.0, 0, 0, event.error or "")
    if isinstance(event, WeightUpdateFailed | DeadLetter):
        return (-1, -1, 0, 0, 0.0, 0, 0, event.error)
    return (-1, -1, 0, 0, 0.0, 0, 0, "")


def _model_fields(value: object) -> dict[str, object]:
    if isinstance(value, BaseModel):
        extra = value.__pydantic_extra__
        return {**value.__dict__, **extra} if extra else value.__dict__
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def event_json(event: AnyEvent) -> str:
    """The event's JSON, byte-identical to ``model_dump_json()`` for every event in ``schemas``.

    orjson walks the models' field dicts about twice as fast as pydantic's serialiser, and the JSON
    is the largest cost per recorded event. A test pins the byte-equality on the fixture of every event;
    anything orjson cannot encode falls back to pydantic.
    """
    try:
        return orjson.dumps(event, default=_model_fields, option=orjson.OPT_UTC_Z).decode()
    except (TypeError, orjson.JSONEncodeError):
        return event.model_dump_json()


def _payload(event: AnyEvent, raw: str | bytes | None) -> str:
    if raw is None:
        return event_json(event)
    return raw.decode() if isinstance(raw, bytes) else raw


def to_arrow(
    events: Sequence[AnyEvent],
    origins: Sequence[Origin] | None = None,
    payloads: Sequence[str | bytes | None] | None = None,
) -> pa.Table:
    """One Arrow table (``SCHEMA``) for ``events``; ``payloads`` may carry already-encoded JSON.

    Built as one tuple per row, transposed once: a few C-level operations per event instead of one
    Python call per column, which is what keeps the recorder ahead of the bus.
    """
    n = len(events)
    now = int(datetime.now(UTC).timestamp() * 1000)
    rows: list[tuple[object, ...]] = []
    append = rows.append
    for i, event in enumerate(events):
        origin = origins[i] if origins is not None else None
        raw = payloads[i] if payloads is not None else None
        payload = _payload(event, raw)
        append(
            (
                event.event_id,
                event.type,
                event.schema_version,
                origin.topic if origin else topic_for(event),
                origin.key if origin else key_for(event),
                _ms(event.emitted_at),
                event.producer,
                *_fields(event),
                *_extra(event),
                origin.partition if origin else -1,
                origin.offset if origin else -1,
                now,
                payload,
            )
        )
    cols = list(zip(*rows, strict=True)) if rows else [() for _ in SCHEMA.names]
    # Timestamps travel as epoch milliseconds: converting datetime objects would make pyarrow import pandas.
    arrays = [
        pa.array(col, type=pa.int64(), size=n).cast(field.type)
        if field.type == _MS
        else pa.array(col, type=field.type, size=n)
        for col, field in zip(cols, SCHEMA, strict=True)
    ]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def messages_to_arrow(messages: Sequence[Message]) -> pa.Table:
    """Rows for bus messages, with their topic, key, partition and offset."""
    events = [m.event for m in messages]
    origins = [Origin(m.topic, m.key, m.partition, m.offset) for m in messages]
    raw = [getattr(m, "raw", None) for m in messages]  # a bus may hand over the encoded bytes
    return to_arrow(events, origins, raw if any(r is not None for r in raw) else None)

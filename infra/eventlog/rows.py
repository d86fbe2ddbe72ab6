"""Turning events into ``events`` rows: typed identifier columns plus the full event JSON.

Rows are built column-wise into one Arrow table per batch: the fastest insert path into ClickHouse
(chdb reads Arrow natively; clickhouse-connect sends it as Arrow too).

Two builders fill the typed columns. ``LLMCallRecorded`` — nearly every event the recorder sees —
goes column by column (one list comprehension per column, constants as repeated values); every
other event goes row by row through ``_fields``/``_extra``. Column-wise, a call costs a few attribute
reads instead of three Python calls and two tuples, and the batch allocates no per-event containers
that the garbage collector would track and promote: with a bus holding ~10⁵ events, those promotions
set off full collections that used to take a fifth of the recorder's time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson
import pyarrow as pa
import pyarrow.compute as pc
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
    StepMetrics,
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
        ("prompt_version", pa.string()),  # migration 2
        ("adapter", pa.string()),  # migration 3
        ("adapter_version", pa.int64()),  # migration 3
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


def _extra(event: AnyEvent) -> tuple[int, int, int, int, float, int, int, str]:
    """(num_calls, num_transitions, prompt_tokens, completion_tokens, latency_ms, token_faithful,
    prefix_mismatch, error)."""
    if isinstance(event, EpisodeScored):
        err = event.score_error or event.unusable_reason or ""
        return (event.num_calls, len(event.transitions), 0, 0, 0.0, 0, int(event.prefix_mismatches > 0), err)
    if isinstance(event, EpisodeFinished):
        num_calls = -1 if event.num_calls is None else event.num_calls
        return (num_calls, -1, 0, 0, 0.0, 0, 0, event.error or "")
    if isinstance(event, WeightUpdateFailed | DeadLetter):
        return (-1, -1, 0, 0, 0.0, 0, 0, event.error)
    return (-1, -1, 0, 0, 0.0, 0, 0, "")


def _prompt_version(event: AnyEvent) -> str:
    """A call's prompt version, a control event's, or a scored episode's (from its transitions)."""
    if isinstance(event, EpisodeScored):
        return next((t.prompt_version for t in event.transitions if t.prompt_version), "")
    return getattr(event, "prompt_version", None) or ""


def _adapter(event: AnyEvent) -> str:
    """The LoRA adapter of a call, a control event or a trainer step; a scored episode's first policy."""
    if isinstance(event, EpisodeScored):
        return next((t.policy for t in event.transitions if t.policy), "")
    return getattr(event, "adapter", None) or ""


def _adapter_version(event: AnyEvent) -> int:
    version = event.adapter_version if isinstance(event, LLMCallRecorded) else None
    return -1 if version is None else version


def _model_fields(value: object) -> dict[str, object]:
    if isinstance(value, StepMetrics):  # its own serializer: reported figures only, extras included
        return dict(value.as_dict())
    if isinstance(value, BaseModel):
        extra = value.__pydantic_extra__
        return {**value.__dict__, **extra} if extra else value.__dict__
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _json_bytes(event: AnyEvent) -> bytes:
    try:
        return orjson.dumps(event, default=_model_fields, option=orjson.OPT_UTC_Z)
    except (TypeError, orjson.JSONEncodeError):
        return event.model_dump_json().encode()


def event_json(event: AnyEvent) -> str:
    """The event's JSON, byte-identical to ``model_dump_json()`` for every event in ``schemas``.

    orjson walks the models' field dicts about twice as fast as pydantic's serialiser, and the JSON
    is the largest cost per recorded event. A test pins the byte-equality on the fixture of every event;
    anything orjson cannot encode falls back to pydantic.
    """
    return _json_bytes(event).decode()


# Columns 7..26 of SCHEMA (episode_id … error) depend on the event's type; the others do not.
_TYPED = slice(7, 27)
_US = pa.timestamp("us", tz="UTC")
Column = Sequence[object]
TypedColumns = Callable[[Sequence[AnyEvent]], list[Column]]


def _row_columns(events: Sequence[AnyEvent]) -> list[Column]:
    """The typed columns of any events, one row at a time."""
    return list(zip(*[(*_fields(e), *_extra(e)) for e in events], strict=True))


def _call_columns(events: Sequence[AnyEvent]) -> list[Column]:
    """The typed columns of ``LLMCallRecorded`` events, one column at a time (the hot path)."""
    calls: Sequence[LLMCallRecorded] = events  # type: ignore[assignment]  # to_arrow sorted them
    n = len(calls)
    blank, minus = [""] * n, [-1] * n
    return [
        [c.episode_id for c in calls],
        blank,  # task_id
        blank,  # group_id
        [c.tenant or "" for c in calls],
        [c.source.value for c in calls],
        blank,  # mode
        [c.model for c in calls],
        blank,  # status
        [c.call_seq for c in calls],
        minus,  # attempt
        [c.weight_version for c in calls],
        [None] * n,  # reward
        minus,  # num_calls
        minus,  # num_transitions
        [c.prompt_tokens for c in calls],
        [c.completion_tokens for c in calls],
        [c.latency_ms for c in calls],
        [int(c.token_faithful) for c in calls],
        [int(c.prefix_mismatch) for c in calls],
        [c.error or "" for c in calls],
    ]


@dataclass(frozen=True, slots=True)
class _Origins:
    """Where each event of a batch was read from, as columns."""

    topics: list[str]
    keys: list[str]
    partitions: list[int]
    offsets: list[int]

    def pick(self, order: Sequence[int]) -> _Origins:
        return _Origins(
            [self.topics[i] for i in order],
            [self.keys[i] for i in order],
            [self.partitions[i] for i in order],
            [self.offsets[i] for i in order],
        )


def _table(
    events: Sequence[AnyEvent],
    typed: TypedColumns,
    origins: _Origins | None,
    payloads: Sequence[str | bytes | None] | None,
) -> pa.Table:
    n = len(events)
    if origins is None:
        origins = _Origins([topic_for(e) for e in events], [key_for(e) for e in events], [-1] * n, [-1] * n)
    if payloads is None:
        payload: list[str | bytes] = [_json_bytes(e) for e in events]
    else:
        payload = [_json_bytes(e) if p is None else p for e, p in zip(events, payloads, strict=True)]
    # pyarrow converts aware datetimes to UTC itself; ``safe=False`` truncates to the millisecond.
    emitted = pc.cast(pa.array([e.emitted_at for e in events], type=_US), _MS, safe=False)
    now = int(datetime.now(UTC).timestamp() * 1000)
    columns: list[Column | pa.Array] = [
        [e.event_id for e in events],
        [e.type for e in events],
        [e.schema_version for e in events],
        origins.topics,
        origins.keys,
        emitted,
        [e.producer for e in events],
        *typed(events),
        origins.partitions,
        origins.offsets,
        pa.array([now] * n, type=pa.int64()).cast(_MS),
        # As binary, then one vectorised UTF-8 check: ~5× faster than pyarrow's per-item str path.
        pa.array(payload, type=pa.binary(), size=n).cast(pa.string()),
        [_prompt_version(e) for e in events],
        [_adapter(e) for e in events],
        [_adapter_version(e) for e in events],
    ]
    arrays = [
        col if isinstance(col, pa.Array) else pa.array(col, type=field.type, size=n)
        for col, field in zip(columns, SCHEMA, strict=True)
    ]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def _to_arrow(
    events: Sequence[AnyEvent], origins: _Origins | None, payloads: Sequence[str | bytes | None] | None
) -> pa.Table:
    calls = [isinstance(e, LLMCallRecorded) for e in events]
    if all(calls) or not any(calls):
        return _table(events, _call_columns if events and calls[0] else _row_columns, origins, payloads)
    # A mixed batch: calls column-wise, the rest row-wise, then back to the order of ``events``.
    order = [i for i, c in enumerate(calls) if c]
    split = len(order)
    order += [i for i, c in enumerate(calls) if not c]
    parts = []
    for part, typed in ((order[:split], _call_columns), (order[split:], _row_columns)):
        parts.append(
            _table(
                [events[i] for i in part],
                typed,
                None if origins is None else origins.pick(part),
                None if payloads is None else [payloads[i] for i in part],
            )
        )
    return pa.concat_tables(parts).take(pc.sort_indices(pa.array(order)))


def to_arrow(
    events: Sequence[AnyEvent],
    origins: Sequence[Origin] | None = None,
    payloads: Sequence[str | bytes | None] | None = None,
) -> pa.Table:
    """One Arrow table (``SCHEMA``), one row per event in order; ``payloads`` may carry encoded JSON."""
    cols = None
    if origins is not None:
        cols = _Origins(
            [o.topic for o in origins], [o.key for o in origins], [o.partition for o in origins],
            [o.offset for o in origins],
        )  # fmt: skip
    return _to_arrow(events, cols, payloads)


def messages_to_arrow(messages: Sequence[Message]) -> pa.Table:
    """Rows for bus messages, with their topic, key, partition and offset."""
    origins = _Origins(
        [m.topic for m in messages], [m.key for m in messages], [m.partition for m in messages],
        [m.offset for m in messages],
    )  # fmt: skip
    raw = [m.raw for m in messages]  # a bus may hand over the encoded bytes
    return _to_arrow([m.event for m in messages], origins, raw if any(r is not None for r in raw) else None)

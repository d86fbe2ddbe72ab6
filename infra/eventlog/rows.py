"""Turning events into ``events`` rows: typed identifier columns plus the full event JSON.

Rows are built column-wise into one Arrow table per batch: the fastest insert path into ClickHouse
(chdb reads Arrow natively; clickhouse-connect sends it as Arrow too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa

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


def to_arrow(
    events: Sequence[AnyEvent],
    origins: Sequence[Origin] | None = None,
    payloads: Sequence[str | bytes | None] | None = None,
) -> pa.Table:
    """One Arrow table (``SCHEMA``) for ``events``; ``payloads`` may carry already-encoded JSON."""
    n = len(events)
    cols: list[list[object]] = [[] for _ in SCHEMA.names]
    now = int(datetime.now(UTC).timestamp() * 1000)
    (c_id, c_type, c_sv, c_topic, c_key, c_at, c_prod, c_ep, c_task, c_group, c_tenant, c_src, c_mode,
     c_model, c_status, c_seq, c_att, c_wv, c_rew, c_ncalls, c_ntr, c_pt, c_ct, c_lat, c_tf, c_pm,
     c_err, c_part, c_off, c_rec, c_payload) = cols  # fmt: skip
    for i, event in enumerate(events):
        origin = origins[i] if origins is not None else None
        raw = payloads[i] if payloads is not None else None
        ep, task, group, tenant, src, mode, model, status, seq, att, wv, reward = _fields(event)
        c_id.append(event.event_id)
        c_type.append(event.type)
        c_sv.append(event.schema_version)
        c_topic.append(origin.topic if origin else topic_for(event))
        c_key.append(origin.key if origin else key_for(event))
        c_at.append(_ms(event.emitted_at))
        c_prod.append(event.producer)
        c_ep.append(ep)
        c_task.append(task)
        c_group.append(group)
        c_tenant.append(tenant)
        c_src.append(src)
        c_mode.append(mode)
        c_model.append(model)
        c_status.append(status)
        c_seq.append(seq)
        c_att.append(att)
        c_wv.append(wv)
        c_rew.append(reward)
        if isinstance(event, LLMCallRecorded):
            c_ncalls.append(-1)
            c_ntr.append(-1)
            c_pt.append(event.prompt_tokens)
            c_ct.append(event.completion_tokens)
            c_lat.append(event.latency_ms)
            c_tf.append(int(event.token_faithful))
            c_pm.append(int(event.prefix_mismatch))
            c_err.append(event.error or "")
        else:
            num_calls = -1
            num_tr = -1
            err = ""
            mismatch = 0
            if isinstance(event, EpisodeScored):
                num_calls, num_tr = event.num_calls, len(event.transitions)
                err = event.score_error or event.unusable_reason or ""
                mismatch = int(event.prefix_mismatches > 0)
            elif isinstance(event, EpisodeFinished):
                num_calls = -1 if event.num_calls is None else event.num_calls
                err = event.error or ""
            elif isinstance(event, WeightUpdateFailed | DeadLetter):
                err = event.error
            c_ncalls.append(num_calls)
            c_ntr.append(num_tr)
            c_pt.append(0)
            c_ct.append(0)
            c_lat.append(0.0)
            c_tf.append(0)
            c_pm.append(mismatch)
            c_err.append(err)
        c_part.append(origin.partition if origin else -1)
        c_off.append(origin.offset if origin else -1)
        c_rec.append(now)
        if raw is None:
            c_payload.append(event.model_dump_json())
        else:
            c_payload.append(raw.decode() if isinstance(raw, bytes) else raw)
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

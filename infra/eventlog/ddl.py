"""The event log's schema: one source of truth, applied as numbered migrations.

The same text runs on embedded chdb and on a ClickHouse server ≥ 24.8 (no experimental types: the full
event travels as a JSON ``String``, the identifiers every query needs are typed columns beside it).

``events`` is a ReplacingMergeTree whose sorting key ends in ``event_id``, so rows of the same event
(a replayed topic, a retried batch) collapse on merge and read as one under ``FINAL`` or
``LIMIT 1 BY event_id``; summaries use idempotent aggregates (``uniqExact``, ``argMax``, ``min``), so
unmerged duplicates never change a count. Sorting key: ``episode_id`` first (an episode's events are
contiguous, found through the primary index), then ``emitted_at``. Day partitions prune time ranges;
bloom-filter skip indexes serve tenant / group / task lookups; rewards over time read only the small
typed columns of ``episode_scored`` rows.

Columns that an event does not have hold a neutral value ('' / -1 / NULL for ``reward``), never
Nullable inside the sorting key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


SCHEMA_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS {db}.schema_migrations
(
    version UInt32,
    name String,
    applied_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
ORDER BY version
"""

EVENTS = """
CREATE TABLE IF NOT EXISTS {db}.events
(
    event_id String,
    type LowCardinality(String),
    schema_version UInt16,
    topic LowCardinality(String),
    key String,
    emitted_at DateTime64(3, 'UTC'),
    producer LowCardinality(String),
    episode_id String,
    task_id String,
    group_id String,
    tenant String,
    source LowCardinality(String),
    mode LowCardinality(String),
    model LowCardinality(String),
    status LowCardinality(String),
    call_seq Int32,
    attempt Int32,
    weight_version Int64,
    reward Nullable(Float64),
    num_calls Int32,
    num_transitions Int32,
    prompt_tokens UInt32,
    completion_tokens UInt32,
    latency_ms Float32,
    token_faithful UInt8,
    prefix_mismatch UInt8,
    error String,
    bus_partition Int32,
    bus_offset Int64,
    recorded_at DateTime64(3, 'UTC'),
    payload String CODEC(ZSTD(1)),
    INDEX idx_tenant tenant TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX idx_group group_id TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX idx_task task_id TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX idx_type type TYPE set(64) GRANULARITY 4
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMMDD(emitted_at)
ORDER BY (episode_id, emitted_at, event_id)
"""

# The prompt version that served a call (gateway/prompts.py) or that a control event names; '' for none.
PROMPT_VERSION = "ALTER TABLE {db}.events ADD COLUMN IF NOT EXISTS prompt_version String DEFAULT ''"

# The LoRA adapter (policy) that served a call, or that a control event, a trainer step or a scored
# episode's transitions are about ('' for the base), and the adapter's version on a call (-1: none).
ADAPTER = "ALTER TABLE {db}.events ADD COLUMN IF NOT EXISTS adapter LowCardinality(String) DEFAULT ''"
ADAPTER_VERSION = "ALTER TABLE {db}.events ADD COLUMN IF NOT EXISTS adapter_version Int64 DEFAULT -1"

# Spans an agent sent to the gateway's OTLP intake (``agent_spans_recorded`` events, schemas/spans.py),
# one row per span, filled from ``events`` by a materialized view as the recorder inserts: the recorder
# writes one table, and a query reads tool durations and agent steps without parsing payloads.
# Replacing on (episode_id, trace_id, span_id): a span sent twice reads once under FINAL.
AGENT_SPANS = """
CREATE TABLE IF NOT EXISTS {db}.agent_spans
(
    episode_id String,
    tenant String,
    event_id String,
    emitted_at DateTime64(3, 'UTC'),
    trace_id String,
    span_id String,
    parent_span_id String,
    name String,
    kind LowCardinality(String),
    start_time DateTime64(6, 'UTC'),
    end_time DateTime64(6, 'UTC'),
    duration_ms Float64,
    status LowCardinality(String),
    service_name LowCardinality(String),
    scope LowCardinality(String),
    attributes String CODEC(ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMMDD(emitted_at)
ORDER BY (episode_id, trace_id, span_id)
"""

AGENT_SPANS_VIEW = """
CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.agent_spans_mv TO {db}.agent_spans AS
SELECT
    episode_id,
    tenant,
    event_id,
    emitted_at,
    JSONExtractString(span, 'trace_id') AS trace_id,
    JSONExtractString(span, 'span_id') AS span_id,
    JSONExtractString(span, 'parent_span_id') AS parent_span_id,
    JSONExtractString(span, 'name') AS name,
    JSONExtractString(span, 'kind') AS kind,
    parseDateTime64BestEffort(JSONExtractString(span, 'start_time'), 6, 'UTC') AS start_time,
    parseDateTime64BestEffort(JSONExtractString(span, 'end_time'), 6, 'UTC') AS end_time,
    JSONExtractFloat(span, 'duration_ms') AS duration_ms,
    JSONExtractString(span, 'status') AS status,
    JSONExtractString(span, 'service_name') AS service_name,
    JSONExtractString(span, 'scope') AS scope,
    JSONExtractRaw(span, 'attributes') AS attributes
FROM {db}.events
ARRAY JOIN JSONExtractArrayRaw(payload, 'spans') AS span
WHERE type = 'agent_spans_recorded'
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "events table", (EVENTS,)),
    Migration(2, "events.prompt_version", (PROMPT_VERSION,)),
    Migration(3, "events.adapter, events.adapter_version", (ADAPTER, ADAPTER_VERSION)),
    Migration(4, "agent_spans table, filled from events", (AGENT_SPANS, AGENT_SPANS_VIEW)),
)
"""Append new migrations here; never edit an applied one."""

EVENT_COLUMNS: tuple[str, ...] = (
    "event_id",
    "type",
    "schema_version",
    "topic",
    "key",
    "emitted_at",
    "producer",
    "episode_id",
    "task_id",
    "group_id",
    "tenant",
    "source",
    "mode",
    "model",
    "status",
    "call_seq",
    "attempt",
    "weight_version",
    "reward",
    "num_calls",
    "num_transitions",
    "prompt_tokens",
    "completion_tokens",
    "latency_ms",
    "token_faithful",
    "prefix_mismatch",
    "error",
    "bus_partition",
    "bus_offset",
    "recorded_at",
    "payload",
    "prompt_version",
    "adapter",
    "adapter_version",
)


def check_identifier(name: str) -> str:
    """A database name safe to splice into DDL (identifiers cannot be bound as parameters)."""
    if not _IDENT.match(name):
        raise ValueError(f"not a valid ClickHouse database name: {name!r}")
    return name


def render(statement: str, database: str) -> str:
    return statement.replace("{db}", check_identifier(database)).strip()


def bootstrap_statements(database: str) -> list[str]:
    """What must exist before migrations can be tracked."""
    return [
        f"CREATE DATABASE IF NOT EXISTS {check_identifier(database)}",
        render(SCHEMA_MIGRATIONS, database),
    ]

"""Events → ``events`` rows: every event type maps, identifiers land in their columns, JSON kept whole."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

import schemas as s
from infra.eventlog.ddl import EVENT_COLUMNS, MIGRATIONS, bootstrap_statements, render
from infra.eventlog.rows import SCHEMA, Origin, to_arrow
from infra.eventlog.timeparse import parse_when
from tests.fixtures.events import EP, sample_events


def test_every_fixture_event_becomes_a_row_with_its_full_json() -> None:
    events = sample_events()
    table = to_arrow(events)
    assert table.schema == SCHEMA
    assert tuple(table.column_names) == EVENT_COLUMNS
    rows = table.to_pylist()
    assert len(rows) == len(events)
    for event, row in zip(events, rows, strict=True):
        assert row["event_id"] == event.event_id
        assert row["type"] == event.type
        assert s.decode_any(row["payload"]) == event  # nothing lost
        assert row["topic"] == s.topic_for(event)
        assert row["key"] == s.key_for(event)


def test_fast_event_json_is_byte_identical_to_pydantic() -> None:
    from infra.eventlog.rows import event_json
    from tests.benchmarks.recorder import make_call_events

    for event in [*sample_events(), *make_call_events(5)]:
        assert event_json(event) == event.model_dump_json()


def test_identifier_columns() -> None:
    by_type = {r["type"]: r for r in to_arrow(sample_events()).to_pylist()}
    call = by_type["llm_call_recorded"]
    assert (call["episode_id"], call["call_seq"], call["weight_version"], call["token_faithful"]) == (
        EP,
        0,
        3,
        1,
    )
    assert call["reward"] is None
    scored = by_type["episode_scored"]
    assert (scored["group_id"], scored["task_id"], scored["reward"], scored["num_transitions"]) == (
        "g1",
        "task-1",
        1.0,
        1,
    )
    assert scored["weight_version"] == 3  # the oldest version among its transitions
    started = by_type["episode_started"]
    assert (started["task_id"], started["group_id"], started["call_seq"], started["weight_version"]) == (
        "task-1",
        "g1",
        -1,
        -1,
    )
    assert by_type["weights_activated"]["weight_version"] == 4
    assert by_type["rollout_requested"]["episode_id"] == ""


def test_origin_and_precomputed_payload_are_used() -> None:
    event = sample_events()[3]
    table = to_arrow([event], [Origin("flywheel.episodes", "k", 5, 42)], ['{"x":1}'])
    row = table.to_pylist()[0]
    assert (row["topic"], row["key"], row["bus_partition"], row["bus_offset"], row["payload"]) == (
        "flywheel.episodes", "k", 5, 42, '{"x":1}',
    )  # fmt: skip


def test_ddl_renders_for_a_database_and_refuses_bad_names() -> None:
    text = render(MIGRATIONS[0].statements[0], "tenant_a")
    assert "tenant_a.events" in text and "{db}" not in text
    assert "ReplacingMergeTree" in text and "toYYYYMMDD(emitted_at)" in text
    assert bootstrap_statements("x")[0] == "CREATE DATABASE IF NOT EXISTS x"
    for bad in ("a-b", "x; DROP TABLE y", "", "1abc"):
        with pytest.raises(ValueError, match="database name"):
            render(MIGRATIONS[0].statements[0], bad)


def test_ddl_avoids_types_a_24_8_server_lacks() -> None:
    # One DDL for chdb (26.x) and servers ≥ 24.8: no JSON/Dynamic/Variant types (experimental before 25.3).
    for migration in MIGRATIONS:
        for statement in migration.statements:
            assert re.search(r"\sJSON\b", statement) is None  # the type; JSONExtract* functions are fine
            for word in ("Dynamic", "Variant", "Object("):
                assert word not in statement


def test_parse_when() -> None:
    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    assert parse_when("2h", now=now) == now - timedelta(hours=2)
    assert parse_when("2026-11-30T10:00") == datetime(2026, 11, 30, 10, tzinfo=UTC)
    assert parse_when("2026-11-30T10:00Z") == datetime(2026, 11, 30, 10, tzinfo=UTC)
    with pytest.raises(ValueError, match="not a time"):
        parse_when("yesterday-ish")


def test_calls_in_a_mixed_batch_keep_their_order_and_columns() -> None:
    # Calls are built column-wise and other events row-wise: a mixed batch must come back in order.
    from tests.benchmarks.recorder import make_call_events

    calls = make_call_events(3)
    error_call = calls[1].model_copy(
        update={
            "tenant": "acme",
            "error": "upstream 500",
            "prefix_mismatch": True,
            "source": s.EpisodeSource.production,
            "emitted_at": datetime(2026, 11, 30, 14, 0, 0, 123999, tzinfo=timezone(timedelta(hours=2))),
        }
    )
    others = sample_events()
    events = [others[0], calls[0], others[1], error_call, calls[2], *others[2:]]
    origins = [Origin(s.topic_for(e), s.key_for(e), i % 3, 100 + i) for i, e in enumerate(events)]
    rows = to_arrow(events, origins).to_pylist()
    assert [r["event_id"] for r in rows] == [e.event_id for e in events]
    assert [r["bus_offset"] for r in rows] == [100 + i for i in range(len(events))]
    assert [s.decode_any(r["payload"]) for r in rows] == events
    call = rows[3]
    assert {k: call[k] for k in ("episode_id", "task_id", "group_id", "tenant", "source", "mode", "model")} == {
        "episode_id": error_call.episode_id, "task_id": "", "group_id": "", "tenant": "acme",
        "source": "production", "mode": "", "model": "policy",
    }  # fmt: skip
    assert (call["status"], call["call_seq"], call["attempt"], call["weight_version"], call["reward"]) == (
        "", 1, -1, 3, None,
    )  # fmt: skip
    assert (call["num_calls"], call["num_transitions"], call["prompt_tokens"], call["completion_tokens"]) == (
        -1, -1, 60, 60,
    )  # fmt: skip
    assert (call["latency_ms"], call["token_faithful"], call["prefix_mismatch"], call["error"]) == (
        12.5, 1, 1, "upstream 500",
    )  # fmt: skip
    assert call["emitted_at"] == datetime(2026, 11, 30, 12, 0, 0, 123000, tzinfo=UTC)  # ms, in UTC
    assert rows[1]["tenant"] == "" and rows[1]["error"] == "" and rows[1]["prefix_mismatch"] == 0
    # The same calls alone (the all-calls path) give the same rows.
    alone = to_arrow([calls[0], error_call, calls[2]], [origins[1], origins[3], origins[4]]).to_pylist()
    strip = [{k: v for k, v in r.items() if k != "recorded_at"} for r in (rows[1], rows[3], rows[4])]
    assert [{k: v for k, v in r.items() if k != "recorded_at"} for r in alone] == strip


def test_invalid_utf8_payload_is_refused() -> None:
    import pyarrow as pa

    with pytest.raises(pa.ArrowInvalid, match="UTF8"):
        to_arrow([sample_events()[0]], None, [b'{"x":"\xff"}'])


def test_prompt_version_has_its_own_column() -> None:
    """Migration 2: calls, scored episodes (from their transitions) and prompt control events."""
    by_type = {r["type"]: r for r in to_arrow(sample_events()).to_pylist()}
    assert by_type["prompt_version_requested"]["prompt_version"] == "p-0123456789ab"
    assert by_type["llm_call_recorded"]["prompt_version"] == ""
    base = sample_events()
    call = next(e for e in base if isinstance(e, s.LLMCallRecorded)).model_copy(
        update={"prompt_version": "p-x"}
    )
    scored = next(e for e in base if isinstance(e, s.EpisodeScored))
    scored = scored.model_copy(
        update={"transitions": [t.model_copy(update={"prompt_version": "p-x"}) for t in scored.transitions]}
    )
    rows = to_arrow([call, scored]).to_pylist()
    assert [r["prompt_version"] for r in rows] == ["p-x", "p-x"]
    assert any("prompt_version" in st for m in MIGRATIONS for st in m.statements)


def test_adapter_and_its_version_have_their_own_columns() -> None:
    """Migration 3: a call's LoRA adapter and version, a scored episode's policy, an adapter's update."""
    by_type = {r["type"]: r for r in to_arrow(sample_events()).to_pylist()}
    assert (
        by_type["llm_call_recorded"]["adapter"] == ""
        and by_type["llm_call_recorded"]["adapter_version"] == -1
    )
    base = sample_events()
    call = next(e for e in base if isinstance(e, s.LLMCallRecorded))
    call = call.model_copy(update={"adapter": "writer", "adapter_version": 3})
    scored = next(e for e in base if isinstance(e, s.EpisodeScored))
    scored = scored.model_copy(
        update={"transitions": [t.model_copy(update={"policy": "writer"}) for t in scored.transitions]}
    )
    update = s.WeightsActivated(version=4, adapter="rewriter")
    rows = to_arrow([call, scored, update]).to_pylist()
    assert [(r["adapter"], r["adapter_version"]) for r in rows] == [
        ("writer", 3),
        ("writer", -1),
        ("rewriter", -1),
    ]
    assert rows[2]["weight_version"] == 4
    assert any("adapter_version" in st for m in MIGRATIONS for st in m.statements)

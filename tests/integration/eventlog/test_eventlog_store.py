"""The event log on real embedded ClickHouse (chdb): schema, inserts, every query, dedup, read-only."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

import schemas as s
from infra.eventlog.errors import EventLogQueryError, ReadOnlyQueryError
from infra.eventlog.models import CallFilter, EpisodeFilter
from infra.eventlog.store import CHDB_LIMITS, ChdbStore
from tests.fixtures.events import sample_events
from tests.integration.eventlog.helpers import T0, history

pytestmark = pytest.mark.timeout(60)
EVENTS = history()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChdbStore]:
    # chdb: one directory per process, so one store per module, closed at its end.
    st = ChdbStore(tmp_path_factory.mktemp("eventlog") / "chdb", database="evstore")
    try:
        assert st.migrate() == [1, 2, 3, 4]
        st.insert(EVENTS)
        yield st
    finally:
        st.close()


def ids(rows: list) -> list[str]:  # type: ignore[type-arg]
    return sorted(r.episode_id[-1] for r in rows)


def test_migrations_are_idempotent(store: ChdbStore) -> None:
    assert store.migrate() == []
    assert store.migrate() == []
    versions = store.query("SELECT version FROM evstore.schema_migrations FINAL").rows
    assert sorted(versions) == [[1], [2], [3], [4]]


def test_table_columns_match_the_rows_we_build(store: ChdbStore) -> None:
    from infra.eventlog.ddl import EVENT_COLUMNS

    described = store.query("DESCRIBE TABLE evstore.events").rows
    assert tuple(str(r[0]) for r in described) == EVENT_COLUMNS


def test_episode_events_in_order(store: ChdbStore) -> None:
    events = store.episode_events(f"{1:032x}")
    assert [e.type for e in events] == [
        "episode_started", "llm_call_recorded", "llm_call_recorded", "llm_call_recorded",
        "episode_finished", "episode_scored",
    ]  # fmt: skip
    assert [e.call_seq for e in events if e.type == "llm_call_recorded"] == [0, 1, 2]
    assert s.decode_any(events[1].payload).type == "llm_call_recorded"
    assert store.episode_events("f" * 32) == []


def test_episode_summaries(store: ChdbStore) -> None:
    all_eps = store.episodes(EpisodeFilter())
    assert [e.episode_id[-1] for e in all_eps] == ["5", "4", "3", "2", "1"]  # newest first
    first = {e.episode_id[-1]: e for e in all_eps}["1"]
    assert (first.task_id, first.group_id, first.tenant, first.source, first.status) == (
        "sql-1",
        "g1",
        "acme",
        "live",
        "ok",
    )
    assert (first.num_calls, first.num_transitions, first.reward, first.scored) == (3, 3, 1.0, True)
    assert (first.min_weight_version, first.max_weight_version) == (1, 1)
    assert first.started_at == T0
    timeout = {e.episode_id[-1]: e for e in all_eps}["5"]
    assert (timeout.status, timeout.reward) == ("timeout", None)


@pytest.mark.parametrize(
    ("f", "expected"),
    [
        (EpisodeFilter(tenant="acme"), ["1", "2"]),
        (EpisodeFilter(group_id="g2"), ["3", "4"]),
        (EpisodeFilter(task_id="calc-7"), ["3", "4"]),
        (EpisodeFilter(task_id_like="calc-%"), ["3", "4", "5"]),
        (EpisodeFilter(since=T0 + timedelta(hours=1)), ["3", "4", "5"]),
        (EpisodeFilter(since=T0, until=T0 + timedelta(hours=1)), ["1", "2"]),
        (EpisodeFilter(min_reward=0.5), ["1", "3", "4"]),
        (EpisodeFilter(min_reward=0.1, max_reward=0.9), ["3"]),
        (EpisodeFilter(min_weight_version=2), ["3", "4", "5"]),
        (EpisodeFilter(max_weight_version=1), ["1", "2"]),
        (EpisodeFilter(source="production"), ["4"]),
        (EpisodeFilter(status="timeout"), ["5"]),
        (EpisodeFilter(tenant="acme", min_reward=1.0), ["1"]),
        (EpisodeFilter(tenant="nobody"), []),
        (EpisodeFilter(limit=2), ["4", "5"]),
    ],
)
def test_episode_filters(store: ChdbStore, f: EpisodeFilter, expected: list[str]) -> None:
    assert ids(store.episodes(f)) == expected


def test_select_scored_episodes_for_replay(store: ChdbStore) -> None:
    scored = list(store.select_scored_episodes(EpisodeFilter(min_reward=0.5)))
    assert [e.episode_id[-1] for e in scored] == ["1", "3", "4"]  # oldest first
    assert all(isinstance(e, s.EpisodeScored) for e in scored)
    assert scored[0].transitions[0].behaviour_logprobs == [-0.5, -0.25]
    assert [e.episode_id[-1] for e in store.select_scored_episodes(EpisodeFilter(min_weight_version=3))] == [
        "4",
        "5",
    ]
    assert list(store.select_scored_episodes(EpisodeFilter(tenant="nobody"))) == []
    assert len(list(store.select_scored_episodes(EpisodeFilter(limit=2)))) == 2


def test_select_calls_for_export(store: ChdbStore) -> None:
    calls = list(store.select_calls(CallFilter(episode_ids=[f"{1:032x}", f"{4:032x}"])))
    assert [(c.episode_id[-1], c.call_seq) for c in calls] == [
        ("1", 0),
        ("1", 1),
        ("1", 2),
        *[("4", i) for i in range(4)],
    ]
    assert len(list(store.select_calls(CallFilter(tenant="globex", min_weight_version=3)))) == 5
    assert len(list(store.select_calls(CallFilter(limit=3)))) == 3


def test_stats_over_time(store: ChdbStore) -> None:
    days = store.stats(bucket="day")
    assert [p.bucket.day for p in days] == [29, 30]
    assert days[0].episodes == 3
    assert days[0].mean_reward == pytest.approx(0.5)
    assert days[0].success_rate == pytest.approx(1 / 3)
    assert days[0].mean_calls == pytest.approx(2.0)
    assert days[1].ok_rate == pytest.approx(0.5)
    hours = store.stats(since=T0, until=T0 + timedelta(hours=3), bucket="hour")
    assert [p.episodes for p in hours] == [2, 1]


def test_replayed_rows_change_no_count(store: ChdbStore) -> None:
    before = store.counts()
    before_eps = store.episodes(EpisodeFilter())
    store.insert(EVENTS)  # the same events again, as a topic replayed from offset 0 would
    store.insert(EVENTS[:7])
    assert store.counts() == before
    assert store.episodes(EpisodeFilter()) == before_eps
    assert len(store.episode_events(f"{1:032x}")) == 6
    assert len(list(store.select_scored_episodes(EpisodeFilter(), latest_per_episode=False))) == 5
    assert len(list(store.select_calls(CallFilter()))) == 11
    assert store.query("SELECT count() FROM evstore.events FINAL").rows == [[before.total]]


def test_every_event_type_round_trips(store: ChdbStore) -> None:
    events = sample_events()
    store.insert(events)
    got = store.query(
        "SELECT payload FROM evstore.events FINAL WHERE producer = 'fixture' ORDER BY event_id"
    ).rows
    assert [s.decode_any(str(r[0])) for r in got] == sorted(events, key=lambda e: e.event_id)


def test_query_is_read_only_twice_over(store: ChdbStore) -> None:
    result = store.query("SELECT type, count() AS n FROM evstore.events GROUP BY type ORDER BY type LIMIT 2")
    assert result.columns == ["type", "n"] and len(result.rows) == 2
    with pytest.raises(ReadOnlyQueryError):
        store.query("INSERT INTO evstore.events (event_id) VALUES ('x')")
    # The engine's own readonly setting holds even if the lexical gate were bypassed.
    for sql in (
        "INSERT INTO evstore.events (event_id) VALUES ('x')",
        "DROP TABLE evstore.events",
        "SELECT * FROM file('/etc/hostname', 'LineAsString')",
    ):
        with pytest.raises(EventLogQueryError, match="readonly"):
            store._select_readonly(sql, 10)
    assert store.query("SELECT count() FROM evstore.events WHERE event_id = 'x'").rows == [[0]]
    with pytest.raises(EventLogQueryError, match="UNKNOWN"):
        store.query("SELECT nope FROM evstore.events")


def test_one_chdb_directory_per_process_is_said_clearly(store: ChdbStore, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from infra.eventlog.errors import EventLogError

    with pytest.raises(EventLogError, match=r"already has the chdb directory .* open"):
        ChdbStore(tmp_path / "other", "evstore")
    second = ChdbStore(store.path, "evstore_second")  # the same directory again is fine
    second.close()
    assert store.counts().total > 0  # and closing it left the first store working


def test_settings_cannot_be_loosened_by_a_query(store: ChdbStore) -> None:
    with pytest.raises(EventLogQueryError, match="readonly"):
        store.query("SELECT 1 SETTINGS readonly = 0")
    with pytest.raises(EventLogQueryError, match="readonly"):
        store.query("SELECT 1 SETTINGS max_execution_time = 0")


def test_the_engine_runs_with_the_embedded_limits(store: ChdbStore) -> None:
    """chdb's caches default to a server's (5 GiB each for marks and primary indexes, never shrinking):
    the store starts the engine with CHDB_LIMITS instead."""
    names = ", ".join(f"'{k}'" for k in CHDB_LIMITS)
    result = store.query(f"SELECT name, value FROM system.server_settings WHERE name IN ({names})")
    assert {str(name): int(str(value)) for name, value in result.rows} == CHDB_LIMITS
    assert CHDB_LIMITS["mark_cache_size"] <= 64 << 20 and CHDB_LIMITS["uncompressed_cache_size"] == 0


def test_query_rows_are_json_ready(store: ChdbStore) -> None:
    result = store.query(
        "SELECT emitted_at, reward, [1, 2] AS arr FROM evstore.events WHERE type = 'episode_scored' ORDER BY emitted_at LIMIT 1"
    )
    assert result.rows == [["2026-11-29T10:00:05+00:00", 1.0, [1, 2]]]
    assert len(store.query("SELECT number FROM system.numbers LIMIT 50", max_rows=7).rows) == 7


def test_pages_join_up_without_gaps_or_repeats(store: ChdbStore, monkeypatch: pytest.MonkeyPatch) -> None:
    import infra.eventlog.base as base

    whole_scored = [e.event_id for e in store.select_scored_episodes(EpisodeFilter())]
    whole_calls = [e.event_id for e in store.select_calls(CallFilter())]
    monkeypatch.setattr(base, "_PAGE", 2)
    assert [e.event_id for e in store.select_scored_episodes(EpisodeFilter())] == whole_scored
    assert [e.event_id for e in store.select_calls(CallFilter())] == whole_calls
    assert len(whole_scored) >= 5 and len(set(whole_calls)) == len(whole_calls) >= 11
    assert len(list(store.select_scored_episodes(EpisodeFilter(limit=3)))) == 3


def test_task_history_is_each_tasks_live_group_rewards(store: ChdbStore) -> None:
    """What the curriculum reads (trainer/curriculum.py): per task, its live groups' rewards; production
    sessions and unscored episodes are not a task's history."""
    mine = {"sql-1", "calc-7", "calc-8"}  # this history's tasks (other tests of the module add theirs)

    def of_history(since: datetime | None = None) -> dict[str, list[list[float]]]:
        got = store.task_history(since=since)
        return {task: [sorted(g) for g in groups] for task, groups in got.items() if task in mine}

    assert of_history() == {"sql-1": [[0.0, 1.0]], "calc-7": [[0.5]]}
    assert of_history(T0 + timedelta(hours=1)) == {"calc-7": [[0.5]]}

"""Where ``flywheel optimize`` gets tasks: a JSONL file (bad lines named) or past episodes in the event log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from flywheel.optimize.tasks import (
    TaskFileError,
    load_tasks,
    split,
    tasks_from_eventlog,
    write_tasks,
)
from schemas import EpisodeStarted, Task, new_episode_id

pytestmark = pytest.mark.timeout(60)


def test_task_file_round_trip_bad_lines_and_split(tmp_path: Path) -> None:
    tasks = [
        Task(task_id=f"t{i}", input={"question": f"What is {i}+1?"}, answer=str(i + 1)) for i in range(6)
    ]
    write_tasks(tmp_path / "t.jsonl", tasks)
    assert load_tasks(tmp_path / "t.jsonl") == tasks
    (tmp_path / "bad.jsonl").write_text(tasks[0].model_dump_json() + '\n# comment\n{"input": 1}\n')
    with pytest.raises(TaskFileError, match=r"bad.jsonl:3: not a task"):
        load_tasks(tmp_path / "bad.jsonl")
    train, val, test = split(tasks, train=3, val=2, test=1, seed=0)
    ids = [t.task_id for t in train + val + test]
    assert len(set(ids)) == 6 and split(tasks, train=3, val=2, test=1, seed=0)[0] == train
    with pytest.raises(TaskFileError, match="6 distinct tasks"):
        split(tasks, train=5, val=2, test=0, seed=0)


def test_tasks_of_past_episodes_latest_per_task(tmp_path: Path) -> None:
    from infra.eventlog.store import open_store

    t0 = datetime(2026, 11, 30, tzinfo=UTC)
    old = Task(task_id="calc-1", input={"question": "old"})
    new = Task(task_id="calc-1", input={"question": "new"})
    other = Task(task_id="calc-2", input={"question": "two"})
    events = [
        EpisodeStarted(episode_id=new_episode_id(), task=task, emitted_at=t0 + timedelta(minutes=i))
        for i, task in enumerate([old, other, new])
    ]
    events.append(EpisodeStarted(episode_id=new_episode_id(), emitted_at=t0))  # production: no task
    store = open_store(chdb_path=tmp_path / "chdb")
    try:
        store.insert(events)
        got = tasks_from_eventlog(store, 10)
    finally:
        store.close()
    assert sorted(got, key=lambda t: t.task_id) == [new, other]


def test_migration_2_adds_prompt_version_to_an_existing_log(tmp_path: Path) -> None:
    from infra.eventlog.ddl import EVENTS, bootstrap_statements, render
    from infra.eventlog.store import ChdbStore
    from tests.fixtures.events import sample_events

    store = ChdbStore(tmp_path / "chdb", "evold")
    try:
        for statement in [*bootstrap_statements("evold"), render(EVENTS, "evold")]:
            store._command(statement)  # a log written before migration 2
        store._command("INSERT INTO evold.schema_migrations (version, name) VALUES (1, 'events table')")
        assert store.migrate() == [2, 3, 4]
        store.insert(sample_events())
        rows = store.query(
            "SELECT prompt_version FROM evold.events WHERE type = 'prompt_version_activated'"
        ).rows
        assert rows == [["p-0123456789ab"]]
    finally:
        store.close()

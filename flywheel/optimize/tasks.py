"""Where ``flywheel optimize`` gets its tasks: a JSONL task file, or past episodes in the event log.

A task file holds one ``schemas.Task`` per line (``{"task_id", "input", "answer", "scorer"}``); blank
lines and ``#`` comments are skipped, and a bad line is reported with its number. From the event log,
the tasks of past training episodes (``EpisodeStarted.task``, latest per ``task_id``) are taken, so an
agent's own history is its optimisation set. :func:`split` shuffles with a seed and cuts disjoint
train / validation / test sets.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from flywheel.taskfile import TaskFileError, load_task_file
from schemas import EpisodeStarted, Task

__all__ = ["TaskFileError", "load_tasks", "split", "tasks_from_eventlog", "write_tasks"]


def load_tasks(path: Path) -> list[Task]:
    if not path.is_file():
        raise TaskFileError(f"no task file at {path}")
    return load_task_file(path)


class _Queryable(Protocol):
    database: str

    def query(self, sql: str, *, max_rows: int = 10_000) -> Any: ...


def tasks_from_eventlog(store: _Queryable, limit: int) -> list[Task]:
    """The tasks of past episodes (latest ``EpisodeStarted`` per task id), newest first."""
    sql = (
        f"SELECT payload FROM {store.database}.events WHERE type = 'episode_started' AND task_id != '' "
        f"ORDER BY emitted_at DESC LIMIT 1 BY task_id LIMIT {int(limit)}"
    )
    out: list[Task] = []
    for (payload,) in store.query(sql, max_rows=limit).rows:
        started = EpisodeStarted.model_validate_json(str(payload))
        if started.task is not None:
            out.append(started.task)
    return out


def write_tasks(path: Path, tasks: Sequence[dict[str, Any] | Task]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [t.model_dump_json() if isinstance(t, Task) else json.dumps(t) for t in tasks]
    path.write_text("\n".join(lines) + "\n")


def split(
    tasks: Sequence[Task], *, train: int, val: int, test: int, seed: int
) -> tuple[list[Task], list[Task], list[Task]]:
    """Disjoint train / validation / test sets, shuffled with ``seed``; fails if there are too few."""
    unique = list({t.task_id: t for t in tasks}.values())
    if train + val + test > len(unique):
        raise TaskFileError(
            f"{len(unique)} distinct tasks, but {train} train + {val} validation + {test} test were asked for"
        )
    random.Random(seed).shuffle(unique)
    return unique[:train], unique[train : train + val], unique[train + val : train + val + test]

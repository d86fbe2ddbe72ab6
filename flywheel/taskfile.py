"""Task files, read one way by every command that takes one (``flywheel tasks submit``, ``flywheel up
--tasks``, ``flywheel optimize --tasks``), and the one guess of an agent's kind from its spec.

A task file holds one ``schemas.Task`` per line (``{"task_id", "input", "answer", "scorer"}``); blank
lines and ``#`` comments are skipped. A bad line is reported as ``FILE:LINE: not a task: <reason>``,
a repeated ``task_id`` as ``FILE:LINE: duplicate task_id 'x'``; the good lines are kept.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from schemas import AgentKind, Task


class TaskFileError(ValueError):
    pass


def read_task_file(path: Path) -> tuple[list[Task], list[str]]:
    """The valid tasks of ``path`` and one message per bad line; :class:`TaskFileError` when it cannot
    be read at all."""
    tasks: list[Task] = []
    errors: list[str] = []
    seen: set[str] = set()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise TaskFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            task = Task.model_validate_json(line)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            errors.append(f"{path}:{lineno}: not a task: {first['msg']}" + (f" at {where}" if where else ""))
            continue
        if task.task_id in seen:
            errors.append(f"{path}:{lineno}: duplicate task_id {task.task_id!r}")
            continue
        seen.add(task.task_id)
        tasks.append(task)
    return tasks, errors


def load_task_file(path: Path) -> list[Task]:
    """Every task of ``path``, or :class:`TaskFileError` naming the first bad line (or an empty file)."""
    tasks, errors = read_task_file(path)
    if errors:
        raise TaskFileError(errors[0])
    if not tasks:
        raise TaskFileError(f"{path} holds no tasks")
    return tasks


def guess_agent_kind(spec: str) -> AgentKind:
    """A Job template path (``.yaml``/``.yml``/``.json``), a ``module:function``, else a command line."""
    if spec.endswith((".yaml", ".yml", ".json")) and " " not in spec:
        return AgentKind.kubernetes
    if " " not in spec and ":" in spec and not spec.startswith(("/", ".")):
        return AgentKind.callable
    return AgentKind.command

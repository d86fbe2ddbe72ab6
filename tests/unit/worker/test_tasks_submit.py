"""`flywheel tasks submit`: line validation, the requests it builds, clear one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from flywheel.cli.main import app
from flywheel.cli.worker_cmd import _agent_kind, build_requests, read_tasks
from schemas import AgentKind, AgentRef, Mode


@pytest.fixture
def tasks_file(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        '{"task_id": "a", "input": {"q": 1}, "answer": "42", "scorer": {"name": "exact"}}\n'
        "\n"
        '{"input": 2}\n'
        "not json\n"
        '{"task_id": "a"}\n'
        '{"task_id": "b", "bogus": 1}\n'
        '{"task_id": "c"}\n'
    )
    return path


def test_bad_lines_are_reported_with_line_numbers(tasks_file: Path) -> None:
    tasks, errors = read_tasks(tasks_file)
    assert [t.task_id for t in tasks] == ["a", "c"]
    assert [e.split(": ")[0].rsplit(":", 1)[1] for e in errors] == ["3", "4", "5", "6"]
    assert "task_id" in errors[0] and "duplicate" in errors[2] and "bogus" in errors[3]


def test_requests_form_one_group_per_task(tasks_file: Path) -> None:
    tasks, _ = read_tasks(tasks_file)
    agent = AgentRef(kind=AgentKind.command, spec="python a.py")
    reqs = build_requests(
        tasks, agent=agent, n=3, deadline_s=9.0, max_attempts=2, mode=Mode.val, model="m", pool=None
    )
    assert len(reqs) == 6 and len({r.group_id for r in reqs}) == 2
    assert [r.sample_index for r in reqs] == [0, 1, 2, 0, 1, 2]
    assert all(
        r.group_size == 3 and r.deadline_s == 9.0 and r.max_attempts == 2 and r.mode is Mode.val for r in reqs
    )


def test_agent_kind_guess() -> None:
    assert _agent_kind("python my_agent.py", None) == "command"
    assert _agent_kind("pkg.mod:run", None) == "callable"
    assert _agent_kind("jobs/agent.yaml", None) == "kubernetes"
    assert _agent_kind("pkg.mod:run", "command") == "command"


@pytest.mark.timeout(30)
def test_cli_errors_are_one_line(tasks_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_BUS", "memory")
    runner = CliRunner()
    res = runner.invoke(app, ["tasks", "submit", str(tasks_file), "--agent", "python a.py"])
    assert res.exit_code == 1 and "FLYWHEEL_BUS=kafka" in res.output and f"{tasks_file}:3:" in res.output
    res = runner.invoke(app, ["tasks", "submit", str(tmp_path / "missing.jsonl"), "--agent", "m:f"])
    assert res.exit_code == 2 and "is not a file" in res.output
    res = runner.invoke(app, ["tasks", "submit", str(tasks_file), "--agent", "m:f", "--n", "0"])
    assert res.exit_code == 2 and "--n" in res.output

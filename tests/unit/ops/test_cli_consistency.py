"""The `flywheel` command tree keeps one set of conventions (docs/usage.md, "The command line").

Every lazily registered command is loaded through ``flywheel.cli.main.load_command`` and its click tree
walked:

- a group that lists things lists them with ``ls``; a ``list`` command may exist only as a hidden
  alias of ``ls`` (the same function);
- a command that reads or reports state has ``--json``: its name is one of :data:`READ_NAMES`, or it
  is one of :data:`REPORTING` (commands that act and report what they did);
- every option and argument has help text;
- ``flywheel --version`` prints what ``flywheel version`` prints and exits 0, and ``flywheel --help``
  imports no command module (the table stays lazy).

Then a few commands that run offline are run, and their ``--json`` output must parse as one JSON
document on stdout; the exit codes 0/1/2 are checked on commands that end each way.
"""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
from typer._click import Command
from typer.core import TyperGroup as Group
from typer.testing import CliRunner

from flywheel.cli.main import COMMANDS, app, load_command

ROOT = Path(__file__).resolve().parents[3]

READ_NAMES = frozenset({"ls", "list", "show", "status", "doctor", "healthcheck", "stats", "query", "version"})
REPORTING = frozenset(
    {
        ("tasks", "submit"),
        ("trainer", "pause"),
        ("trainer", "resume"),
        ("keys", "create"),
        ("keys", "revoke"),
        ("kafka", "start"),
        ("kafka", "stop"),
        ("topics", "create"),
        ("db", "migrate"),
        ("replay",),
        ("export",),
        ("record",),
        ("versions", "promote"),
        ("versions", "rollback"),
        ("versions", "pin"),
        ("versions", "canary"),
        ("episodes", "open"),
        ("model", "smollm2"),
        ("model", "gemma3"),
        ("model", "fingerprint"),
    }
)


def _walk(command: Command, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Command]]:
    yield path, command
    if isinstance(command, Group):
        for name, sub in command.commands.items():
            yield from _walk(sub, (*path, name))


def _function(command: Command) -> object:
    """The function behind a command (typer wraps it once per registration)."""
    return inspect.unwrap(command.callback) if command.callback is not None else None


@pytest.fixture(scope="module")
def tree() -> dict[tuple[str, ...], Command]:
    """Every command of the table, loaded as it is when it runs, by its path (``("keys", "ls")``)."""
    return {path: cmd for name in COMMANDS for path, cmd in _walk(load_command(name), (name,))}


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for name in ("FLYWHEEL_BUS", "FLYWHEEL_ADMIN_URL", "FLYWHEEL_KAFKA_BOOTSTRAP", "FLYWHEEL_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(tmp_path))
    return CliRunner()


@pytest.mark.timeout(300)
def test_groups_list_with_ls_and_keep_list_as_a_hidden_alias(tree: dict[tuple[str, ...], Command]) -> None:
    groups = {path: cmd for path, cmd in tree.items() if isinstance(cmd, Group)}
    assert {("keys",), ("topics",), ("episodes",), ("weights",), ("versions",)} <= set(groups)
    wrong = []
    for path, group in groups.items():
        listing = group.commands.get("list")
        if listing is None:
            continue
        ls = group.commands.get("ls")
        if ls is None or not listing.hidden or _function(listing) is not _function(ls):
            wrong.append(" ".join(path))
    assert not wrong, f"`list` that is not a hidden alias of `ls` in: {wrong}"
    assert all("ls" in groups[p].commands for p in [("keys",), ("topics",), ("episodes",), ("weights",)])


@pytest.mark.timeout(300)
def test_commands_that_read_or_report_state_have_json(tree: dict[tuple[str, ...], Command]) -> None:
    reading = [
        p for p, c in tree.items() if not isinstance(c, Group) and (p[-1] in READ_NAMES or p in REPORTING)
    ]
    assert len(reading) > 25 and set(tree) >= REPORTING  # the rule still names real commands
    missing = [
        " ".join(path)
        for path in reading
        if not any("--json" in getattr(p, "opts", ()) for p in tree[path].params)
    ]
    assert not missing, f"no --json on: {missing}"


@pytest.mark.timeout(300)
def test_every_option_and_argument_has_help(tree: dict[tuple[str, ...], Command]) -> None:
    bare = [
        f"{' '.join(path)} {param.opts[0] if param.opts else param.name}"
        for path, cmd in tree.items()
        for param in cmd.params
        if not (getattr(param, "help", None) or "").strip()
    ]
    assert not bare, f"without help: {bare}"


@pytest.mark.timeout(60)
def test_version_option_prints_the_version(runner: CliRunner) -> None:
    flag = runner.invoke(app, ["--version"])
    command = runner.invoke(app, ["version"])
    assert flag.exit_code == 0 and command.exit_code == 0
    assert flag.stdout == command.stdout == version("flywheel") + "\n"
    as_json = runner.invoke(app, ["version", "--json"])
    assert json.loads(as_json.stdout) == {"version": version("flywheel")}


@pytest.mark.timeout(60)
def test_help_stays_lazy() -> None:
    """``flywheel --help`` and ``--version`` list and print from the table: no command module loaded."""
    code = (
        "import sys, json\n"
        "from flywheel.cli.main import app\n"
        "for args in (['--help'], ['--version']):\n"
        "    try:\n"
        "        app(args)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "loaded = [m for m in sys.modules if m.endswith('_cmd') or m.split('.')[0] in ('torch', 'gateway')]\n"
        "print(json.dumps(loaded))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=50, check=True
    )
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == ["flywheel.cli.version_cmd"], loaded  # --version loads only the version command


@pytest.mark.timeout(60)
def test_keys_json_outputs_parse(runner: CliRunner, tmp_path: Path) -> None:
    created = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--json"])
    assert created.exit_code == 0, created.output
    key = json.loads(created.stdout)
    assert key["tenant"] == "acme" and key["key"].startswith("fw_")
    listed = runner.invoke(app, ["keys", "ls", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert [(r["key_id"], r["tenant"], r["revoked"]) for r in rows] == [(key["key_id"], "acme", False)]
    assert key["key"] not in listed.stdout
    alias = runner.invoke(app, ["keys", "list", "--json"])  # the old name still works
    assert alias.exit_code == 0 and json.loads(alias.stdout) == rows
    revoked = runner.invoke(app, ["keys", "revoke", key["key_id"], "--json"])
    assert revoked.exit_code == 0 and json.loads(revoked.stdout) == {"revoked": 1}
    shown = runner.invoke(app, ["keys", "--help"]).stdout
    assert re.search(r"\bls\b", shown) and not re.search(r"\blist\b", shown)  # the alias is hidden


@pytest.mark.timeout(60)
def test_offline_reads_print_one_json_document(runner: CliRunner, tmp_path: Path) -> None:
    weights = runner.invoke(app, ["weights", "ls", "--json", "--dir", str(tmp_path / "trainer")])
    assert weights.exit_code == 0 and json.loads(weights.stdout) == []
    kafka = runner.invoke(app, ["kafka", "status", "--json", "--port", "19999", "--data-dir", str(tmp_path)])
    assert kafka.exit_code == 1  # not running: the report, and the exit code that says so
    assert json.loads(kafka.stdout) | {"data_dir": None} == {
        "running": False,
        "ready": False,
        "pid": None,
        "bootstrap": "127.0.0.1:19999",
        "data_dir": None,
    }
    health = runner.invoke(app, ["healthcheck", "--http", "http://127.0.0.1:9/", "--timeout", "2", "--json"])
    assert health.exit_code == 1
    answer = json.loads(health.stdout)
    assert answer["healthy"] is False and len(answer["problems"]) == 1


@pytest.mark.timeout(60)
def test_exit_codes_are_the_documented_ones(runner: CliRunner, tmp_path: Path) -> None:
    """0 done, 1 the operation failed, 2 the command line is wrong (typer's own usage errors too)."""
    assert runner.invoke(app, ["keys", "ls"]).exit_code == 0
    assert runner.invoke(app, ["keys", "revoke", "nosuchkey"]).exit_code == 1  # nothing matched to revoke
    assert runner.invoke(app, ["kafka", "status", "--data-dir", str(tmp_path)]).exit_code == 1
    assert runner.invoke(app, ["keys", "revoke"]).exit_code == 2  # neither a key id nor --tenant
    assert runner.invoke(app, ["keys", "ls", "--no-such-option"]).exit_code == 2
    assert runner.invoke(app, ["no-such-command"]).exit_code == 2
    assert runner.invoke(app, ["versions", "show", "not-a-number"]).exit_code == 2
    doc = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    section = doc.split("## The command line", 1)[1].split("\n## ", 1)[0]
    for code in ("`0`", "`1`", "`2`"):
        assert code in section
    assert "tests/unit/ops/test_cli_consistency.py" in section


@pytest.mark.timeout(60)
def test_tasks_submit_json_is_the_only_stdout(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker is stubbed out (publishing itself: tests/e2e/test_rollouts_kafka.py); what is printed is not.

    The stub logs as the bus does: log lines go to stderr, at FLYWHEEL_LOG_LEVEL (INFO by default),
    whatever the command.
    """
    from flywheel.cli import worker_cmd
    from infra.logging import get_logger

    async def published(*_: object) -> None:
        get_logger("infra.bus").debug("bus.partitions_assigned", topic="flywheel.tasks")
        get_logger("infra.bus").info("bus.slow_broker", topic="flywheel.tasks")

    monkeypatch.setenv("FLYWHEEL_BUS", "kafka")
    monkeypatch.setattr(worker_cmd, "_publish", published)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"task_id": "a", "input": "q"}\n{"task_id": "b", "input": "q"}\nnot json\n')
    args = ["tasks", "submit", str(tasks), "--agent", "pkg.mod:run", "--n", "3"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 2, result.output  # a bad line: reported, the rest published
    assert json.loads(result.stdout) == {
        "published": 6,
        "tasks": 2,
        "groups": 2,
        "bad_lines": 1,
        "topic": "flywheel.tasks",
    }
    assert ":3:" in result.stderr
    assert "bus.slow_broker" in result.stderr and "bus.partitions_assigned" not in result.output
    human = runner.invoke(app, args)
    assert human.exit_code == 2 and "published 6 rollout(s)" in human.stdout


@pytest.mark.timeout(30)
def test_replay_progress_line() -> None:
    """What `flywheel replay --url` prints on stderr while a paced replay runs (through a running stack:
    tests/integration/ops/test_ops_cli.py)."""
    from flywheel.cli.replay_cmd import progress_line

    assert progress_line({"run_id": "ab12", "selected": 0, "state": "running"}) == (
        "replay ab12: selecting episodes…"
    )
    running = {
        "run_id": "ab12",
        "selected": 40,
        "skipped": {"stale": 8},
        "sent": 12,
        "steps": 4,
        "steps_taken": 1,
    }
    assert progress_line(running) == "replay ab12: 12 of 32 episode(s) sent, 1 of 4 trainer step(s) taken"

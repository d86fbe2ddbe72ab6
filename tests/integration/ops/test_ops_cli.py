"""The ops commands as a user types them: bad input, empty results, JSON output, exit codes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flywheel.cli.main import app
from infra.eventlog.store import ChdbStore
from tests.integration.ops.synthetic import synthetic_run

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A FLYWHEEL_DATA_DIR whose chdb holds a recorded synthetic run (closed again: the CLI opens it)."""
    root = tmp_path_factory.mktemp("ops-cli")
    store = ChdbStore(root / "chdb")
    try:
        store.migrate()
        store.insert(synthetic_run().events)
    finally:
        store.close()
    yield root


@pytest.fixture
def cli(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for name in (
        "FLYWHEEL_BUS",
        "FLYWHEEL_ADMIN_URL",
        "FLYWHEEL_CLICKHOUSE_URL",
        "FLYWHEEL_ENV",
        "FLYWHEEL_UPSTREAM_URLS",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(data_dir))
    return CliRunner()


def _one_line_error(result: object) -> str:
    output = result.output  # type: ignore[attr-defined]
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: ")
    return str(lines[0])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["replay", "--since", "last tuesday"], "as a time"),
        (["replay", "--since", "2026-12-01", "--until", "2026-11-01"], "since must be before until"),
        (["replay", "--rate", "-5/s"], "positive"),
        (["replay", "--rate", "lots"], "cannot read rate"),
        (["replay", "--weight-version", "7..3"], "empty"),
        (["replay", "--min-reward", "high"], "number"),
        (["replay", "--limit", "0"], "positive whole number"),
        (["export", "--format", "csv"], "jsonl or parquet"),
        (["export", "--kind", "dpo"], "sft or rl"),
        (["export", "--source", "tv"], "live, production or replay"),
        (["stats", "--bucket", "fortnight"], "minute, hour or day"),
        (["stats", "--plot", "curves.jpg"], "PNG"),
        (["healthcheck"], "nothing to check"),
        (["up"], "--model DIR"),
        (["up", "--model", "/nonexistent"], "not a Hugging Face model directory"),
        (["up", "--tiny", "--tasks", "tasks.jsonl"], "--tasks and --agent go together"),
    ],
)
def test_malformed_options_exit_2_with_one_line(cli: CliRunner, args: list[str], needle: str) -> None:
    result = cli.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert needle in _one_line_error(result)


def test_replay_dry_run_reports_selected_skipped(cli: CliRunner) -> None:
    result = cli.invoke(app, ["replay", "--since", "1d", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["selected"] == 11 and report["eligible"] == 8 and report["sent"] == 0
    assert report["skipped"] == {"no_logprobs": 1, "no_transitions:no_token_ids": 1, "not_train": 1}


def test_replay_matching_nothing_says_so_and_exits_0(cli: CliRunner) -> None:
    result = cli.invoke(app, ["replay", "--tenant", "nobody", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "no scored episodes match the filter (tenant=nobody)" in result.output


def test_replay_on_the_memory_bus_needs_the_running_stack(cli: CliRunner) -> None:
    result = cli.invoke(app, ["replay", "--since", "1d"])
    assert result.exit_code == 1
    assert "--url" in _one_line_error(result)


def test_export_and_stats_from_the_cli(cli: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "rl.parquet"
    result = cli.invoke(app, ["export", "--kind", "rl", "--format", "parquet", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert (
        json.loads(result.output)["rows"] == pq.read_table(out).num_rows == 16 + 2
    )  # + the val episode's two
    result = cli.invoke(app, ["stats", "--bucket", "day", "--plot", str(tmp_path / "s.png"), "--json"])
    assert result.exit_code == 0, result.output
    points = json.loads(result.output)["points"]
    assert sum(p["episodes"] for p in points) >= 8
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_memory_bus_commands_point_to_the_running_stack(cli: CliRunner) -> None:
    for args in (["status"], ["topics", "ls"], ["topics", "create"]):
        result = cli.invoke(app, args)
        assert result.exit_code == 1, (args, result.output)
        assert "flywheel up" in _one_line_error(result)


def test_doctor_names_an_unreachable_dependency(cli: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_BUS", "kafka")
    monkeypatch.setenv("FLYWHEEL_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    result = cli.invoke(app, ["doctor", "--json", "--timeout", "2", "--upstream", "http://127.0.0.1:1/v1"])
    assert result.exit_code == 1
    checks = {c["name"]: c for c in json.loads(result.output)["checks"]}
    assert checks["kafka"]["level"] == "fail" and "127.0.0.1:1" in checks["kafka"]["detail"]
    assert checks["kafka"]["fix"]
    assert checks["upstream http://127.0.0.1:1/v1"]["level"] == "fail"
    assert "Traceback" not in result.output


def test_doctor_refuses_a_placeholder_token_in_production(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYWHEEL_ENV", "production")
    monkeypatch.delenv("FLYWHEEL_ADMIN_TOKEN", raising=False)
    result = cli.invoke(app, ["doctor", "--json"])
    assert result.exit_code == 1
    first = json.loads(result.output)["checks"][0]
    assert first["level"] == "fail" and "FLYWHEEL_ADMIN_TOKEN" in first["detail"]


def test_doctor_reports_chdb_held_by_another_process(cli: CliRunner, data_dir: Path) -> None:
    store = ChdbStore(data_dir / "chdb")  # holding it here is enough: doctor tests the lock like any process
    try:
        result = cli.invoke(app, ["doctor", "--json"])
    finally:
        store.close()
    checks = {c["name"]: c for c in json.loads(result.output)["checks"]}
    assert checks["clickhouse"]["level"] == "warn"
    assert "in use by another Flywheel process" in checks["clickhouse"]["detail"]
    assert result.exit_code == 0  # a running `flywheel up` holding it is not a failure


def test_completion_installs_and_completes(tmp_path: Path) -> None:
    import subprocess
    import sys

    exe = str(Path(sys.executable).parent / "flywheel")
    env = {"HOME": str(tmp_path), "SHELL": "/bin/bash", "PATH": "/usr/bin:/bin"}
    installed = subprocess.run(
        [exe, "--install-completion"], env=env, capture_output=True, text=True, timeout=60
    )
    assert installed.returncode == 0, installed.stderr
    assert (tmp_path / ".bash_completions" / "flywheel.sh").exists()
    assert "flywheel.sh" in (tmp_path / ".bashrc").read_text()
    words = {"_FLYWHEEL_COMPLETE": "complete_bash", "COMP_WORDS": "flywheel topics ", "COMP_CWORD": "2"}
    completed = subprocess.run([exe], env={**env, **words}, capture_output=True, text=True, timeout=60)
    assert completed.stdout.split() == ["create", "asyncapi", "ls"]


# ------------------------------------------------------------------- against a running stack's admin API


@pytest.fixture
def running_stack(data_dir: Path) -> Iterator[str]:
    """A stand-in for `flywheel up`'s admin server: in-process bus + event log + the ops router, in a thread."""
    import socket
    import threading
    from contextlib import asynccontextmanager

    import uvicorn
    from fastapi import FastAPI

    from flywheel.ops.api import OpsContext, create_ops_router
    from infra.bus.memory import MemoryBus

    store = ChdbStore(data_dir / "chdb")
    ctx = OpsContext(
        bus=MemoryBus(),
        reader=store,
        admin_token="s3cret-admin-token-for-tests",
        services=lambda: {"trainer": {"up": True}},
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI):  # type: ignore[no-untyped-def]
        await ctx.bus.start()
        await ctx.watch_control()
        yield
        await ctx.stop()
        await ctx.bus.stop()

    app = FastAPI(lifespan=lifespan)
    app.include_router(create_ops_router(ctx))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started:
                break
            thread.join(0.05)
        assert server.started, "the admin server did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        store.close()


def test_status_and_replay_through_the_running_stack(
    cli: CliRunner, running_stack: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYWHEEL_ADMIN_TOKEN", "s3cret-admin-token-for-tests")
    result = cli.invoke(app, ["replay", "--since", "1d", "--url", running_stack, "--no-pace", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["sent"] == 8  # stdout: the report alone; stderr: what it is doing
    assert f"replaying through {running_stack}" in result.stderr
    result = cli.invoke(app, ["status", "--url", running_stack, "--json"])
    assert result.exit_code == 0, result.output
    status = json.loads(result.output)
    assert status["runtime"] == "embedded" and status["services"]["trainer"]["up"] is True
    assert status["topics"]["flywheel.transitions"]["trainer"] == 8  # replayed, not yet consumed
    result = cli.invoke(app, ["status", "--url", running_stack])
    assert result.exit_code == 0 and "flywheel.transitions" in result.output and "trainer=8" in result.output
    result = cli.invoke(app, ["topics", "ls", "--url", running_stack, "--json"])
    assert result.exit_code == 0, result.output
    topics = {t["topic"]: t for t in json.loads(result.output)["topics"]}
    assert topics["flywheel.transitions"] == {
        "topic": "flywheel.transitions",
        "partitions": 8,
        "lag": {"trainer": 8, "recorder": 8},
    }

    monkeypatch.setenv("FLYWHEEL_ADMIN_TOKEN", "not-the-right-token-at-all")
    result = cli.invoke(app, ["status", "--url", running_stack])
    assert result.exit_code == 1
    assert "401" in _one_line_error(result)


def test_a_paced_replay_with_no_trainer_stepping_stops_with_one_line(
    cli: CliRunner, running_stack: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paced (the default), the replay sends one step's groups and waits for the trainer's step; this
    stack has no trainer, so it gives up after --step-timeout and says how far it got."""
    monkeypatch.setenv("FLYWHEEL_ADMIN_TOKEN", "s3cret-admin-token-for-tests")
    args = ["replay", "--since", "1d", "--url", running_stack, "--step-groups", "1", "--step-timeout", "1"]
    result = cli.invoke(app, args)
    assert result.exit_code == 1
    *progress, error = [line for line in result.stderr.splitlines() if line.strip()]
    assert progress and all(line.startswith("replay ") for line in progress), result.stderr  # while it ran
    assert error.startswith("error: ") and not result.stdout.strip()
    assert "replay stalled after" in error and "no trainer step within 1 s after sending step 1 of" in error
    result = cli.invoke(app, [*args, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["paced"] is True and plan["steps"] >= 1 and plan["sent"] == 0
    result = cli.invoke(app, ["replay", "--step-groups", "0", "--url", running_stack])
    assert result.exit_code == 2 and "at least 1" in result.output


def test_trainer_pause_and_resume_through_the_running_stack(
    cli: CliRunner, running_stack: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stack publishes the control events on its in-process bus; its status reads them back."""
    import httpx

    monkeypatch.setenv("FLYWHEEL_ADMIN_TOKEN", "s3cret-admin-token-for-tests")

    def pause_requested() -> object:
        result = cli.invoke(app, ["status", "--url", running_stack, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)["control"]["trainer_pause_requested"]

    result = cli.invoke(app, ["trainer", "pause", "--reason", "maintenance", "--url", running_stack])
    assert result.exit_code == 0 and f"trainer pause requested ({running_stack})" in result.output
    assert pause_requested() == "maintenance"
    result = cli.invoke(app, ["trainer", "resume", "--url", running_stack, "--json"])
    assert result.exit_code == 0, result.output
    resumed = json.loads(result.stdout)
    assert resumed["requested"] == "resume" and resumed["via"] == running_stack
    assert resumed["event"]["type"] == "trainer_resume_requested"
    assert pause_requested() is None

    headers = {"Authorization": "Bearer s3cret-admin-token-for-tests"}
    response = httpx.post(f"{running_stack}/admin/ops/trainer/stop", headers=headers, timeout=30)
    assert response.status_code == 404 and "pause, resume" in response.json()["error"]["message"]
    response = httpx.post(
        f"{running_stack}/admin/ops/trainer/pause", json={"reason": 7}, headers=headers, timeout=30
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_request"
    assert pause_requested() is None  # a refused request published nothing
    monkeypatch.setenv("FLYWHEEL_ADMIN_TOKEN", "not-the-right-token-at-all")
    result = cli.invoke(app, ["trainer", "pause", "--url", running_stack])
    assert result.exit_code == 1 and "401" in _one_line_error(result)


def test_replay_api_rejects_a_bad_filter(running_stack: str) -> None:
    import httpx

    headers = {"Authorization": "Bearer s3cret-admin-token-for-tests"}
    bad = {"filter": {"since": "2026-12-01T00:00:00Z", "until": "2026-11-01T00:00:00Z"}}
    response = httpx.post(f"{running_stack}/admin/ops/replay", json=bad, headers=headers, timeout=30)
    assert response.status_code == 400
    assert "since must be before until" in response.json()["error"]["message"]
    response = httpx.post(f"{running_stack}/admin/ops/replay", json={"rate": -1}, headers=headers, timeout=30)
    assert response.status_code == 400
    response = httpx.post(f"{running_stack}/admin/ops/replay", json={}, timeout=30)
    assert response.status_code == 401

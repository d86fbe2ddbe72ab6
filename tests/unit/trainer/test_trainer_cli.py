"""``flywheel trainer pause|resume|status`` and ``flywheel weights ls`` on a trainer directory (pause and
resume through a running stack: tests/integration/ops/test_ops_cli.py; on Kafka: tests/integration/ops/test_ops_kafka.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flywheel.cli.main import app
from trainer.checkpoints import CheckpointMeta, CheckpointStore

runner = CliRunner()


@pytest.mark.timeout(30)
def test_pause_resume_status_and_weights_ls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_BUS", "memory")
    monkeypatch.delenv("FLYWHEEL_ADMIN_URL", raising=False)
    d = str(tmp_path)
    assert runner.invoke(app, ["trainer", "status", "--dir", d]).exit_code == 1
    # the in-process bus is inside `flywheel up`: without its URL there is nowhere to publish
    for args in (["pause", "--reason", "maintenance"], ["resume"]):
        r = runner.invoke(app, ["trainer", *args])
        assert r.exit_code == 1 and r.output.count("\n") == 1 and "--url" in r.output, r.output
    assert runner.invoke(app, ["trainer", "pause", "--reason", " "]).exit_code == 2
    (tmp_path / "status.json").write_text(
        json.dumps(
            {
                "step": 4,
                "version": 4,
                "serving_version": 4,
                "mode": "async",
                "paused": True,
                "pause_reason": "maintenance",
                "metrics": {"reward": 0.5},
                "samples": {"live": 3, "production": 2, "replay": 0},
            }
        )
    )
    r = runner.invoke(app, ["trainer", "status", "--dir", d, "--json"])
    assert r.exit_code == 0, r.output
    status = json.loads(r.output)
    assert status["step"] == 4 and status["paused"] is True and status["pause_reason"] == "maintenance"
    r = runner.invoke(app, ["trainer", "status", "--dir", d])
    assert "step 4" in r.output and "reward" in r.output and "production 2" in r.output
    assert "paused True (maintenance)" in r.output

    store = CheckpointStore(tmp_path)
    assert "no checkpoints" in runner.invoke(app, ["weights", "ls", "--dir", d]).output
    for v in (1, 2):
        store.save(CheckpointMeta(version=v, step=v, metrics={"reward": v / 10}), lambda p: (p / "w").touch())
    rows = json.loads(runner.invoke(app, ["weights", "ls", "--dir", d, "--json"]).output)
    assert [(r["version"], r["latest"]) for r in rows] == [(1, False), (2, True)]
    assert "* v2" in runner.invoke(app, ["weights", "ls", "--dir", d]).output


@pytest.mark.timeout(30)
def test_run_refuses_a_missing_model(tmp_path: Path) -> None:
    r = runner.invoke(app, ["trainer", "run", "--model", str(tmp_path / "nope"), "--dir", str(tmp_path)])
    assert r.exit_code == 2
    assert "Hugging Face model directory" in r.output


@pytest.mark.timeout(30)
def test_run_refuses_an_unknown_algorithm_or_objective(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    for flag, value, what in (
        ("--algorithm", "dqn", "--algorithm must be"),
        ("--objective", "x", "--objective"),
    ):
        r = runner.invoke(
            app, ["trainer", "run", "--model", str(tmp_path), "--dir", str(tmp_path), flag, value]
        )
        assert r.exit_code == 2 and what in r.output, r.output

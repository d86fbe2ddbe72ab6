"""``flywheel demo --tiny``: the demo's whole path, driven through the CLI as a user runs it.

A toy model (one layer, a handful of SFT steps) is not expected to learn anything; the test checks that
data moved end to end: held-out episodes ran through worker → agent → gateway → engine → reward, the
trainer received scored training groups over the bus, the recorder wrote events to chdb, and the
report and the plot were written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.demo_cli import run_demo


@pytest.mark.timeout(420)
def test_demo_tiny_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    # an empty cache: every warm-start stage is built as on a fresh machine, none reused
    proc = run_demo(
        *("--tiny", "--baseline", "--out", str(out), "--threads", "1", "--cache", str(tmp_path / "cache")),
        timeout_s=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    for key in ("before", "after", "sft_only_baseline"):
        assert set(report[key]) >= {"success", "transitions_per_episode"}
        assert report[key]["episodes"] == 4, report[key]  # every held-out episode was scored
        assert 0.0 <= report[key]["success"] <= 1.0
        assert report[key]["transitions_per_episode"] >= 1.0  # the agent called the model
    assert report["seed"] == 0
    assert report["wall_seconds"] > 0
    assert report["rl_groups_received"] >= 1  # scored training groups reached the trainer
    assert report["recorded_events"] > 0  # the recorder wrote the event log
    gate = report["warm_start_gate"]  # the toy model fails the gate: topped up, re-initialised, topped up
    assert gate["passed"] is False, gate
    assert [(h["attempt"], h["top_up"]) for h in gate["history"]] == [(0, 0), (0, 1), (1, 0), (1, 1)], gate
    assert len({h["model_dir"] for h in gate["history"]}) == 4, gate
    assert report["warm_start_dir"] in {h["model_dir"] for h in gate["history"]}
    assert report["sft_only_baseline"]["weight_versions"] != report["before"]["weight_versions"]
    png = (out / "training.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "held-out success" in proc.stdout

"""``flywheel demo --agent sql --tiny``: the SQL demo's whole path, driven through the CLI.

The LangGraph SQL agent (``examples/sql_agent``, run in-process as a callable) on a toy model: generated
databases, SFT on the sloppy teacher, held-out evaluation on unseen databases, RL through worker → agent
→ gateway → engine → reward → trainer, the SFT-only baseline. Nothing is expected to be learned; the
test checks that data moved end to end and that only the writer's and rewriter's calls were trained
(the checker's are recorded as context).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow]
pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")


@pytest.mark.timeout(240)
def test_demo_sql_tiny_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    env = {**os.environ, "FLYWHEEL_ENV": "development", "PYTHONWARNINGS": "error"}
    env.pop("FLYWHEEL_BUS", None)  # the demo is the embedded stack, whatever the shell says
    proc = subprocess.run(
        [
            *(sys.executable, "-W", "error", "-m", "infra.application.cli.main", "demo", "--agent", "sql"),
            *("--tiny", "--out", str(out), "--threads", "1", "--cache", str(tmp_path / "cache")),
            *("--rl-seconds", "40", "--max-steps", "1"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["agent"] == "sql"
    for key in ("before", "after", "sft_only_baseline"):
        result = report[key]
        assert result["episodes"] == 4 and result["errors"] == 0, result  # every held-out episode scored
        assert 2.0 <= result["transitions_per_episode"] <= 6.0  # writer + checker, at most 3 queries
        by_model = result["calls_by_model"]
        assert set(by_model) <= {"writer", "rewriter", "checker"} and "writer" in by_model, by_model
        assert by_model["writer"]["trained"] == 1.0 and by_model["writer"]["context"] == 0.0
        assert by_model["checker"]["trained"] == 0.0 and by_model["checker"]["context"] >= 1.0
        assert by_model.get("rewriter", {}).get("context", 0.0) == 0.0
    assert report["rl_groups_received"] >= 1  # scored training groups reached the trainer
    assert report["recorded_events"] > 0
    assert report["sft_only_baseline"]["weight_versions"] != report["before"]["weight_versions"]
    assert (out / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "calls per episode by model" in proc.stdout

"""``flywheel demo --agent sql --tiny``: the SQL demo's whole path, driven through the CLI.

The LangGraph SQL agent (``examples/demo_agents/sql_agent``, run in-process as a callable) on a toy model: generated
databases, SFT on the sloppy teacher, held-out evaluation on unseen databases, RL through worker → agent
→ gateway → engine → reward → trainer, the SFT-only baseline. Nothing is expected to be learned; the
test checks that data moved end to end and that only the writer's and rewriter's calls were trained
(the checker's are recorded as context).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from examples.demo.sql_demo import RL_DISCOUNT
from infra.eventlog.store import ChdbStore
from tests.e2e.demo_cli import run_demo

pytestmark = [pytest.mark.slow]
pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")


@pytest.mark.timeout(240)
def test_demo_sql_tiny_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = run_demo(
        *("--agent", "sql", "--tiny", "--baseline", "--out", str(out), "--threads", "1"),
        *("--cache", str(tmp_path / "cache")),
        *("--rl-seconds", "40", "--max-steps", "1", "--curriculum", "0.5"),
        timeout_s=220,
        warnings_are_errors=True,
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
    # the trainer's requests went through the signal curriculum, which heard every finished group
    curriculum = report["curriculum"]
    assert curriculum["revisit"] == 0.5 and curriculum["fresh"] + curriculum["revisits"] >= 2, curriculum
    assert curriculum["groups_with_signal"] + curriculum["groups_without_signal"] >= 1, curriculum
    # The checker is a fixed model: every checker call, and no other, went to the frozen engine.
    fixed = report["fixed_models"]["checker"]
    store = ChdbStore(out / "data" / "chdb")
    try:
        rows = store.query(
            f"SELECT model, startsWith(JSONExtractString(payload, 'upstream_url'), '{fixed}') AS fixed,"
            " count() FROM flywheel.events WHERE type = 'llm_call_recorded' GROUP BY model, fixed"
        ).rows
        # RL's episodes carry the per-call discount (RL_DISCOUNT); the held-out evaluations' do not
        discounts = store.query(
            "SELECT JSONExtractRaw(payload, 'task', 'scorer', 'options', 'discount') AS d, count()"
            " FROM flywheel.events WHERE type = 'episode_started' GROUP BY d"
        ).rows
    finally:
        store.close()
    seen = {str(d) for d, _ in discounts}
    assert seen == {str(RL_DISCOUNT), ""}, discounts
    answered = {(str(model), bool(on_fixed)) for model, on_fixed, _ in rows}
    assert ("checker", True) in answered and ("writer", False) in answered, rows
    assert all(on_fixed == (model == "checker") for model, on_fixed in answered), rows
    assert report["recorded_events"] > 0
    assert report["sft_only_baseline"]["weight_versions"] != report["before"]["weight_versions"]
    assert (out / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "calls per episode by model" in proc.stdout

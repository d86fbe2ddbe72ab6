"""``flywheel optimize`` end to end, driven through the CLI as a user runs it.

The reflection model is the one stand-in: ``ScriptedReflectionLM`` (tests/fakes/scripted_reflection.py)
answers GEPA's reflection prompts with texts from a fixed list, over real HTTP. Everything else is real:
the calculator agent (plain ``openai`` code) runs in the rollout worker for every evaluation, its calls
go through the gateway, which substitutes each candidate for the agent's system prompt, to the embedded
engine serving a toy model; the reward service scores every episode with the task's ``exact`` scorer,
whose reasons reach the reflection prompt; GEPA keeps the candidates with their lineage and frontier.
The toy model learns nothing, so this checks that data moved, not that the prompt got better (the
acceptance run in the README measures that on the demo's warm-started model).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.scripted_reflection import ScriptedReflectionLM

REPO = Path(__file__).resolve().parents[2]
POOR = "You are a helpful assistant."
SCRIPTED = ["Use CALC: <expr> then ANSWER: <n>.", "Think step by step, then reply with the number."]


@pytest.fixture(scope="module")
def toy_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from examples.demo.warmstart import WarmStartConfig, warm_start

    cfg = WarmStartConfig(hidden=64, layers=1, vocab_size=320, demos=40, sft_steps=4, sft_batch=4)
    model_dir, _ = warm_start(cfg, tmp_path_factory.mktemp("cache"), None, None)
    return model_dir


@pytest.mark.timeout(480)
@pytest.mark.slow
def test_optimize_runs_gepa_over_real_rollouts_and_activates_the_winner(
    toy_model: Path, tmp_path: Path
) -> None:
    from examples.demo_agents.calc_agent import tasks as calc
    from examples.demo_agents.calc_agent.agent import SYSTEM
    from flywheel.export import export
    from flywheel.optimize.rollouts import prompt_version_of
    from flywheel.optimize.tasks import write_tasks
    from infra.eventlog.store import open_store

    write_tasks(tmp_path / "tasks.jsonl", calc.sample("rl", 3, 8))
    write_tasks(tmp_path / "heldout.jsonl", calc.sample("heldout", 3, 3))
    (tmp_path / "seed.txt").write_text(POOR)
    out = tmp_path / "opt"
    env = {**os.environ, "FLYWHEEL_ENV": "development"}
    env.pop("FLYWHEEL_BUS", None)
    with ScriptedReflectionLM(SCRIPTED) as lm:
        proc = subprocess.run(
            [
                *(
                    sys.executable,
                    "-m",
                    "flywheel.cli.main",
                    "optimize",
                    "--model-dir",
                    str(toy_model),
                ),
                *("--tasks", str(tmp_path / "tasks.jsonl"), "--test-tasks", str(tmp_path / "heldout.jsonl")),
                *("--train", "4", "--val", "3", "--minibatch", "2", "--max-metric-calls", "12"),
                *("--reflection-url", lm.url, "--reflection-model", "scripted-reflection"),
                *("--seed-prompt", str(tmp_path / "seed.txt"), "--activate", "--accept", "equal"),
                *("--out", str(out)),
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=420,  # ~75 s on a quiet 2-core machine; minutes when it is shared
        )
        prompts = list(lm.prompts)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["component"] == {"name": "system_prompt", "match": "system", "original": SYSTEM}
    cands = report["candidates"]
    assert cands[0]["text"] == POOR and cands[0]["parents"] == []
    assert len(cands) >= 2 and all(c["text"] in SCRIPTED for c in cands[1:])  # proposals came from reflection
    assert all(c["parents"] and c["parents"][0] < c["index"] for c in cands[1:])  # lineage
    assert all(0.0 <= c["val_score"] <= 1.0 for c in cands)
    assert set(report["pareto_frontier"]["candidates"]) <= {c["index"] for c in cands}
    assert report["pareto_frontier"]["candidates"]
    assert report["episodes"]["gepa"] <= 12 + 7  # the budget (GEPA finishes the evaluation in progress)
    assert report["reflection"]["calls"] == len(prompts) >= 1
    # the reflection model read the rollouts: the scorer's reasons and the agent's own messages
    assert any("expected '" in p for p in prompts), prompts[0][:2000]
    assert any(POOR in p for p in prompts)
    held = report["held_out"]
    assert held["seed"]["episodes"] == held["best"]["episodes"] == 3
    assert held["seed"]["prompt_versions"] == [report["seed"]["prompt_version"]]
    best = report["best"]
    assert best["prompt_version"] == prompt_version_of({"system_prompt": best["text"]})
    assert report["activated"] == best["prompt_version"]
    assert (out / "best_prompt.txt").read_text() == best["text"]
    assert (out / "val_scores.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "held-out success" in proc.stdout

    # prompt_version in the event log (typed column) and in the exported data
    store = open_store(chdb_path=out / "data" / "chdb")
    try:
        db = store.database
        rows = store.query(
            f"SELECT prompt_version, count() FROM {db}.events FINAL WHERE type = 'llm_call_recorded' "
            "GROUP BY prompt_version"
        ).rows
        served = {str(v): int(n) for v, n in rows}
        versions = {c["prompt_version"] for c in cands}
        assert versions <= set(served), served  # every candidate served real calls
        assert served.get("", 0) >= 1  # the probe ran under the agent's own prompt
        acts = store.query(
            f"SELECT prompt_version FROM {db}.events WHERE type = 'prompt_version_activated'"
        ).rows
        assert [best["prompt_version"]] in acts
        sft = export(store, tmp_path / "sft.jsonl", kind="sft", fmt="jsonl")
        rl = export(store, tmp_path / "rl.jsonl", kind="rl", fmt="jsonl")
    finally:
        store.close()
    assert sft.rows > 0 and rl.rows > 0
    sft_rows = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    poor = [r for r in sft_rows if r["prompt_version"] == report["seed"]["prompt_version"]]
    assert poor and all(r["messages"][0]["content"] == POOR for r in poor)  # what the model saw
    rl_rows = [json.loads(line) for line in (tmp_path / "rl.jsonl").read_text().splitlines()]
    assert versions <= {r["prompt_version"] for r in rl_rows}


@pytest.mark.timeout(480)
@pytest.mark.slow
def test_demo_optimizes_the_prompt_then_trains_under_the_winner(tmp_path: Path) -> None:
    """``flywheel demo --tiny --optimize-prompt``: GEPA first (real rollouts, scripted reflection), then
    the after-evaluation and every RL call are served under the winning prompt version."""
    from infra.eventlog.store import open_store

    out = tmp_path / "demo"
    env = {**os.environ, "FLYWHEEL_ENV": "development"}
    env.pop("FLYWHEEL_BUS", None)
    with ScriptedReflectionLM(SCRIPTED) as lm:
        proc = subprocess.run(
            [
                *(sys.executable, "-m", "flywheel.cli.main", "demo", "--tiny"),
                *(
                    "--optimize-prompt",
                    "--reflection-url",
                    lm.url,
                    "--reflection-model",
                    "scripted-reflection",
                ),
                *("--threads", "1", "--cache", str(tmp_path / "cache"), "--out", str(out)),
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=450,
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    stage = report["prompt_optimization"]
    winner = stage["best_prompt"]["prompt_version"]
    assert stage["candidates"] >= 1 and stage["seed_prompt"]["prompt_version"] != ""
    assert report["rl_groups_received"] >= 1  # RL ran after the stage
    store = open_store(chdb_path=out / "data" / "chdb")
    try:
        db = store.database
        activated = store.query(
            f"SELECT max(emitted_at) FROM {db}.events WHERE type = 'prompt_version_activated' "
            f"AND prompt_version = '{winner}'"
        ).rows
        assert activated and activated[0][0] is not None
        rows = store.query(
            f"SELECT prompt_version, count() FROM {db}.events FINAL WHERE type = 'llm_call_recorded' "
            f"AND emitted_at > (SELECT max(emitted_at) FROM {db}.events "
            "WHERE type = 'prompt_version_activated') GROUP BY prompt_version"
        ).rows
    finally:
        store.close()
    served = {str(v): int(n) for v, n in rows}
    assert served and set(served) == {winner}, served  # nothing after the stage ran under another prompt

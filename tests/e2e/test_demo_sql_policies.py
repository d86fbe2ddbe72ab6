"""``flywheel demo --agent sql --tiny --policies writer,rewriter|shared``: adapters, through the CLI.

The SQL demo's whole path on the toy warm start (``SQL_TINY``: it has learned its train databases'
questions well enough to solve some, so the rewards of RL's episodes vary), with a LoRA adapter for the
writer and one for the rewriter over the frozen warm start. Through the real services (worker → LangGraph
agent → gateway → ``flywheel engine`` child → reward service → trainer, chdb event log): both adapters are
trained from the same episodes (each has versions above 0 and its bytes and seconds per update in
report.json), every writer and rewriter call is served by (and recorded with) its own role's adapter,
and the checker's calls by the frozen warm start, with no adapter. The held-out evaluation after RL is
served the same way, by the adapters' trained versions: the accuracy it reports is theirs. With
``shared`` one adapter serves and trains on both roles' calls. Whether the
adapters learn more than the full fine-tune is the three-seed comparison's question (docs/policies.md),
not this test's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.eventlog.store import ChdbStore
from tests.e2e.demo_cli import run_demo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

ROLES = ("writer", "rewriter")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("demo-cache")  # the toy SQL warm start, built once for the module


def _demo(out: Path, cache: Path, policies: str, max_steps: int) -> tuple[str, dict[str, Any]]:
    """``flywheel demo --agent sql --tiny --policies POLICIES``: its stdout and report.json."""
    proc = run_demo(
        *("--agent", "sql", "--tiny", "--policies", policies, "--out", str(out)),
        *("--threads", "1", "--cache", str(cache)),
        *("--rl-seconds", "120", "--max-steps", str(max_steps)),
        timeout_s=400,
        warnings_are_errors=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads((out / "report.json").read_text())


def test_sql_demo_trains_an_adapter_per_role_and_serves_each_roles_calls_with_it(
    tmp_path: Path, cache: Path
) -> None:
    out = tmp_path / "demo"
    # steps that trained at least one adapter (~0.5 s each). The writer has signal in most batches; the
    # rewriter in a batch with a successful rewrite (about one group in nine on the toy): in 20 steps
    # (~45 batches, ~90 groups) one comes with near certainty
    stdout, report = _demo(out, cache, "writer,rewriter", max_steps=20)
    assert report["agent"] == "sql" and report["policies_config"] == "per-role"
    assert report["policies"] == {r: {"models": [r]} for r in ROLES}
    assert report["lora"]["learning_rate"] == 2e-3  # the adapters' default rate
    updates = report["updates_by_policy"]
    assert set(updates) == set(ROLES), updates
    for role in ROLES:  # each role's adapter trained from the same stream of episodes
        u = updates[role]
        assert u["updates"] >= 1 and u["versions"] >= 1, updates
        assert u["adapter_bytes"] > 0 and u["seconds_per_update"]["mean"] > 0, updates
    # during RL, as the bus carried them: each role's calls served by its own adapter, the checker's by none
    by_adapter = report["calls_by_adapter"]
    assert by_adapter["checker"].keys() == {"(base)"}, by_adapter
    for role in ROLES:
        assert by_adapter[role].keys() == {role}, by_adapter
    # the held-out evaluations went through the gateway: before RL the adapters' version 0, after RL the
    # trained versions answered the writer's calls, and the checker's stayed on the base
    before, after = report["before"], report["after"]
    for result in (before, after):
        assert result["episodes"] == 4 and result["errors"] == 0, result
        served_by = result["adapters_by_model"]
        assert served_by["checker"] == {"(base)": []}, result
        assert served_by["writer"].keys() == {"writer"}, result
        assert served_by.get("rewriter", {"rewriter": []}).keys() == {"rewriter"}, result
    assert before["adapters_by_model"]["writer"]["writer"] == [0]
    assert min(after["adapters_by_model"]["writer"]["writer"]) >= 1, after
    assert min(after["adapters_by_model"].get("rewriter", {}).get("rewriter", [1])) >= 1, after
    assert "calls_per_episode" in after and "delta" in report
    assert "writer" in stdout and "s/update" in stdout

    # The event log agrees: every call recorded with its role's adapter (the checker's with none, answered
    # by the frozen engine), and both adapters' calls carry trained versions.
    fixed = report["fixed_models"]["checker"]
    store = ChdbStore(out / "data" / "chdb")
    try:
        rows = store.query(
            "SELECT model, adapter, max(adapter_version),"
            f" min(startsWith(JSONExtractString(payload, 'upstream_url'), '{fixed}')), count()"
            " FROM flywheel.events WHERE type = 'llm_call_recorded' GROUP BY model, adapter"
        ).rows
    finally:
        store.close()
    served = {(str(r[0]), str(r[1])): (int(str(r[2])), bool(r[3])) for r in rows}
    assert set(served) == {("checker", ""), ("writer", "writer"), ("rewriter", "rewriter")}, served
    assert served[("checker", "")][1], served  # on the fixed engine
    for role in ROLES:
        version, on_fixed = served[(role, role)]
        assert version >= 1 and not on_fixed, served


def test_sql_demo_trains_one_shared_adapter_on_both_roles_calls(tmp_path: Path, cache: Path) -> None:
    """``--policies shared``: one adapter selected by both trained roles' model names, trained on the
    writer's and the rewriter's calls together and serving both; the checker stays on the frozen base."""
    out = tmp_path / "demo"
    _, report = _demo(out, cache, "shared", max_steps=10)
    assert report["policies_config"] == "shared"
    assert report["policies"] == {"shared": {"models": list(ROLES)}}
    updates = report["updates_by_policy"]
    assert set(updates) == {"shared"}, updates
    assert updates["shared"]["updates"] >= 1 and updates["shared"]["adapter_bytes"] > 0, updates
    by_adapter = report["calls_by_adapter"]
    assert by_adapter["checker"].keys() == {"(base)"}, by_adapter
    assert by_adapter["writer"].keys() == {"shared"}, by_adapter
    assert by_adapter.get("rewriter", {"shared": 0}).keys() == {"shared"}, by_adapter
    after = report["after"]["adapters_by_model"]
    assert min(after["writer"]["shared"]) >= 1, after  # the trained versions answered after RL

    store = ChdbStore(out / "data" / "chdb")
    try:
        rows = store.query(
            "SELECT model, adapter, max(adapter_version) FROM flywheel.events"
            " WHERE type = 'llm_call_recorded' GROUP BY model, adapter"
        ).rows
    finally:
        store.close()
    served = {(str(r[0]), str(r[1])): int(str(r[2])) for r in rows}
    assert ("checker", "") in served and ("writer", "shared") in served, served
    assert {adapter for model, adapter in served if model in ROLES} == {"shared"}, served
    assert served[("writer", "shared")] >= 1, served

"""``flywheel demo --source production --tenants per-tenant --gates``, tiny, driven through the CLI.

With ``--gates`` the demo runs the stack with ``releases=gated``: each tenant's production calls are
served by its policy's served version, the trainer proposes a candidate every ``--release-every``
adapter versions, and the gate keeper evaluates each on validation tasks the report never scores
(examples/demo/gating.py). Here (toy model, ``--users-rule form``, a candidate every version): every
policy's candidates are evaluated, the report carries every ``VersionEvaluated`` (version, passed, rule,
figures), and no production call of a tenant was served by a version its gates refused, nor by any
version that was not served (0 or a promoted one); the event log agrees. That the served accuracy
holds while the latest collapses is the full run's figure (docs/demos.md), not this test's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from examples.demo.tenants import heldout_tasks
from infra.eventlog.store import ChdbStore
from tests.e2e.demo_cli import run_demo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_gated_tenants_report_evaluations_and_serve_no_refused_version(tmp_path: Path) -> None:
    out = tmp_path / "gated"
    proc = run_demo(
        "--tiny",
        "--source",
        "production",
        "--tenants",
        "per-tenant",
        "--users-rule",
        "form",
        "--gates",
        "--release-every",
        "1",
        "--rl-seconds",
        "60",
        "--max-steps",
        "4",
        "--out",
        str(out),
        "--threads",
        "1",
        "--cache",
        str(tmp_path / "cache"),
        timeout_s=560,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    releases = report["releases"]
    assert set(releases) == {"formal", "terse"}
    served_ok: dict[str, set[int]] = {}
    refused: dict[str, set[int]] = {}
    for name, rel in releases.items():
        assert rel["proposed"], rel  # each adapter's trained versions became candidates
        assert rel["evaluations"], rel  # and the gates judged them
        for e in rel["evaluations"]:
            assert isinstance(e["passed"], bool) and e["rule"], e
            assert e["figures"]["episodes"] > 0 and "score" in e["served_figures"], e
        assert rel["newest_candidate_evaluated"] is True
        refused[name] = set(rel["refused"])
        served_ok[name] = {0, *rel["promoted"]}
        assert str(rel["served"]) in rel["heldout_by_version"]
    # the report's production calls, per tenant, by the version that served them
    for tenant, versions in report["production_versions"].items():
        used = {int(v) for v in versions}
        assert used <= served_ok[tenant] and not used & refused[tenant], (tenant, versions, releases[tenant])
    for t in report["tenants"].values():
        assert t["heldout"]["served"]["version"] == releases[t["policy"]]["served"]
        # a promoted adapter version is loaded into the engine child with its own token: no user error
        assert t["user_errors"] == 0, t

    # the gates' task file holds none of the report's held-out tasks
    validation = [
        json.loads(line) for line in (out / "seed-0" / "gates" / "validation.jsonl").read_text().splitlines()
    ]
    assert validation and not {t["task_id"] for t in validation} & {t["task_id"] for t in heldout_tasks(0, 4)}

    # the event log agrees: the gates' decisions were recorded, and no tenant's call ran on a refused version
    store = ChdbStore(out / "data" / "chdb")
    try:
        evaluated = store.query("SELECT count() FROM flywheel.events WHERE type = 'version_evaluated'").rows
        rows = store.query(
            "SELECT tenant, adapter_version, count() FROM flywheel.events "
            "WHERE type = 'llm_call_recorded' AND tenant != '' GROUP BY tenant, adapter_version"
        ).rows
    finally:
        store.close()
    assert int(str(evaluated[0][0])) == sum(len(r["evaluations"]) for r in releases.values())
    assert rows
    for tenant, version, _ in rows:
        assert int(str(version)) in served_ok[str(tenant)], rows

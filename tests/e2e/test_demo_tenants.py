"""``flywheel demo --source production --tenants per-tenant``, tiny, driven through the CLI.

Two tenants' simulated users (``formal`` and ``terse``, each with its own key) use the deployed calculator
agent through the gateway's production endpoint at once; the policy map selects a LoRA adapter by the
tenant of the call's key. Through the real services (gateway, in-process bus, reward service, trainer,
``flywheel engine`` child, chdb event log): both adapters get trained versions, and every call of a
tenant is served by (and recorded with) that tenant's adapter, never the other's or the base. The users
rate a right answer in their tenant's form up and anything else down
(``tests/unit/demo/test_tenant_users.py``); the toy model never answers, so its users mis-rate a quarter
of the sessions (as in ``--source production --tiny``): the rewards then vary and each adapter has
sessions to train on. That the tenants' rates
separate is the full demo's figure (docs/policies.md), not this test's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.eventlog.store import ChdbStore
from tests.e2e.demo_cli import run_demo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_two_tenants_each_train_and_are_served_by_their_own_adapter(tmp_path: Path) -> None:
    out = tmp_path / "tenants"
    proc = run_demo(
        "--tiny",
        "--source",
        "production",
        "--tenants",
        "per-tenant",
        "--rl-seconds",
        "60",
        "--max-steps",
        "3",
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
    assert (out / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["tenants_config"] == "per-tenant"
    tenants = report["tenants"]
    assert set(tenants) == {"formal", "terse"}
    for name, t in tenants.items():
        assert t["policy"] == name
        assert t["sessions"] > 0 and t["user_errors"] == 0, t["user_error_examples"]
        # the tenant's calls, as the gateway recorded them on the bus: its own adapter's only
        assert set(t["calls_by_adapter"]) == {name}, t["calls_by_adapter"]
        assert t["thumbs_up"]["series"]
        assert set(t["heldout"]["after"]["style_share"]) == {"labelled", "bare", "none"}
    adapters = report["adapters"]
    for name in ("formal", "terse"):
        assert adapters[name]["versions"] >= 1, adapters  # each adapter trained from its tenant's sessions
        assert adapters[name]["adapter_bytes"] > 0
        assert adapters[name]["seconds_per_update"]["mean"] > 0
    assert report["trainer_samples"]["production"] > 0

    # The event log agrees: every call of a tenant's key was served by that tenant's adapter, and the
    # calls after its first update carry a trained version of it.
    store = ChdbStore(out / "data" / "chdb")
    try:
        rows = store.query(
            "SELECT tenant, adapter, max(adapter_version), count() FROM flywheel.events "
            "WHERE type = 'llm_call_recorded' GROUP BY tenant, adapter"
        ).rows
    finally:
        store.close()
    served = {(str(r[0]), str(r[1])): (int(str(r[2])), int(str(r[3]))) for r in rows}
    assert set(served) == {("formal", "formal"), ("terse", "terse")}, served
    assert all(version >= 1 for version, _ in served.values()), served

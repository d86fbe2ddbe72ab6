"""The demo's gates (examples/demo/gating.py): its validation tasks, its gates.json, which versions it
scores, and the users' rules (examples/demo/tenants.py ``rates_up``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.demo import gating
from examples.demo.tenants import Reply, heldout_tasks, rates_up
from flywheel.gates import GateConfig

pytestmark = pytest.mark.timeout(30)


def test_validation_tasks_are_held_out_split_and_not_the_reported_ones() -> None:
    reported = heldout_tasks(0, 256)
    validation = gating.validation_tasks(0, 48, {t["task_id"] for t in reported})
    assert len(validation) == 48 == len({t["task_id"] for t in validation})
    assert not {t["task_id"] for t in validation} & {t["task_id"] for t in reported}


def test_gates_file_loads_with_the_regression_and_minimum_rules(tmp_path: Path) -> None:
    path = gating.write_gates(tmp_path / "gates", heldout_tasks(1, 3), margin=0.05)
    config = GateConfig.load(path)
    assert len(config.suite()) == 3 and config.agent == gating.AGENT and config.promote == "auto"
    served = {"score": 0.30}
    failed = [r.check({"score": 0.24}, served) for r in config.rules]
    assert failed[0] is not None and "regresses" in failed[0] and failed[1] is None
    assert all(r.check({"score": 0.26}, served) is None for r in config.rules)
    assert any(r.check({"score": 0.0}, {"score": 0.0}) for r in config.rules)  # the minimum


def test_pick_versions_keeps_every_served_version_and_the_last_candidate() -> None:
    summary = {
        "served_timeline": [{"version": 0}, {"version": 30}],
        "proposed": list(range(10, 160, 10)),
    }
    picked = gating.pick_versions(summary, most=4)
    assert {0, 30, 150} <= set(picked) and len(picked) <= 4 + 3


def test_users_who_judge_the_form_alone_rate_up_a_wrong_bare_number() -> None:
    wrong_bare = Reply("12", "bare", 1)
    assert rates_up("bare", wrong_bare, "1786", "form")
    assert not rates_up("bare", wrong_bare, "1786")
    assert rates_up("bare", Reply("1786", "bare", 2), "1786")
    assert not rates_up("labelled", Reply("1786", "bare", 2), "1786", "form")

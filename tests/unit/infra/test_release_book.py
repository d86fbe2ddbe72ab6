"""The release book (infra/releases.py): what a promote, a rollback and a pin may do, folded from events.

A request is checked before it becomes an event (an unknown version, a failed one, nothing to roll back
to, a pinned policy: refused in one line, the book unchanged); events fold idempotently, and a book
read back from its file serves what it served and does not fold the same history twice. The gate rules
(flywheel/gates.py) are checked here too: their metrics, thresholds and regression margins.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.canary import msprt
from flywheel.gates import GateConfig, GateError, GateRule, figures_of
from infra.releases import (
    InvalidReleaseRequest,
    ReleaseBook,
    ReleaseError,
    UnknownVersionError,
    parse_versioned,
    versioned_name,
)
from schemas import EpisodeScored, EpisodeStatus, VersionEvaluated, VersionProposed

pytestmark = pytest.mark.timeout(30)


def _proposed(version: int, adapter: str | None = None) -> VersionProposed:
    return VersionProposed(
        version=version, adapter=adapter, checkpoint_path=f"/ckpt/v{version}", step=version
    )


def _evaluated(version: int, passed: bool) -> VersionEvaluated:
    return VersionEvaluated(
        version=version, passed=passed, rule="all rules held" if passed else "score < min"
    )


def test_promote_rollback_pin_and_what_each_refuses(tmp_path: Path) -> None:
    book = ReleaseBook(path=tmp_path / "releases.json")
    assert book.served() == 0
    for event in (_proposed(2), _evaluated(2, True), _proposed(4), _evaluated(4, False), _proposed(6)):
        assert book.apply(event)
    with pytest.raises(UnknownVersionError, match="version 5 is unknown"):
        book.plan_promote(5, by="cli:a")
    with pytest.raises(ReleaseError, match="version 4 failed its gates"):
        book.plan_promote(4, by="cli:a")
    with pytest.raises(ReleaseError, match="nothing to roll back to"):
        book.plan_rollback(by="cli:a")
    with pytest.raises(ReleaseError, match="already serves"):
        book.plan_promote(0, by="cli:a")
    assert book.served() == 0  # refusals changed nothing

    promoted = book.plan_promote(2, by="gate", reason="all rules held", rule=True)
    assert (promoted.version, promoted.previous, promoted.decided_by) == (2, 0, "gate")
    assert book.apply(promoted) and not book.apply(promoted)  # folded once
    assert book.apply(book.plan_promote(6, by="cli:a"))  # an operator may promote an unevaluated one
    assert book.release().previous == [0, 2]
    rollback = book.plan_rollback(by="cli:a", reason="complaints")
    assert (rollback.version, rollback.to) == (6, 2)
    book.apply(rollback)
    assert book.served() == 2 and book.release().status(6) == "rolled_back"
    with pytest.raises(ReleaseError, match="rolled back; only an operator"):
        book.plan_promote(6, by="gate", rule=True)

    book.apply(book.plan_pin(2, by="cli:a"))
    with pytest.raises(ReleaseError, match="pinned to version 2"):
        book.plan_promote(6, by="cli:a")
    with pytest.raises(ReleaseError, match="pinned"):
        book.plan_rollback(by="cli:a")
    book.apply(book.plan_pin(None, by="cli:a"))
    with pytest.raises(ReleaseError, match="not pinned"):
        book.plan_pin(None, by="cli:a")

    # read back: same served version, same history; the same events are not folded again
    again = ReleaseBook(path=tmp_path / "releases.json")
    assert again.served() == 2 and again.release().previous == book.release().previous
    assert not again.apply(promoted) and not again.apply(rollback)
    assert again.as_json() == book.as_json()


def test_adapters_have_releases_of_their_own() -> None:
    book = ReleaseBook()
    book.apply(_proposed(3, adapter="terse"))
    book.apply(book.plan_promote(3, adapter="terse", by="cli:a"))
    assert book.served("terse") == 3 and book.served(None) == 0
    with pytest.raises(UnknownVersionError):
        book.plan_promote(3, by="cli:a")  # the base never saw version 3
    assert [p["name"] for p in book.as_json()["policies"]] == ["policy", "terse"]


def test_versioned_names() -> None:
    assert versioned_name("terse", 12) == "terse@v12"
    assert parse_versioned("terse@v12") == ("terse", 12)
    assert parse_versioned("policy") is None and parse_versioned("a@vx") is None


def test_gate_rules_thresholds_and_regression() -> None:
    served = {"score": 0.5, "calls_per_episode": 2.0}
    assert GateRule(metric="score", min=0.4).check({"score": 0.45}, served) is None
    assert GateRule(metric="score", min=0.5).check({"score": 0.45}, served) == "score 0.450 < min 0.5"
    regress = GateRule(metric="score", max_regression=0.02)
    assert regress.check({"score": 0.49}, served) is None
    assert "regresses 0.100 from the served 0.500" in (regress.check({"score": 0.4}, served) or "")
    calls = GateRule(metric="calls_per_episode", max_regression=0.5)
    assert calls.check({"calls_per_episode": 2.4}, served) is None
    assert calls.check({"calls_per_episode": 3.0}, served) is not None  # more calls is worse


def test_gate_config_errors_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "gates.json"
    path.write_text('{"tasks": "t.jsonl", "agent": "m:f", "rules": [{"metric": "accuracy", "min": 0.5}]}')
    with pytest.raises(GateError, match=r"unknown metric 'accuracy' \(known: score, success"):
        GateConfig.load(path)
    path.write_text('{"tasks": "t.jsonl", "agent": "m:f", "rules": []}')
    with pytest.raises(GateError, match="at rules"):
        GateConfig.load(path)
    with pytest.raises(GateError, match="cannot read"):
        GateConfig.load(tmp_path / "missing.json")
    path.write_text('{"tasks": "t.jsonl", "agent": "m:f", "rules": [{"metric": "score", "min": 0.5}]}')
    assert GateConfig.load(path).tasks == tmp_path / "t.jsonl"  # relative to the file


def test_figures_of_scored_episodes() -> None:
    def ep(reward: float, calls: int, status: EpisodeStatus = EpisodeStatus.ok) -> EpisodeScored:
        return EpisodeScored(episode_id="e", group_id="g", reward=reward, num_calls=calls, status=status)

    figures = figures_of([ep(1.0, 2), ep(0.0, 4), ep(0.5, 3, EpisodeStatus.error)])
    assert figures["score"] == pytest.approx(0.5) and figures["success"] == pytest.approx(1 / 3)
    assert figures["calls_per_episode"] == 3.0 and figures["error_rate"] == pytest.approx(1 / 3)
    assert figures_of([])["error_rate"] == 1.0


def test_canary_requests_and_their_end() -> None:
    book = ReleaseBook()
    for event in (_proposed(2), _evaluated(2, True), _proposed(4), _evaluated(4, False)):
        book.apply(event)
    for share in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(InvalidReleaseRequest, match=r"must be in \(0, 1\)"):
            book.plan_canary(2, share, by="cli:a")
    with pytest.raises(ReleaseError, match="failed its gates"):
        book.plan_canary(4, 0.1, by="cli:a")
    with pytest.raises(ReleaseError, match="no canary to roll back"):
        book.plan_canary_rollback(by="canary")
    book.apply(book.plan_canary(2, 0.25, by="gate"))
    assert book.release().canary_version == 2 and book.release().status(2) == "canary"
    rollback = book.plan_canary_rollback(by="canary", reason="thumbs up lower")
    assert (rollback.version, rollback.to) == (2, 0)
    book.apply(rollback)
    assert book.release().canary is None and book.served() == 0 and book.release().status(2) == "rolled_back"
    book.apply(book.plan_canary(2, 0.25, by="cli:a"))  # an operator may canary it again
    book.apply(book.plan_promote(2, by="canary", rule=False))
    assert book.served() == 2 and book.release().canary is None


def test_the_sequential_test_needs_evidence_and_points_the_right_way() -> None:
    lam, delta = msprt(5, 10, 5, 10, tau=0.2)
    assert delta == 0 and lam < 1  # no difference: evidence against one
    lam_small, _ = msprt(4, 10, 6, 10, tau=0.2)
    lam_big, delta_big = msprt(80, 200, 120, 200, tau=0.2)
    assert lam_small < 20 <= lam_big and delta_big == pytest.approx(0.2)  # same rates, more sessions
    assert msprt(60, 100, 40, 100, tau=0.2)[1] == pytest.approx(-0.2)
    assert msprt(0, 0, 3, 5, tau=0.2) == (1.0, 0.0) and msprt(10, 10, 10, 10, tau=0.2)[0] == 1.0

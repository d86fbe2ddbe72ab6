"""``flywheel versions ls|show|promote|rollback|pin`` against a real gateway with releases on.

The gateway (``tests/fakes/gateway_harness.BackgroundGateway``: the real app on uvicorn, an in-process
bus, a fake model server) learns three whole-model candidates and one adapter candidate from
``flywheel.control``, as it would from a trainer and its gates; the CLI is run as a user runs it, with
``--url`` and the admin token. Each refusal is checked to be one line, a non-zero exit, and no change:
no decision published, the book's served version as before.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flywheel.cli.main import app
from schemas import (
    CONTROL,
    VersionCanary,
    VersionEvaluated,
    VersionPinned,
    VersionPromoted,
    VersionProposed,
    VersionRolledBack,
)
from tests.fakes.gateway_harness import BackgroundGateway

pytestmark = pytest.mark.timeout(60)

TOKEN = "test-admin"
runner = CliRunner()


def _candidates() -> list[VersionProposed | VersionEvaluated]:
    """v1 passed (score 0.8), v2 failed its gates, v3 passed (score 0.9); adapter terse: v1, not evaluated."""
    proposed = [
        VersionProposed(version=v, checkpoint_path=f"/ckpt/v{v}", step=10 * v, producer="trainer")
        for v in (1, 2, 3)
    ]
    evaluated = [
        VersionEvaluated(version=1, passed=True, rule="all", figures={"score": 0.8}, producer="gate"),
        VersionEvaluated(
            version=2, passed=False, rule="score 0.2 < 0.5", figures={"score": 0.2}, producer="gate"
        ),
        VersionEvaluated(
            version=3, passed=True, rule="all", figures={"score": 0.9, "kl": 0.01}, producer="gate"
        ),
    ]
    adapter = VersionProposed(
        adapter="terse", version=1, checkpoint_path="/ckpt/terse/v1", producer="trainer"
    )
    return [*proposed, *evaluated, adapter]


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[BackgroundGateway]:
    monkeypatch.setenv("FLYWHEEL_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("USER", "alice")
    monkeypatch.delenv("FLYWHEEL_ADMIN_URL", raising=False)
    # a policy map: LoRA adapters over a frozen base, which needs no slot (whole-model versions are not served)
    with BackgroundGateway(tmp_path, releases="gated", policies="terse") as g:
        for event in _candidates():
            g.run(g.h.bus.publish(CONTROL, event))
        releases = g.h.gateway.releases
        assert releases is not None
        deadline = time.monotonic() + 10
        while not (
            releases.book.release(None).versions.get(3, None) is not None
            and releases.book.release(None).versions[3].evaluation is not None
            and 1 in releases.book.release("terse").versions
        ):
            assert time.monotonic() < deadline, "the gateway did not learn the candidates"
            time.sleep(0.02)
        yield g


def _cli(g: BackgroundGateway, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["versions", *args, "--url", g.url])
    return result.exit_code, result.output


DECISIONS = (VersionPromoted, VersionRolledBack, VersionPinned, VersionCanary)


def _decisions(
    g: BackgroundGateway,
) -> list[VersionPromoted | VersionRolledBack | VersionPinned | VersionCanary]:
    return [e for e in g.h.events.events if isinstance(e, DECISIONS)]


def _refused(g: BackgroundGateway, args: list[str], words: str) -> None:
    """One line on stderr naming the reason, exit 1, nothing published, the book unchanged (the exact
    list of decisions at the end of a test also catches one published late)."""
    releases = g.h.gateway.releases
    assert releases is not None
    # the collector sees a decision a moment after the CLI returns: wait for every one the book holds
    decided = sum(len(r.decisions) for r in releases.book.releases.values())
    deadline = time.monotonic() + 5
    while len(_decisions(g)) < decided:
        assert time.monotonic() < deadline, "the decisions did not reach the collector"
        time.sleep(0.01)
    before = releases.book.as_json()
    code, output = _cli(g, *args)
    assert code == 1 and output.count("\n") == 1 and output.startswith("error: "), output
    assert words in output, output
    assert releases.book.as_json() == before and len(_decisions(g)) == decided


def test_ls_and_show_list_each_version_with_its_status_step_and_score(gateway: BackgroundGateway) -> None:
    code, output = _cli(gateway, "ls")
    assert code == 0, output
    lines = output.splitlines()
    assert lines[0] == "policy: version 0 serves"
    rows = [line.split() for line in lines[2:6]]
    assert [r[:3] if r[0] == "*" else r[:2] for r in rows] == [
        ["3", "passed"], ["2", "failed"], ["1", "passed"], ["*", "0", "served"],
    ]  # fmt: skip
    assert rows[0][2:4] == ["30", "0.9"] and rows[1][2:4] == ["20", "0.2"] and "score 0.2 < 0.5" in lines[3]
    assert "terse: version 0 serves" in output  # the adapter's policy, in its own table

    code, output = _cli(gateway, "ls", "--adapter", "terse")
    assert code == 0 and "policy:" not in output and output.splitlines()[0] == "terse: version 0 serves"

    code, output = _cli(gateway, "ls", "--json")
    book = json.loads(output)
    assert code == 0 and book["model"] == "policy"
    assert [p["name"] for p in book["policies"]] == ["policy", "terse"]

    code, output = _cli(gateway, "show", "2")
    assert code == 0, output
    assert output.splitlines()[0] == "policy: version 2  failed"
    assert "/ckpt/v2" in output and "failed (score 0.2 < 0.5) by gate" in output and "score 0.2" in output
    code, output = _cli(gateway, "show", "1", "--adapter", "terse", "--json")
    assert (
        code == 0 and json.loads(output)["policy"] == "terse" and json.loads(output)["status"] == "candidate"
    )
    _refused(gateway, ["show", "9"], "version 9 is unknown")


def test_promote_rollback_and_pin_say_what_serves_and_who_decided(gateway: BackgroundGateway) -> None:
    releases = gateway.h.gateway.releases
    assert releases is not None
    book = releases.book

    _refused(gateway, ["rollback"], "nothing to roll back to")
    _refused(gateway, ["promote", "2"], "version 2 failed its gates (score 0.2 < 0.5)")
    _refused(gateway, ["promote", "7"], "version 7 is unknown")
    _refused(gateway, ["promote", "0"], "version 0 already serves")

    code, output = _cli(gateway, "promote", "1", "--reason", "gates passed")
    assert (code, output) == (0, "policy: version 1 serves (was 0), decided by cli:alice\n")
    code, output = _cli(gateway, "promote", "3", "--by", "cli:bob", "--json")
    answer = json.loads(output)
    assert code == 0 and answer["event"]["type"] == "version_promoted" and answer["release"]["served"] == 3
    assert answer["event"]["figures"] == {"score": 0.9, "kl": 0.01} and book.served() == 3

    code, output = _cli(gateway, "rollback", "--reason", "bad feedback")
    assert (code, output) == (0, "policy: version 1 serves (was 3, rolled back), decided by cli:alice\n")
    assert book.served() == 1 and book.release().status(3) == "rolled_back"

    code, output = _cli(gateway, "pin", "1", "--reason", "freeze")
    assert (code, output) == (0, "policy: pinned to version 1, which serves, decided by cli:alice\n")
    _refused(gateway, ["promote", "3"], "pinned to version 1; unpin it first")
    _refused(gateway, ["rollback"], "pinned to version 1")
    code, output = _cli(gateway, "pin", "--off")
    assert (code, output) == (0, "policy: unpinned (version 1 serves), decided by cli:alice\n")
    _refused(gateway, ["pin", "--off"], "not pinned")

    decided = gateway.run(gateway.h.events.wait_for(lambda e: isinstance(e, DECISIONS), count=5))
    assert [(e.type, e.decided_by) for e in decided] == [
        ("version_promoted", "cli:alice"),
        ("version_promoted", "cli:bob"),
        ("version_rolled_back", "cli:alice"),
        ("version_pinned", "cli:alice"),
        ("version_pinned", "cli:alice"),
    ]
    assert isinstance(decided[0], VersionPromoted) and decided[0].reason == "gates passed"


def test_canary_sends_a_share_and_refuses_a_share_outside_zero_one(gateway: BackgroundGateway) -> None:
    releases = gateway.h.gateway.releases
    assert releases is not None
    for share in ("0", "1", "1.5", "-0.2"):
        _refused(gateway, ["canary", "3", "--share", share], "a canary share must be in (0, 1)")
    _refused(gateway, ["canary", "2", "--share", "0.1"], "version 2 failed its gates")
    code, output = _cli(gateway, "canary", "3", "--share", "0.25", "--reason", "try it")
    assert (code, output) == (
        0,
        "policy: version 3 serves 25% of new sessions (canary), decided by cli:alice\n",
    )
    assert releases.book.release().canary_version == 3 and releases.book.served() == 0
    _refused(gateway, ["canary", "1", "--share", "0.1"], "version 3 is in canary; end it first")
    code, output = _cli(gateway, "ls", "--json")
    assert code == 0 and json.loads(output)["policies"][0]["canary"]["share"] == 0.25


def test_a_wrong_command_line_token_or_missing_url_is_one_line(
    gateway: BackgroundGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    for args in (["pin"], ["pin", "1", "--off"]):
        code, output = _cli(gateway, *args)
        assert code == 2 and output.count("\n") == 1 and "--off" in output, output
    code, output = _cli(gateway, "promote", "1", "--by", " ")
    assert code == 2 and "--by must be" in output
    result = runner.invoke(app, ["versions", "ls"])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "--url" in result.output
    monkeypatch.setenv("FLYWHEEL_ADMIN_TOKEN", "not-the-admin-token-at-all")
    _refused(gateway, ["promote", "1"], "answered 401")


def test_a_gateway_with_releases_off_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_ADMIN_TOKEN", TOKEN)
    with BackgroundGateway(tmp_path) as g:
        for args in (["ls"], ["promote", "1"]):
            code, output = _cli(g, *args)
            assert code == 1 and output.count("\n") == 1 and "answered 404" in output, output
            assert "releases are off" in output


def test_gates_alone_refuses_a_bad_configuration_in_one_line_and_runs_a_good_one(tmp_path: Path) -> None:
    import asyncio

    from flywheel.alone import serve_gates
    from infra.settings import FlywheelSettings

    config = tmp_path / "gates.json"
    config.write_text(
        '{"tasks": "suite.jsonl", "agent": "m:f", "rules": [{"metric": "accuracy", "min": 0.5}]}'
    )
    result = runner.invoke(app, ["gates", "--config", str(config)])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "unknown metric 'accuracy' (known: score, success, calls_per_episode, error_rate)" in result.output
    config.write_text('{"tasks": "suite.jsonl", "agent": "m:f", "rules": [{"metric": "score", "min": 0.5}]}')
    result = runner.invoke(app, ["gates", "--config", str(config)])
    assert result.exit_code == 1 and "cannot read" in result.output and "suite.jsonl" in result.output

    (tmp_path / "suite.jsonl").write_text('{"task_id": "t1", "input": {"question": "1+1"}}\n')

    async def run_briefly() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.5, stop.set)
        await serve_gates(FlywheelSettings(data_dir=tmp_path, bus="memory"), config, stop=stop)

    asyncio.run(run_briefly())  # started on the bus, stopped cleanly


def test_releases_without_slots_or_a_policy_map_refuse_to_start(tmp_path: Path) -> None:
    from gateway.releases import build_release_router
    from gateway.settings import GatewaySettings

    with pytest.raises(ValueError, match="set FLYWHEEL_RELEASE_SLOT_URLS"):
        build_release_router(GatewaySettings(data_dir=tmp_path, releases="gated"))
    assert build_release_router(GatewaySettings(data_dir=tmp_path, releases="off")) is None
    router = build_release_router(GatewaySettings(data_dir=tmp_path, releases="gated", policies="terse"))
    assert router is not None and not router.slots

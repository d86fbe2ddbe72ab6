"""``flywheel stats`` and ``flywheel replay`` with a policy map, against a real embedded ClickHouse (chdb).

A recorded run where each episode's first call was served by the ``writer`` adapter (v3) and its second
by the ``rewriter`` adapter (v5), plus one group served by the base alone: stats filtered by a policy
count that policy's episodes with its adapter's versions, stats by policy give one row per policy (the
base as ``''``); a replay of one policy republishes only that policy's transitions and skips episodes
without any (``other_policy``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

import schemas as s
from flywheel.cli.main import app
from flywheel.replay import ReplayFilter, replay
from infra.bus.memory import MemoryBus
from infra.eventlog.store import ChdbStore
from tests.fakes.events import Collector
from tests.integration.ops.synthetic import T0, Run, synthetic_run

pytestmark = pytest.mark.timeout(120)

VERSIONS = {"writer": 3, "rewriter": 5}
WINDOW = ReplayFilter(since=T0 - timedelta(minutes=1), until=datetime.now(UTC) + timedelta(hours=1))


def _with_policies(run: Run, adapted_groups: int) -> Run:
    """The run with the calls of its first ``adapted_groups`` groups served by adapters: call 0 by the
    writer, call 1 by the rewriter; their transitions carry the policy and the adapter's version."""
    groups = list(dict.fromkeys(e.group_id for e in run.scored if (e.task_id or "").startswith("calc-")))
    adapted = set(groups[:adapted_groups])
    episodes = {e.episode_id for e in run.scored if e.group_id in adapted}
    role = {0: "writer", 1: "rewriter"}
    out = Run()
    for event in run.events:
        if isinstance(event, s.LLMCallRecorded) and event.episode_id in episodes:
            name = role[event.call_seq]
            event = event.model_copy(update={"adapter": name, "adapter_version": VERSIONS[name]})
            out.calls.append(event)
        elif isinstance(event, s.EpisodeScored):
            if event.episode_id in episodes:
                transitions = [
                    t.model_copy(
                        update={
                            "policy": role[t.call_seqs[0]],
                            "weight_version": VERSIONS[role[t.call_seqs[0]]],
                        }
                    )
                    for t in event.transitions
                ]
                event = event.model_copy(update={"transitions": transitions})
            out.scored.append(event)
        out.events.append(event)
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Run]]:
    """A FLYWHEEL_DATA_DIR whose chdb holds the run (closed again: the CLI and the tests open it)."""
    root = tmp_path_factory.mktemp("ops-policies")
    run = _with_policies(synthetic_run(groups=3), adapted_groups=2)
    store = ChdbStore(root / "chdb")
    try:
        store.migrate()
        store.insert(run.events)
    finally:
        store.close()
    yield root, run


@pytest.fixture
def cli(recorded: tuple[Path, Run], monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for name in ("FLYWHEEL_BUS", "FLYWHEEL_ADMIN_URL", "FLYWHEEL_CLICKHOUSE_URL", "FLYWHEEL_ENV"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLYWHEEL_DATA_DIR", str(recorded[0]))
    return CliRunner()


def _points(cli: CliRunner, *args: str) -> list[dict[str, object]]:
    result = cli.invoke(app, ["stats", "--bucket", "day", *args, "--json"])
    assert result.exit_code == 0, result.output
    points: list[dict[str, object]] = json.loads(result.stdout)["points"]
    return points


def _total(points: list[dict[str, object]], policy: str | None = None) -> int:
    return sum(int(str(p["episodes"])) for p in points if policy is None or p["policy"] == policy)


def test_stats_filtered_and_grouped_by_policy(cli: CliRunner) -> None:
    everything = _points(cli)
    assert _total(everything) == 15  # 3 groups of 4, and the three odd episodes
    assert all(p["policy"] is None for p in everything)

    writer = _points(cli, "--policy", "writer")
    assert _total(writer) == 8  # the two adapted groups
    assert {p["policy"] for p in writer} == {"writer"}
    assert max(int(str(p["max_weight_version"])) for p in writer) == VERSIONS["writer"]  # the adapter's
    rewriter = _points(cli, "--policy", "rewriter")
    assert _total(rewriter) == 8 and max(int(str(p["max_weight_version"])) for p in rewriter) == 5
    assert _points(cli, "--policy", "critic") == []

    grouped = _points(cli, "--by-policy")
    assert {p["policy"] for p in grouped} == {"writer", "rewriter", ""}
    assert (_total(grouped, "writer"), _total(grouped, "rewriter"), _total(grouped, "")) == (8, 8, 7)
    table = cli.invoke(app, ["stats", "--bucket", "day", "--by-policy"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "policy" in table.output and "rewriter" in table.output, table.output
    refused = cli.invoke(app, ["stats", "--by-policy", "--plot", "x.png"])
    assert refused.exit_code == 2 and "--policy" in refused.output


def test_a_dry_run_replay_of_one_policy_counts_the_others(cli: CliRunner) -> None:
    result = cli.invoke(app, ["replay", "--policy", "writer", "--dry-run", "--no-pace", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["eligible"] == 8 and report["skipped"]["other_policy"] == 4, report


async def test_replay_of_one_policy_republishes_only_its_transitions(recorded: tuple[Path, Run]) -> None:
    root, run = recorded
    store = ChdbStore(root / "chdb")
    bus = MemoryBus()
    await bus.start()
    collector = await Collector().attach(bus, s.TRANSITIONS, group="trainer-under-test")
    try:
        report = await replay(store, bus, WINDOW.model_copy(update={"policy": "rewriter"}))
        await collector.wait_for(
            lambda e: isinstance(e, s.EpisodeScored) and e.source == s.EpisodeSource.replay,
            within_s=10,
            count=8,
        )
        await asyncio.sleep(0.2)  # nothing more arrives
    finally:
        await collector.stop()
        await bus.stop()
        store.close()
    replayed = [e for e in collector.events if isinstance(e, s.EpisodeScored)]
    assert report.sent == len(replayed) == 8 and report.skipped["other_policy"] == 4
    adapted = {e.episode_id: e for e in run.scored if any(t.policy for t in e.transitions)}
    for event in replayed:
        assert [t.policy for t in event.transitions] == ["rewriter"]
        original = adapted[event.episode_id]
        assert event.transitions[0].behaviour_logprobs == original.transitions[1].behaviour_logprobs
        assert event.transitions[0].weight_version == VERSIONS["rewriter"]


@pytest.mark.parametrize("kind", ["rl", "sft"])
def test_export_of_one_policy_keeps_its_rows(cli: CliRunner, tmp_path: Path, kind: str) -> None:
    out = tmp_path / f"{kind}.jsonl"
    args = ["export", "--kind", kind, "--policy", "writer", "-o", str(out), "--json"]
    result = cli.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == report["rows"] == 8  # the writer's call (or transition) of each adapted episode
    assert {r["policy"] for r in rows} == {"writer"} and {r["weight_version"] for r in rows} == {3}
    everything = tmp_path / f"all-{kind}.jsonl"
    assert cli.invoke(app, ["export", "--kind", kind, "-o", str(everything)]).exit_code == 0
    policies = {json.loads(line)["policy"] for line in everything.read_text().splitlines()}
    assert policies == {"writer", "rewriter", None}  # without --policy: every row, each with its policy

"""Replay and export against a real embedded ClickHouse (chdb) filled by the real recorder on the in-process bus."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import schemas as s
from flywheel.export import ExportFilter, export
from flywheel.replay import ReplayFilter, replay
from infra.bus.memory import MemoryBus
from infra.eventlog.recorder import Recorder
from infra.eventlog.store import ChdbStore
from tests.fakes.events import Collector
from tests.fakes.waiting import wait_until
from tests.integration.ops.synthetic import T0, Run, synthetic_run

pytestmark = pytest.mark.timeout(90)


async def _record(store: ChdbStore, run: Run) -> None:
    """Publish the run on a bus and let the real recorder write it to the store."""
    bus = MemoryBus()
    await bus.start()
    recorder = Recorder(bus, store, max_wait_s=0.05)
    await recorder.start()
    for event in run.events:
        await bus.publish(s.topic_for(event), event)
    # The recorder exposes no "written" event: poll its counter under a deadline.
    await wait_until(
        lambda: recorder.stats.events >= len(run.events), within_s=30, what="the recorder", interval_s=0.05
    )
    await recorder.stop()
    await bus.stop()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ChdbStore, Run]]:
    run = synthetic_run()
    store = ChdbStore(tmp_path_factory.mktemp("ops-chdb") / "chdb", database="ops_replay")
    try:
        store.migrate()
        asyncio.run(_record(store, run))
        yield store, run
    finally:
        store.close()


def _replayed(event: s.AnyEvent) -> bool:
    return isinstance(event, s.EpisodeScored) and event.source == s.EpisodeSource.replay


WINDOW = ReplayFilter(since=T0 - timedelta(minutes=1), until=datetime.now(UTC) + timedelta(hours=1))


async def test_replay_republishes_with_logprobs_and_versions(recorded: tuple[ChdbStore, Run]) -> None:
    store, run = recorded
    originals = {e.episode_id: e for e in run.scored}
    bus = MemoryBus()
    await bus.start()
    collector = await Collector().attach(bus, s.TRANSITIONS, group="trainer-under-test")
    try:
        report = await replay(store, bus, WINDOW)
        await collector.wait_for(_replayed, within_s=10, count=8)
    finally:
        await collector.stop()
        await bus.stop()
    assert all(isinstance(e, s.EpisodeScored) for e in collector.events)
    replayed = [e for e in collector.events if _replayed(e)]

    assert report.selected == len(run.scored) == 11
    assert report.skipped == {"no_transitions:no_token_ids": 1, "no_logprobs": 1, "not_train": 1}
    assert report.sent == 8 and report.groups == 2 and report.flat_groups == 0
    assert len(replayed) == 8
    for event in replayed:
        original = originals[event.episode_id]
        assert event.source == s.EpisodeSource.replay
        assert event.event_id != original.event_id
        assert event.group_id == f"r{report.run_id}-{original.group_id}"
        assert event.group_size == 4
        assert event.transitions == original.transitions  # behaviour logprobs and weight versions kept
        assert event.reward == original.reward
    assert {e.sample_index for e in replayed} == {0, 1, 2, 3}
    assert {t.weight_version for e in replayed for t in e.transitions} == {1, 2, 3}


async def test_replay_filters(recorded: tuple[ChdbStore, Run]) -> None:
    store, _ = recorded
    good = await replay(store, None, WINDOW.model_copy(update={"min_reward": 1.0}), dry_run=True)
    assert good.selected == 4 + 3 and good.eligible == 4  # 4 rewarded + the three odd ones (reward 1)
    assert good.flat_groups == 2  # every member has reward 1: no GRPO signal, and the report says so
    versions = await replay(
        store,
        None,
        WINDOW.model_copy(update={"min_weight_version": 3, "max_weight_version": 3}),
        dry_run=True,
    )
    assert 0 < versions.selected < 8
    by_task = await replay(store, None, WINDOW.model_copy(update={"task_pattern": "calc-1*"}), dry_run=True)
    assert by_task.selected == 4
    other_tenant = await replay(store, None, WINDOW.model_copy(update={"tenant": "nobody"}), dry_run=True)
    assert other_tenant.selected == 0 and other_tenant.sent == 0
    future = ReplayFilter(since=datetime.now(UTC) + timedelta(days=1))
    assert (await replay(store, None, future, dry_run=True)).selected == 0


async def test_replay_rate_limit_paces_publishing(recorded: tuple[ChdbStore, Run]) -> None:
    store, _ = recorded
    bus = MemoryBus()
    await bus.start()
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        report = await replay(store, bus, WINDOW.model_copy(update={"task_pattern": "calc-0"}), rate=40.0)
        elapsed = loop.time() - started
    finally:
        await bus.stop()
    assert report.sent == 4
    assert elapsed >= 3 / 40.0 * 0.9  # four sends at 40/s span at least three intervals


def test_export_sft_jsonl_and_parquet(recorded: tuple[ChdbStore, Run], tmp_path: Path) -> None:
    store, run = recorded
    report = export(store, tmp_path / "sft.jsonl", kind="sft", fmt="jsonl")
    assert report.rows == len(run.calls) == 16
    lines = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    first = lines[0]
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant"]
    assert first["tools"] == [{"type": "function"}]
    tool_rows = [r for r in lines if r["messages"][-1].get("tool_calls")]
    assert tool_rows and tool_rows[0]["messages"][-1]["tool_calls"][0]["function"]["name"] == "calc"
    assert {r["reward"] for r in lines} == {0.0, 1.0}

    good = export(
        store, tmp_path / "sft.parquet", kind="sft", fmt="parquet", flt=ExportFilter(min_reward=1.0)
    )
    table = pq.read_table(tmp_path / "sft.parquet")
    assert good.rows == table.num_rows == 8  # two calls of each of the four rewarded episodes
    row = table.slice(0, 1).to_pylist()[0]
    assert row["messages"][0] == {
        "role": "system",
        "content": "calc",
        "name": None,
        "tool_call_id": None,
        "tool_calls": None,
    }
    assert set(table.column("reward").to_pylist()) == {1.0}


def test_export_rl_parquet_reads_back_token_level(recorded: tuple[ChdbStore, Run], tmp_path: Path) -> None:
    store, run = recorded
    report = export(store, tmp_path / "rl.parquet", kind="rl", fmt="parquet")
    assert report.skipped == {"no_transitions:no_token_ids": 1, "no_logprobs": 1}
    table = pq.read_table(tmp_path / "rl.parquet")
    expected = sum(len(e.transitions) for e in run.scored) - 1  # minus the transition without logprobs
    assert table.num_rows == report.rows == expected
    for name in ("prompt_ids", "response_ids", "response_mask", "response_logprobs", "reward_score", "uid"):
        assert name in table.column_names
    rows = table.to_pylist()
    by_episode = {e.episode_id: e for e in run.scored}
    for row in rows:
        original = by_episode[row["episode_id"]]
        t = original.transitions[0] if row["call_seqs"] in ([0], []) else original.transitions[-1]
        assert row["response_ids"] == t.response_ids
        assert row["response_logprobs"] == pytest.approx(t.behaviour_logprobs, abs=1e-6)
        assert len(row["response_mask"]) == len(row["response_ids"]) == len(row["response_logprobs"])
        assert row["weight_version"] == t.weight_version and row["uid"] == original.group_id

    jsonl = export(store, tmp_path / "rl.jsonl", kind="rl", fmt="jsonl", flt=ExportFilter(limit=3))
    assert jsonl.rows == 3 == len((tmp_path / "rl.jsonl").read_text().splitlines())


def test_export_of_nothing_writes_an_empty_readable_file(
    recorded: tuple[ChdbStore, Run], tmp_path: Path
) -> None:
    store, _ = recorded
    flt = ExportFilter(since=datetime.now(UTC) + timedelta(days=1))
    report = export(store, tmp_path / "none.parquet", kind="rl", fmt="parquet", flt=flt)
    assert report.rows == 0
    assert pq.read_table(tmp_path / "none.parquet").num_rows == 0

"""Replay and export throughput from embedded ClickHouse (chdb).

Figures (baseline measured in the same run):
- ``read_episodes_per_s`` (baseline): iterating ``select_scored_episodes`` over the whole log — the
  event-log read every replay and export starts with.
- ``replay_episodes_per_s``: ``flywheel.replay.replay`` selecting, checking, regrouping and publishing
  every episode on the in-process bus, no rate limit; ``replay_ratio`` = replay / read.
- ``export_rl_parquet_rows_per_s``, ``export_rl_jsonl_rows_per_s``, ``export_sft_jsonl_rows_per_s``:
  ``flywheel.export.export`` writing the whole log; ``export_rl_parquet_ratio`` = transitions/s of the
  Parquet export over the read's transitions/s.

    python tests/benchmarks/replay_export.py [--json] [--episodes N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from flywheel.export import export
from flywheel.replay import ReplayFilter, replay
from infra.bus.memory import MemoryBus
from infra.eventlog.models import EpisodeFilter
from infra.eventlog.store import ChdbStore
from infra.logging import configure_logging
from tests.integration.ops.synthetic import synthetic_run

GOALS = {
    "replay_episodes_per_s": "≥ 1000",
    "replay_ratio": "≥ 0.5",
    "export_rl_parquet_rows_per_s": "≥ 5000",
}


def _fill(store: ChdbStore, episodes: int) -> int:
    groups = max(1, episodes // 4)
    run = synthetic_run(groups=groups, size=4)
    store.insert(run.events)
    return len(run.scored)


async def _replay(store: ChdbStore, limit: int) -> int:
    bus = MemoryBus(max_backlog=1_000_000, retain=1_000_000, max_retained=2_000_000)
    await bus.start()
    try:
        report = await replay(store, bus, ReplayFilter(limit=limit))
    finally:
        await bus.stop()
    return report.sent


def run(episodes: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = ChdbStore(Path(tmp) / "chdb", database="bench")
        try:
            store.migrate()
            total = _fill(store, episodes)
            limit = total + 10

            t = time.perf_counter()
            read = list(store.select_scored_episodes(EpisodeFilter(limit=limit)))
            read_s = time.perf_counter() - t
            transitions = sum(len(e.transitions) for e in read)
            figures["episodes"] = float(len(read))
            figures["read_episodes_per_s"] = len(read) / read_s

            t = time.perf_counter()
            sent = asyncio.run(_replay(store, limit))
            figures["replay_episodes_per_s"] = sent / (time.perf_counter() - t)
            figures["replay_ratio"] = figures["replay_episodes_per_s"] / figures["read_episodes_per_s"]

            for kind, fmt in (("rl", "parquet"), ("rl", "jsonl"), ("sft", "jsonl")):
                t = time.perf_counter()
                report = export(store, Path(tmp) / f"out.{kind}.{fmt}", kind=kind, fmt=fmt)  # type: ignore[arg-type]
                figures[f"export_{kind}_{fmt}_rows_per_s"] = report.rows / (time.perf_counter() - t)
            figures["export_rl_parquet_ratio"] = figures["export_rl_parquet_rows_per_s"] / (
                transitions / read_s
            )
        finally:
            store.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--episodes", type=int, default=4000)
    args = parser.parse_args()
    configure_logging("WARNING", json=False)  # logs to stderr: --json prints one object on stdout
    figures = run(args.episodes)
    if args.json:
        print(json.dumps({"figures": figures, "goals": GOALS}))
        return
    print(f"{'figure':34} {'value':>12}  goal")
    for name, value in figures.items():
        print(f"{name:34} {value:12.1f}  {GOALS.get(name, '')}")


if __name__ == "__main__":
    main()

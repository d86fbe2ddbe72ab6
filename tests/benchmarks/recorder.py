"""Recorder throughput: ~2 KB ``LLMCallRecorded`` events from the in-process bus into embedded chdb.

    python tests/benchmarks/recorder.py [--events N] [--json]

Figures (all in one run, same rows):
- ``recorder_events_per_s``: events already on the bus, drained by the recorder (consumer group, batch
  handler, Arrow build with the full event JSON, chdb insert, offset commit) — the issue's goal.
- ``baseline_arrow_insert_rows_per_s``: raw chdb inserts of the same rows as prebuilt Arrow tables (the
  ceiling: what the engine takes with no bus and no serialisation).
- ``rows_build_per_s``: building those Arrow tables from the events (mostly JSON serialisation).
- ``*_per_cpu_s``: the same per CPU-second of this process (all its threads, chdb's included): a figure
  that a machine shared with other work depresses far less than wall-clock throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import schemas as s
from infra.bus.memory import MemoryBus
from infra.eventlog.recorder import Recorder
from infra.eventlog.rows import to_arrow
from infra.eventlog.store import ChdbStore
from infra.logging import configure_logging

GOAL_EVENTS_PER_S = 30_000
BATCH = 5000  # the baseline's insert size


def make_call_events(n: int, calls_per_episode: int = 8) -> list[s.LLMCallRecorded]:
    """``n`` call events of about 2 KB of JSON each (token ids, logprobs, request and response text)."""
    events = []
    episode = s.new_episode_id()
    for i in range(n):
        if i % calls_per_episode == 0:
            episode = s.new_episode_id()
        choice = s.CallChoice(
            index=0,
            text="The answer is 85. " * 4,
            message={"role": "assistant", "content": "The answer is 85. " * 4},
            finish_reason="stop",
            token_ids=list(range(1000 + i % 50, 1060 + i % 50)),
            logprobs=[-0.25 - (j % 7) * 0.01 for j in range(60)],
            weight_versions=None,
        )
        events.append(
            s.LLMCallRecorded(
                episode_id=episode,
                call_seq=i % calls_per_episode,
                call_id=f"call-{i}",
                model="policy",
                request='{"model":"policy","messages":[{"role":"user","content":"'
                + "what is 47+38? " * 12
                + '"}]}',
                response='{"id":"cmpl","object":"chat.completion"}',
                upstream=s.UpstreamKind.embedded,
                token_faithful=True,
                prompt_token_ids=list(range(200, 260)),
                choices=[choice],
                weight_version=3,
                prompt_tokens=60,
                completion_tokens=60,
                latency_ms=12.5,
            )
        )
    return events


async def _drain(events: list[s.LLMCallRecorded], store: ChdbStore) -> tuple[float, float]:
    """(events per wall second, events per CPU second of this process) for the recorder's drain."""
    bus = MemoryBus(retain=len(events), max_retained=len(events), max_backlog=len(events) + 1)
    await bus.start()
    try:
        await bus.ensure_topics([s.EPISODES])
        for e in events:
            await bus.publish(s.EPISODES, e)
        recorder = Recorder(bus, store, topics=[s.EPISODES])  # its production settings
        started = time.perf_counter()
        cpu_started = time.process_time()  # all threads of this process, chdb's included
        await recorder.start()
        deadline = started + 600
        while recorder.stats.events < len(events):
            if time.perf_counter() > deadline:
                raise TimeoutError(f"recorder wrote {recorder.stats.events} of {len(events)} events")
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        await recorder.stop()
        return len(events) / elapsed, len(events) / cpu
    finally:
        await bus.stop()


def _measure(n_events: int) -> dict[str, float]:
    events = make_call_events(n_events)
    tmp = Path(tempfile.mkdtemp(prefix="flywheel-bench-recorder-"))
    store = ChdbStore(tmp / "chdb", "bench")
    try:
        store.migrate()
        to_arrow(events[:1])  # first use imports pyarrow's pandas shim: keep it out of the timings
        started = time.perf_counter()
        tables = [to_arrow(events[i : i + BATCH]) for i in range(0, n_events, BATCH)]
        build = n_events / (time.perf_counter() - started)
        started = time.perf_counter()
        cpu_started = time.process_time()
        for table in tables:
            store._insert_table(table)
        baseline = n_events / (time.perf_counter() - started)
        baseline_cpu = n_events / (time.process_time() - cpu_started)
        store._command("TRUNCATE TABLE bench.events")
        recorder, recorder_cpu = asyncio.run(_drain(events, store))
        counted = store.counts().total
        if counted != n_events:
            raise RuntimeError(f"expected {n_events} events in the log, found {counted}")
        payload_bytes = sum(len(p.as_py()) for p in tables[0].column("payload")) / tables[0].num_rows
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "recorder_events_per_s": recorder,
        "recorder_events_per_cpu_s": recorder_cpu,
        "baseline_arrow_insert_rows_per_s": baseline,
        "baseline_arrow_insert_rows_per_cpu_s": baseline_cpu,
        "rows_build_per_s": build,
        "recorder_vs_baseline": recorder / baseline,
        "event_json_bytes": payload_bytes,
    }


def _quiet_logs() -> None:
    import structlog

    if not structlog.is_configured():
        configure_logging("WARNING", json=True)  # stderr; stdout carries the table or the JSON


def run_recorder_benchmark(n_events: int) -> float:
    """Sustained call events/s from the in-process bus into embedded chdb (the recorder's path)."""
    _quiet_logs()
    return _measure(n_events)["recorder_events_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    _quiet_logs()
    figures = _measure(args.events)
    goals = {"recorder_events_per_s": f"≥ {GOAL_EVENTS_PER_S}"}
    if args.json:
        print(json.dumps({"figures": figures, "goals": goals}))
        return
    print(
        f"recorder benchmark: {args.events} LLMCallRecorded events, ~{figures['event_json_bytes']:.0f} B JSON each"
    )
    print(f"{'figure':38} {'value':>12}  {'vs baseline':>11}  goal")
    base = figures["baseline_arrow_insert_rows_per_s"]
    base_cpu = figures["baseline_arrow_insert_rows_per_cpu_s"]
    for name, unit, ref in (
        ("baseline_arrow_insert_rows_per_s", "rows/s", base),
        ("rows_build_per_s", "rows/s", base),
        ("recorder_events_per_s", "events/s", base),
        ("baseline_arrow_insert_rows_per_cpu_s", "rows/CPU-s", base_cpu),
        ("recorder_events_per_cpu_s", "events/CPU-s", base_cpu),
    ):
        value = figures[name]
        print(f"{name:38} {value:12,.0f}  {value / ref:10.2f}×  {goals.get(name, '')} {unit}")
    print(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs while measuring)")


if __name__ == "__main__":
    main()

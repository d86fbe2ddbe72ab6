"""Bus throughput: the in-process bus, the Kafka publish path, and the recorder into embedded chdb.

Figures (each with a baseline measured in the same run):
- ``memory_bus_events_per_s``: ~2 KB ``LLMCallRecorded`` events (built and validated by pydantic
  beforehand, as a publisher holds them) from ``publish`` to the handler, one group, 16 partitions.
  Baseline: the same objects through one bare ``asyncio.Queue`` (no partitions, offsets, groups).
- ``memory_bus_with_validation_events_per_s`` (the issue's goal): the same, but each event is validated
  from a dict inside the timed loop (``LLMCallRecorded.model_validate``), i.e. the cost of building
  the event too. Best of two runs, as for the figure above (the machine is shared).
- ``gc_release_pause_s``: the full collection the bus's GC policy (``infra.bus.gc_policy``) runs when
  it hands its tenured objects back (at most once per ``release_every_s`` and ``release_every_appends``,
  and at stop): measured at the end of the run above, outside its timed window, so it is shown here.
- ``validation_only_events_per_s``: the ceiling for the figure above: ``model_validate`` of the same
  dicts in a bare loop (no bus). Full pydantic validation of a ~2 KB call event (100+ list items) is
  what bounds "with validation", not the bus.
- ``kafka_publish_ratio``: ``KafkaBus.publish`` (idempotent, acks=all, awaits each ack; encodes the
  event) events/s divided by raw aiokafka ``send_and_wait`` with the same producer settings, the same
  events encoded the same way, and the same number of publishes in flight. For the record, the same
  ratio for faststream's ``KafkaBroker.publish`` (why ``KafkaBus`` uses aiokafka directly).
- ``recorder_events_per_s``: ``tests/benchmarks/recorder.py``'s ``run_recorder_benchmark``.

    python tests/benchmarks/bus.py [--json] [--events N] [--kafka-events N] [--bootstrap HOST:PORT]
                                   [--stages memory,kafka,recorder]   (all three by default)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import schemas as s
from infra.bus import Message, gc_policy
from infra.bus.memory import MemoryBus
from tests.integration.bus.helpers import call_event

# The goals. The in-process one names events "with validation": the figure that builds each
# event from a dict inside the timed loop, not the one that publishes prebuilt objects.
GOALS = {
    "memory_bus_with_validation_events_per_s": "≥ 50000",
    "kafka_publish_ratio": "≥ 0.7",
    "recorder_events_per_s": "≥ 30000",
}


def _events(n: int, episodes: int = 1000) -> list[s.LLMCallRecorded]:
    template = call_event(uuid.uuid4().hex, 0)
    eps = [uuid.uuid4().hex for _ in range(episodes)]
    return [
        template.model_copy(
            update={"episode_id": eps[i % episodes], "call_seq": i // episodes, "event_id": uuid.uuid4().hex}
        )
        for i in range(n)
    ]


async def _memory_bus(events: list[s.LLMCallRecorded], validate: bool) -> float:
    bus = MemoryBus()
    await bus.start()
    n = len(events)
    done = asyncio.Event()
    count = 0

    async def handler(message: Message) -> None:
        nonlocal count
        count += 1
        if count == n:
            done.set()

    await bus.subscribe(s.EPISODES, "bench", handler)
    dicts = [e.model_dump() for e in events] if validate else []
    start = time.perf_counter()
    if validate:
        for d in dicts:
            await bus.publish(s.EPISODES, s.LLMCallRecorded.model_validate(d))
    else:
        for event in events:
            await bus.publish(s.EPISODES, event)
    await done.wait()
    elapsed = time.perf_counter() - start
    await bus.stop()
    return n / elapsed


def _validation_only(events: list[s.LLMCallRecorded]) -> float:
    dicts = [e.model_dump() for e in events]
    start = time.perf_counter()
    for d in dicts:
        s.LLMCallRecorded.model_validate(d)
    return len(dicts) / (time.perf_counter() - start)


async def _queue_baseline(events: list[s.LLMCallRecorded]) -> float:
    queue: asyncio.Queue[s.LLMCallRecorded] = asyncio.Queue(maxsize=10_000)
    n = len(events)
    count = 0

    async def consume() -> None:
        nonlocal count
        while count < n:
            await queue.get()
            count += 1

    consumer = asyncio.create_task(consume())
    start = time.perf_counter()
    for event in events:
        await queue.put(event)
    await consumer
    return n / (time.perf_counter() - start)


async def _kafka(
    bootstrap: str, events: list[s.LLMCallRecorded], in_flight: int, rounds: int = 3
) -> dict[str, float]:
    from aiokafka import AIOKafkaProducer

    from infra.bus.kafka import KafkaBus

    prefix = f"bench-{uuid.uuid4().hex[:8]}."
    bus = KafkaBus(bootstrap, prefix=prefix)
    await bus.start()
    await bus.ensure_topics([s.EPISODES])
    raw_topic = prefix + s.EPISODES  # the same 16-partition topic
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        max_batch_size=1024 * 1024,
    )
    await producer.start()

    async def raw_send(event: s.LLMCallRecorded) -> None:
        await producer.send_and_wait(raw_topic, s.encode(event), key=event.episode_id.encode())

    async def bus_send(event: s.LLMCallRecorded) -> None:
        await bus.publish(s.EPISODES, event)

    async def run(send: Any) -> float:
        it = iter(events)

        async def worker() -> None:
            for event in it:
                await send(event)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        return len(events) / (time.perf_counter() - start)

    from faststream.kafka import KafkaBroker

    broker = KafkaBroker(
        bootstrap, enable_idempotence=True, acks="all", linger_ms=5, max_batch_size=1024 * 1024, logger=None
    )
    await broker.connect()

    async def faststream_send(event: s.LLMCallRecorded) -> None:
        await broker.publish(s.encode(event), raw_topic, key=event.episode_id.encode())

    try:
        await run(raw_send)  # warm up (metadata, connections)
        await run(faststream_send)
        # Interleaved rounds, best of each: the machine is shared, so load drifts between runs.
        raw = via_bus = via_faststream = 0.0
        for _ in range(rounds):
            raw = max(raw, await run(raw_send))
            via_bus = max(via_bus, await run(bus_send))
            via_faststream = max(via_faststream, await run(faststream_send))
    finally:
        await broker.stop()
        await producer.stop()
        await bus.stop()
    return {
        "kafka_raw_aiokafka_events_per_s": raw,
        "kafka_bus_events_per_s": via_bus,
        "kafka_faststream_events_per_s": via_faststream,
    }


def _kafka_reachable(bootstrap: str) -> bool:
    import socket

    host, _, port = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


STAGES = ("memory", "kafka", "recorder")


def measure(
    n_events: int,
    kafka_events: int,
    bootstrap: str,
    recorder_events: int,
    stages: tuple[str, ...] = STAGES,
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    notes: list[str] = []
    events = _events(n_events)
    if "memory" in stages:
        _measure_memory(figures, events, n_events)
    if "kafka" in stages:
        _measure_kafka(figures, notes, kafka_events, bootstrap)
    if "recorder" in stages:
        _measure_recorder(figures, notes, recorder_events)
    if notes:
        figures["notes"] = "; ".join(notes)
    return figures


def _measure_memory(figures: dict[str, Any], events: list[s.LLMCallRecorded], n_events: int) -> None:
    figures["event_json_bytes"] = len(s.encode(events[0]))
    figures["queue_baseline_events_per_s"] = asyncio.run(_queue_baseline(events))
    figures["memory_bus_events_per_s"] = max(asyncio.run(_memory_bus(events, False)) for _ in range(2))
    figures["memory_bus_ratio_to_queue"] = (
        figures["memory_bus_events_per_s"] / figures["queue_baseline_events_per_s"]
    )
    figures["memory_bus_with_validation_events_per_s"] = max(
        asyncio.run(_memory_bus(events[: n_events // 2], True)) for _ in range(2)
    )
    figures["gc_release_pause_s"] = gc_policy.POLICY.stats.last_release_pause_s
    figures["gc_release_every_s"] = gc_policy.POLICY.release_every_s
    figures["gc_release_every_appends"] = gc_policy.POLICY.release_every_appends
    figures["validation_only_events_per_s"] = _validation_only(events[: n_events // 2])


def _measure_kafka(figures: dict[str, Any], notes: list[str], kafka_events: int, bootstrap: str) -> None:
    if _kafka_reachable(bootstrap):
        k = asyncio.run(_kafka(bootstrap, _events(kafka_events, 500), in_flight=256))
        figures.update(k)
        figures["kafka_publish_ratio"] = k["kafka_bus_events_per_s"] / k["kafka_raw_aiokafka_events_per_s"]
        figures["kafka_faststream_publish_ratio"] = (
            k["kafka_faststream_events_per_s"] / k["kafka_raw_aiokafka_events_per_s"]
        )
    else:
        figures["kafka_publish_ratio"] = None
        notes.append(f"Kafka at {bootstrap} unreachable: start one with `flywheel kafka start`")


def _measure_recorder(figures: dict[str, Any], notes: list[str], recorder_events: int) -> None:
    try:
        from tests.benchmarks.recorder import run_recorder_benchmark
    except ImportError as exc:
        figures["recorder_events_per_s"] = None
        notes.append(f"recorder benchmark missing ({exc})")
    else:
        figures["recorder_events_per_s"] = run_recorder_benchmark(recorder_events)


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--kafka-events", type=int, default=10_000)
    parser.add_argument("--recorder-events", type=int, default=50_000)
    parser.add_argument("--bootstrap", default=os.environ.get("FLYWHEEL_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    parser.add_argument(
        "--stages", default=",".join(STAGES), help="comma-separated subset of: " + ", ".join(STAGES)
    )
    args = parser.parse_args()
    stages = tuple(x.strip() for x in args.stages.split(",") if x.strip())
    if unknown := set(stages) - set(STAGES):
        parser.error(f"unknown stages: {', '.join(sorted(unknown))}")
    import logging

    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    from infra.logging import configure_logging

    configure_logging("ERROR")
    figures = measure(args.events, args.kafka_events, args.bootstrap, args.recorder_events, stages)
    if args.json:
        print(json.dumps({"figures": figures, "goals": GOALS}))
        return
    print(f"{'figure':<42} {'value':>14}  goal")
    for name, value in figures.items():
        if name != "notes":
            print(f"{name:<42} {_fmt(value):>14}  {GOALS.get(name, '')}")
    if "notes" in figures:
        print(f"notes: {figures['notes']}")


if __name__ == "__main__":
    main()

"""A three-broker KRaft cluster on the host (RF=3, min.insync.replicas=2): the leader of the busiest
partition of ``flywheel.episodes`` is SIGKILLed under load, then restarted.

The cluster is this test's own (``infra.kafka.launcher.cluster``, free ports). Publishers write calls,
half of them to one hot episode, with the bus's idempotent producer (acks=all); a publish that fails is
sent again (same event id). While the broker is down the others take over its partitions' leadership
and keep acknowledging (two replicas in sync are enough). The killed broker rejoins every ISR. Then the
whole topic is read back and ``tests/faults/history.py`` checks it: every acknowledged call recorded
exactly once after dedup by event id, call numbers unique per episode. Figures (calls, kills, publish
retries, recovery seconds) printed as FAULT-FIGURES and kept in ``FLYWHEEL_FAULT_FIGURES``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from infra.bus.base import BusError
from infra.bus.kafka import KafkaBus
from infra.bus.partitioner import partition_for
from infra.kafka import launcher
from schemas import EPISODES, LLMCallRecorded, spec_for
from tests.fakes.waiting import wait_until
from tests.faults.history import Attempt, ClientCall, Logged, check
from tests.faults.procs import Figures

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
PREFIX = "faults-cluster."
PUBLISHERS = 4


def _free_run(length: int) -> int:
    """A port p with p .. p+length-1 all free on the loopback."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base: int = s.getsockname()[1]
        if base + length < 65000 and all(_free(base + i) for i in range(length)):
            return base
    raise RuntimeError("no run of free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


async def _partitions(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    parts: list[dict[str, Any]] = described[0]["partitions"]
    return parts


class Load:
    """Publishers of calls: ``acked`` the (episode, call id) of every acknowledged publish."""

    def __init__(self, bus: KafkaBus) -> None:
        self.bus = bus
        self.acked: list[LLMCallRecorded] = []
        self.attempts: dict[str, list[Attempt]] = {}
        self.acked_at: dict[int, float] = {}  # partition → time of its latest acknowledgement
        self.stop = asyncio.Event()
        self.parts = spec_for(EPISODES).partitions

    async def publisher(self, n: int) -> None:
        seq = 0
        while not self.stop.is_set():
            episode = "hot" if seq % 2 == 0 else f"ep-{n}-{seq // 40}"
            event = LLMCallRecorded(
                episode_id=episode if episode != "hot" else f"hot-{n}",
                call_seq=seq,
                call_id=f"c-{n}-{seq}",
                request="{}",
            )
            tries = self.attempts.setdefault(event.call_id, [])
            while True:
                try:
                    await self.bus.publish(EPISODES, event)
                except BusError:
                    tries.append(Attempt(503, retry_after=True))  # the retry path: the same event again
                    await asyncio.sleep(0.2)
                    continue
                tries.append(Attempt(200))
                break
            self.acked.append(event)
            self.acked_at[partition_for(event.episode_id, self.parts)] = time.monotonic()
            seq += 1
            await asyncio.sleep(0.005)


async def _run(tmp: Path) -> tuple[Figures, list[Logged], list[ClientCall]]:
    nodes = launcher.cluster(3, _free_run(6), tmp / "kafka")
    await asyncio.to_thread(launcher.start_cluster, nodes)
    bootstrap = ",".join(n.bootstrap for n in nodes)
    bus = KafkaBus(bootstrap, prefix=PREFIX, publish_timeout_s=5)
    await bus.start()
    figures = Figures("kafka_cluster_leader_kill9")
    try:
        await bus.ensure_topics([EPISODES])
        parts = await _partitions(bootstrap, PREFIX + EPISODES)
        assert {len(p["replicas"]) for p in parts} == {3}, parts  # RF=3 from the bus on this cluster
        load = Load(bus)
        tasks = [asyncio.create_task(load.publisher(i)) for i in range(PUBLISHERS)]
        await wait_until(lambda: len(load.acked) >= 300, 120, "calls before the kill", interval_s=0.05)
        busiest = Counter(partition_for(e.episode_id, load.parts) for e in load.acked).most_common(1)[0][0]
        leader = next(p["leader"] for p in parts if p["partition"] == busiest)
        victim = nodes[leader - 1]
        pid = launcher.read_pid(victim)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed, at_kill = time.monotonic(), len(load.acked)
        await wait_until(  # the busiest partition has a new leader
            lambda: load.acked_at.get(busiest, 0.0) > killed,
            120,
            "a write to the busiest partition",
            interval_s=0.02,
        )
        recover_s = time.monotonic() - killed
        await wait_until(
            lambda: len(load.acked) >= at_kill + 200, 120, "writes on two brokers", interval_s=0.05
        )
        restarted = time.monotonic()
        await asyncio.to_thread(launcher.start, victim)
        while True:  # the restarted broker catches up and rejoins every ISR
            survivor = ",".join(n.bootstrap for n in nodes if n is not victim)
            isr = await _partitions(survivor, PREFIX + EPISODES)
            if all(len(p["isr"]) == 3 for p in isr):
                break
            await asyncio.sleep(0.5)
        rejoin_s = time.monotonic() - restarted
        load.stop.set()
        await asyncio.gather(*tasks)
        read = await bus.read_partitions(EPISODES, list(range(load.parts)))
        logged = [Logged(m.event, m.topic, m.partition, m.offset) for ms in read.values() for m in ms]
        client = [ClientCall(e.episode_id, tuple(load.attempts[e.call_id])) for e in load.acked]
        figures.calls = len(load.acked)
        figures.ok = len(load.acked)
        figures.recover_s = round(recover_s, 2)
        figures.extra = {
            "kills": 1,
            "killed_node": leader,
            "busiest_partition": busiest,
            "publish_retries": sum(len(a) - 1 for a in load.attempts.values()),
            "restart_to_full_isr_s": round(rejoin_s, 2),
        }
    finally:
        await bus.stop()
        for node in nodes:
            await asyncio.to_thread(launcher.stop, node)
    return figures, logged, client


def test_leader_kill9_on_a_three_broker_cluster_loses_no_acknowledged_call(tmp_path: Path) -> None:
    figures, logged, client = asyncio.run(_run(tmp_path))
    violations, history = check(logged, client)
    figures.lost = sum(1 for v in violations if v.rule == "call-recorded-once")
    figures.extra["records_read"] = len(logged)
    figures.extra["same_event_id_records"] = history.duplicate_records  # a retried publish, deduped
    figures.report()
    assert violations == [], (violations[:10], figures)
    assert history.calls_recorded == figures.calls

"""Run in a one-off container on a compose stack's network (``--entrypoint python``): what the history
checker needs from Kafka, which the host cannot reach, written as JSON to ``argv[2]``.

    python cluster_log.py leaders OUT   # {"busiest": partition, "leader": node id} of flywheel.episodes
    python cluster_log.py log OUT       # records of flywheel.episodes and flywheel.transitions, the
                                        # trainer's committed offsets on flywheel.transitions

Only what the image holds is imported (Flywheel's packages and aiokafka); the bootstrap list and topic
prefix are the container's ``FLYWHEEL_KAFKA_BOOTSTRAP`` and ``FLYWHEEL_TOPIC_PREFIX``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from infra.bus.kafka import KafkaBus
from schemas import EPISODES, TRANSITIONS, spec_for


async def _leaders(bus: KafkaBus) -> dict[str, Any]:
    read = await bus.read_partitions(EPISODES, list(range(spec_for(EPISODES).partitions)))
    busiest = max(read, key=lambda p: len(read[p]))
    admin = AIOKafkaAdminClient(bootstrap_servers=bus.bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([bus.physical(EPISODES)])
    finally:
        await admin.close()
    leader = next(p["leader"] for p in described[0]["partitions"] if p["partition"] == busiest)
    return {"busiest": busiest, "leader": leader}


async def _log(bus: KafkaBus) -> dict[str, Any]:
    records = []
    for topic in (EPISODES, TRANSITIONS):
        read = await bus.read_partitions(topic, list(range(spec_for(topic).partitions)))
        for messages in read.values():
            records += [
                {
                    "topic": m.topic,
                    "partition": m.partition,
                    "offset": m.offset,
                    "event": m.event.model_dump(mode="json"),
                }
                for m in messages
            ]
    admin = AIOKafkaAdminClient(bootstrap_servers=bus.bootstrap)
    await admin.start()
    try:
        tps = [TopicPartition(bus.physical(TRANSITIONS), p) for p in range(spec_for(TRANSITIONS).partitions)]
        offsets = await admin.list_consumer_group_offsets(bus.physical("trainer"), partitions=tps)
    finally:
        await admin.close()
    committed = {
        tp.partition: meta.offset for tp, meta in offsets.items() if meta is not None and meta.offset >= 0
    }
    return {
        "records": records,
        "trainer_committed": committed,
        "trainer_lag": await bus.lag(TRANSITIONS, "trainer"),
    }


async def read(what: str) -> dict[str, Any]:
    bus = KafkaBus(os.environ["FLYWHEEL_KAFKA_BOOTSTRAP"], prefix=os.environ.get("FLYWHEEL_TOPIC_PREFIX", ""))
    await bus.start()
    try:
        return await (_leaders(bus) if what == "leaders" else _log(bus))
    finally:
        await bus.stop()


if __name__ == "__main__":
    with open(sys.argv[2], "w") as out:
        json.dump(asyncio.run(read(sys.argv[1])), out)

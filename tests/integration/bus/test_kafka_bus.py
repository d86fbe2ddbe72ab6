"""Kafka-only behaviour: an unreachable broker, physical names under the prefix."""

from __future__ import annotations

import socket
import uuid

import pytest

import schemas as s
from infra.bus import BusClosedError, BusUnavailableError, Message
from infra.bus.kafka import KafkaBus
from tests.integration.bus.helpers import call_event, wait_until

pytestmark = pytest.mark.timeout(30)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_unreachable_broker_raises_bus_unavailable() -> None:
    bus = KafkaBus(f"127.0.0.1:{_closed_port()}", publish_timeout_s=2.0)
    with pytest.raises(BusUnavailableError, match="unreachable"):
        await bus.start()
    with pytest.raises(BusClosedError):
        await bus.publish(s.EPISODES, call_event(uuid.uuid4().hex, 0, size=200))


@pytest.mark.kafka
async def test_topics_are_created_under_the_prefix_with_their_partitions(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    async with KafkaBus(kafka_bootstrap, prefix=topic_prefix) as bus:
        await bus.ensure_topics([s.EPISODES, s.CONTROL, s.tasks_topic("gpu")])
        assert set(await bus.list_topics()) >= {s.EPISODES, s.CONTROL, "flywheel.tasks.gpu"}
        producer = bus._running_producer()
        assert len(await producer.partitions_for(topic_prefix + s.EPISODES)) == 16
        assert len(await producer.partitions_for(topic_prefix + s.CONTROL)) == 1
        assert await bus.lag(s.EPISODES, "nobody") == 0


@pytest.mark.kafka
async def test_consumed_messages_carry_the_record_bytes(kafka_bootstrap: str, topic_prefix: str) -> None:
    # The recorder stores ``Message.raw`` as the payload instead of encoding the event again.
    ep = uuid.uuid4().hex
    event = call_event(ep, 0, size=300)
    got: list[Message] = []

    async def collect(message: Message) -> None:
        got.append(message)

    async with KafkaBus(kafka_bootstrap, prefix=topic_prefix) as bus:
        await bus.subscribe(s.EPISODES, "raw-reader", collect)
        await bus.publish(s.EPISODES, event)
        await wait_until(lambda: bool(got), within_s=20, what="the message")
    assert got[0].event == event
    assert got[0].raw == s.encode(event)

"""Kafka-only behaviour: an unreachable broker, physical names under the prefix, fetch settings."""

from __future__ import annotations

import asyncio
import socket
import uuid

import pytest

import schemas as s
from infra.bus import BusClosedError, BusUnavailableError, Message
from infra.bus.kafka import KafkaBus
from tests.fakes.waiting import wait_until
from tests.integration.bus.helpers import call_event

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


@pytest.mark.kafka
async def test_quiet_topic_record_is_delivered_without_waiting_out_the_fetch(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    # Control and task consumers fetch from 1 byte: a record ends the broker's wait at once, so a long
    # idle wait (cheap when nothing happens) never delays a weight update. Batched topics instead
    # wait for 16 KiB or their max wait: the quiet wait here is 10 s, which would hold it that long.
    async with KafkaBus(kafka_bootstrap, prefix=topic_prefix, quiet_fetch_max_wait_ms=10_000) as bus:
        assert bus.fetch_params(s.CONTROL) == (1, 10_000)
        assert bus.fetch_params(s.EPISODES) == (bus.fetch_min_bytes, bus.fetch_max_wait_ms)
        got: list[float] = []
        loop = asyncio.get_running_loop()

        async def handler(msg: Message) -> None:
            got.append(loop.time())

        await bus.subscribe(s.CONTROL, "quiet", handler, from_beginning=False)
        await asyncio.sleep(0.5)  # the consumer's first fetch is now waiting at the broker
        sent = loop.time()
        await bus.publish(s.CONTROL, s.WeightUpdateRequested(model="policy", version=1))
        await wait_until(lambda: bool(got), within_s=8.0, what="the control record")
        assert got[0] - sent < 5.0, got[0] - sent

"""Issue 21, finding 3, and the fault suite's poison run: poison of every kind on every topic.

Each topic gets a good event, then every kind of poison (control bytes, a message at the broker's
size limit, invalid UTF-8, not JSON, an unknown type, an event of another topic, an event its handler
always fails on), then another good event. Every consumer must move on (both good events arrive),
every poison message must be dead-lettered once per group with its original bytes (or a digest and a
cut past the broker's limit), and nothing may be retried forever. On Kafka before the fix the ~200 KB
control-byte message became a >1 MB dead letter the broker refused, and the partition stood still.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections import Counter
from pathlib import Path

import pytest

import schemas as s
from infra.bus import Bus, Message
from infra.bus.deadletter import MAX_DEAD_LETTER_BYTES
from tests.fakes.waiting import wait_until
from tests.faults.procs import Figures
from tests.fixtures.events import sample_events

pytestmark = pytest.mark.timeout(120)
# Kafka's default record limit is 1 MiB (producer max.request.size 1,048,576): a value just under it,
# leaving room for the key and the record's own overhead, is "at the broker's limit".
AT_LIMIT = 1_048_576 - 1_024
POISON_KINDS: dict[str, bytes] = {
    "control-bytes-200k": bytes(range(32)) * (200_000 // 32),
    "at-broker-limit": b"\x00" * AT_LIMIT,
    "invalid-utf8": b"\xff\xfe\xfd" * 1000,
    "not-json": b"this is not json",
    "unknown-type": b'{"type": "no_such_event"}',
}
FAILS = "fails-in-handler"


def _fits(topic: str, event: s.AnyEvent) -> bool:
    """Whether ``topic`` carries ``event`` (the changelog flywheel.reward-state carries episode events)."""
    try:
        s.decode(topic, s.encode(event))
    except s.EventDecodeError:
        return False
    return True


def _good(topic: str, n: int) -> s.AnyEvent:
    event = next(e for e in sample_events() if _fits(topic, e))
    return event.model_copy(update={"event_id": f"good-{topic}-{n}", "producer": "poison-test"})


def _other_topic(topic: str) -> bytes:
    other = next(e for e in sample_events() if not _fits(topic, e))
    return s.encode(other)


@pytest.fixture
async def poison_bus(make_bus, tmp_path: Path) -> Bus:  # type: ignore[no-untyped-def]
    bus: Bus = await make_bus(park_path=tmp_path / "parked.jsonl")
    return bus


async def test_poison_of_every_kind_on_every_topic(poison_bus: Bus, tmp_path: Path) -> None:
    bus = poison_bus
    topics = [t for t in s.TOPICS if t != s.DEADLETTER]
    await bus.ensure_topics(list(s.TOPICS))
    got: dict[str, list[str]] = {t: [] for t in [*topics, s.DEADLETTER]}
    letters: list[s.DeadLetter] = []

    def handler_for(topic: str):  # type: ignore[no-untyped-def]
        async def handle(message: Message) -> None:
            if message.event.producer == FAILS:
                raise RuntimeError("this event always fails")
            got[topic].append(message.event.event_id)

        return handle

    async def on_dead(message: Message) -> None:
        assert isinstance(message.event, s.DeadLetter)
        letters.append(message.event)

    await bus.subscribe(s.DEADLETTER, "poison-dl-reader", on_dead)
    for topic in topics:
        await bus.subscribe(topic, f"poison-{topic}", handler_for(topic), max_retries=1)
    started = time.monotonic()
    sent: dict[str, bytes] = {}
    for topic in topics:
        key = f"key-{topic}"
        await bus.publish(topic, _good(topic, 1), key=key)
        for kind, raw in {**POISON_KINDS, "event-of-another-topic": _other_topic(topic)}.items():
            await bus.publish_raw(topic, raw, key=key)
            sent[f"{topic}/{kind}"] = raw
        failing = _good(topic, 99).model_copy(update={"producer": FAILS})
        await bus.publish(topic, failing, key=key)
        sent[f"{topic}/{FAILS}"] = s.encode(failing)
        await bus.publish(topic, _good(topic, 2), key=key)
    # a poison message on the dead-letter topic itself is skipped by its reader, not looped on
    await bus.publish_raw(s.DEADLETTER, POISON_KINDS["control-bytes-200k"], key="dl")

    def moved_on() -> bool:
        return all(got[t][-1:] == [f"good-{t}-2"] for t in topics) and len(letters) >= len(sent)

    await wait_until(moved_on, 90, "every consumer past its poison and every poison dead-lettered")
    recover_s = time.monotonic() - started
    for topic in topics:
        assert got[topic] == [f"good-{topic}-1", f"good-{topic}-2"], (topic, got[topic])
    by_origin = Counter(letter.original_topic for letter in letters)
    assert by_origin == {t: len(POISON_KINDS) + 2 for t in topics}, by_origin
    digests = {hashlib.sha256(raw).hexdigest(): raw for raw in sent.values()}
    for letter in letters:
        raw = digests[letter.payload_sha256]  # the digest of the whole original
        assert letter.payload_size == len(raw)
        assert len(s.encode(letter)) <= MAX_DEAD_LETTER_BYTES
        if letter.payload_base64:
            kept = base64.b64decode(letter.payload_base64)
            assert raw.startswith(kept) and (letter.payload_truncated == (len(kept) < len(raw)))
        else:
            assert letter.payload.encode() == raw and not letter.payload_truncated
    assert any(letter.payload_truncated for letter in letters)  # the one at the broker's limit
    assert not (tmp_path / "parked.jsonl").exists()  # the bus took every dead letter
    Figures(
        f"poison_{type(bus).__name__}",
        calls=len(sent),
        ok=sum(len(v) for v in got.values()),
        lost=0,
        duplicates=len(letters) - len(sent),
        recover_s=round(recover_s, 2),
        extra={"dead_letters": len(letters)},
    ).report()


@pytest.mark.kafka
async def test_a_dead_letter_the_broker_refuses_is_parked_and_the_consumer_moves_on(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """The dead-letter topic accepts no record over 2 KB: the letter is retried, then parked in the
    local file (one JSON line), the poison's offset committed, and the consumer carries on."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from infra.bus.kafka import KafkaBus

    dl_topic = f"{topic_prefix}{s.DEADLETTER}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(dl_topic, 1, 1, topic_configs={"max.message.bytes": "2048"})])
    finally:
        await admin.close()
    parked = tmp_path / "parked.jsonl"
    bus = KafkaBus(kafka_bootstrap, prefix=topic_prefix, park_path=parked, retry_backoff_s=0.01)
    await bus.start()
    try:
        got: list[str] = []

        async def handle(message: Message) -> None:
            got.append(message.event.event_id)

        await bus.subscribe(s.EPISODES, "park-test", handle)
        key = "park-key"
        await bus.publish(s.EPISODES, _good(s.EPISODES, 1), key=key)
        await bus.publish_raw(s.EPISODES, POISON_KINDS["control-bytes-200k"], key=key)
        await bus.publish(s.EPISODES, _good(s.EPISODES, 2), key=key)
        await wait_until(lambda: len(got) >= 2, 60, "the consumer past the poison")
        assert got == [f"good-{s.EPISODES}-1", f"good-{s.EPISODES}-2"]
        assert bus.parking.parked == 1 and bus.parking.published == 0
        (line,) = parked.read_bytes().splitlines()
        letter = s.decode(s.DEADLETTER, line)
        assert isinstance(letter, s.DeadLetter)
        assert letter.payload_sha256 == hashlib.sha256(POISON_KINDS["control-bytes-200k"]).hexdigest()
        assert base64.b64decode(letter.payload_base64) == POISON_KINDS["control-bytes-200k"]
        # committed: a new member of the group starts after the poison, not on it
        assert await bus.lag(s.EPISODES, "park-test") == 0
    finally:
        await bus.stop()

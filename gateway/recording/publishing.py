"""Durable publishing: the bus first, a local SQLite spool when the bus cannot take the event.

``Recorder.record(event)`` returns only once the event is durable in one of the two places; if neither
works it raises :class:`RecordingError` (the agent gets a 503, never a success for an unrecorded call).
While the spool holds events, new events are appended behind them so per-episode order is kept; a
background task drains the spool to the bus, oldest first, when the bus is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

from gateway.errors import RecordingError
from infra.bus.base import Bus, BusError
from infra.journal import Journal
from infra.logging import get_logger
from schemas import AnyEvent, decode_any, encode, key_for, topic_for

log = get_logger("gateway.publishing")


DRAIN_BATCH = 500  # spooled rows read, sent and deleted at a time
SPOOL_VERSION = 1  # the spool table's schema (infra/journal.py)
_TABLES = (
    "CREATE TABLE IF NOT EXISTS spool (seq INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL,"
    " key TEXT NOT NULL, data BLOB NOT NULL)",
)


class Spool:
    """An append-only SQLite queue (``durability="full"``: each append is fsync'd before it returns)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._journal = Journal(path, tables=_TABLES, version=SPOOL_VERSION, durability="full")
        self.depth = self.count()

    def count(self) -> int:
        return int(self._journal.query("SELECT count(*) FROM spool")[0][0])

    def append(self, topic: str, key: str, data: bytes) -> None:
        with self._journal.lock:
            self._journal.execute("INSERT INTO spool (topic, key, data) VALUES (?, ?, ?)", (topic, key, data))
            self.depth += 1

    def peek(self, limit: int = 100) -> list[tuple[int, str, str, bytes]]:
        rows = self._journal.query("SELECT seq, topic, key, data FROM spool ORDER BY seq LIMIT ?", (limit,))
        return [(int(r[0]), str(r[1]), str(r[2]), bytes(r[3])) for r in rows]

    def all_rows(self) -> list[tuple[str, bytes]]:
        """Every spooled (topic, data), oldest first (read once at start)."""
        rows = self._journal.query("SELECT topic, data FROM spool ORDER BY seq")
        return [(str(r[0]), bytes(r[1])) for r in rows]

    def remove(self, seq: int) -> None:
        self.remove_many([seq])

    def remove_many(self, seqs: list[int]) -> None:
        """Delete ``seqs`` in one transaction (one fsync, not one per row)."""
        with self._journal.lock:
            self.depth -= self._journal.delete_many("spool", "seq", seqs)

    def close(self) -> None:
        self._journal.close()


class Recorder:
    def __init__(
        self,
        bus: Bus,
        spool: Spool,
        *,
        retry_s: float = 0.5,
    ) -> None:
        # No timeout of its own around a publish: Bus.publish is bounded by the bus (publish_timeout_s).
        self.bus = bus
        self.spool = spool
        self.retry_s = retry_s
        self._wake = asyncio.Event()
        self._drainer: asyncio.Task[None] | None = None
        self._spool_lock = asyncio.Lock()

    @property
    def spool_depth(self) -> int:
        return self.spool.depth

    async def record(self, event: AnyEvent) -> None:
        """Make ``event`` durable (bus ack, else the spool); raises :class:`RecordingError` if neither."""
        topic, key = topic_for(event), key_for(event)
        if self.spool.depth == 0:
            try:
                await self.bus.publish(topic, event, key=key)
                return
            except (BusError, TimeoutError, OSError) as exc:
                log.warning("bus publish failed; spooling", error=type(exc).__name__, topic=topic)
        await self._to_spool(topic, key, encode(event))

    async def _to_spool(self, topic: str, key: str, data: bytes) -> None:
        try:
            async with self._spool_lock:
                await asyncio.to_thread(self.spool.append, topic, key, data)
        except (sqlite3.Error, OSError) as exc:
            raise RecordingError(
                "the call could not be recorded (bus and spool unavailable)", code="recording_failed"
            ) from exc
        self._wake.set()

    def start(self) -> None:
        if self._drainer is None:
            self._drainer = asyncio.create_task(self._drain_forever(), name="gateway-spool-drain")
            if self.spool.depth:
                self._wake.set()

    async def stop(self) -> None:
        if self._drainer is not None:
            self._drainer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drainer
            self._drainer = None

    async def drain_once(self) -> int:
        """Publish spooled events until the spool is empty or the bus fails; returns how many were sent.

        Oldest first per key (an episode's events stay in their order, as its partition needs), keys
        side by side: one acknowledgement at a time for the whole spool drained slower than eight
        agents refill it while it is not empty (every new event queues behind it), so after a broker
        outage under load the spool never emptied (tests/faults/test_broker_kill.py). Sent rows are
        deleted in one transaction per batch; a row sent but not yet deleted when the process dies is
        sent again, and consumers drop the duplicate by ``event_id``.
        """
        sent = 0
        while True:
            rows = await asyncio.to_thread(self.spool.peek, DRAIN_BATCH)
            if not rows:
                self.spool.depth = await asyncio.to_thread(self.spool.count)  # another process may share it
                return sent
            chains: dict[tuple[str, str], list[tuple[int, str, str, bytes]]] = {}
            for row in rows:
                chains.setdefault((row[1], row[2]), []).append(row)
            done: list[int] = []
            results = await asyncio.gather(
                *(self._publish_in_order(chain, done) for chain in chains.values()), return_exceptions=True
            )
            await asyncio.to_thread(self.spool.remove_many, done)
            sent += len(done)
            for result in results:
                if isinstance(result, BaseException):
                    raise result

    async def _publish_in_order(self, chain: list[tuple[int, str, str, bytes]], done: list[int]) -> None:
        for seq, topic, key, data in chain:
            await self.bus.publish(topic, decode_any(data), key=key)
            done.append(seq)

    async def _drain_forever(self) -> None:
        delay = self.retry_s
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                sent = await self.drain_once()
                if sent:
                    log.info("spool drained", events=sent)
                delay = self.retry_s
            # the drainer must outlive anything the bus raises, or the spool only grows
            except Exception as exc:
                if isinstance(exc, BusError | TimeoutError | OSError):
                    log.debug("spool drain waiting for the bus", error=type(exc).__name__)
                else:
                    log.warning("spool drain failed; retrying", error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                self._wake.set()

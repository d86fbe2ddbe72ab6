"""The bus: one small interface, two implementations (in-process and Kafka).

Semantics both implementations keep (docs/architecture.md, "Two runtimes, one code path"):
- ``publish`` returns once the bus has accepted the event durably (Kafka: acks=all) and never runs a
  subscriber's code inline.
- The key decides the partition; per-key order is preserved; every consumer group sees every event;
  within a group each partition is handled by one consumer at a time.
- A handler's offset is committed only after the handler returned. A handler that raises is retried
  (``max_retries``), then the message goes to ``flywheel.deadletter`` with the error and the consumer
  moves on. A message that cannot be decoded goes to the dead-letter topic at once.

Exceptions:
    BusError
     ├── BusClosedError        publish/subscribe on a bus that is not running
     └── BusUnavailableError   the broker cannot be reached (the gateway spools on this one)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from schemas import AnyEvent


class Message(NamedTuple):
    """One delivered event with where it came from (logical topic name, no prefix). Immutable.

    ``raw``: the record's bytes as read from the broker, when a bus keeps them (the event's JSON, so
    a consumer that stores events, such as the recorder, need not serialise them again); ``None`` on
    the in-process bus, which carries the objects themselves.

    A named tuple rather than a frozen dataclass: a bus builds one per delivery, and a frozen
    dataclass's ``__init__`` (one ``object.__setattr__`` per field) cost ~1.5 µs of the in-process
    bus's ~4 µs per event; a named tuple is built in ~0.2 µs (see ``new_message``).
    """

    event: AnyEvent
    topic: str
    partition: int
    offset: int
    key: str
    raw: bytes | None = None


_tuple_new = tuple.__new__


def new_message(
    event: AnyEvent, topic: str, partition: int, offset: int, key: str, raw: bytes | None = None
) -> Message:
    """``Message(...)`` without the generated ``__new__``'s Python frame (the buses' hot path)."""
    return _tuple_new(Message, (event, topic, partition, offset, key, raw))


Handler = Callable[[Message], Awaitable[None]]
BatchHandler = Callable[[Sequence[Message]], Awaitable[None]]
Assigned = Callable[[frozenset[int]], Awaitable[None]]
"""Told the partitions a subscriber holds after each rebalance, before it is handed their records."""


class BusError(Exception):
    pass


class BusClosedError(BusError):
    pass


class BusUnavailableError(BusError):
    pass


@runtime_checkable
class Subscription(Protocol):
    topic: str
    group: str

    async def stop(self) -> None:
        """Stop consuming; in-flight handlers finish and their offsets are committed."""


@runtime_checkable
class Bus(Protocol):
    """What services receive. Topic names are logical (``schemas.TASKS``, ...); the bus adds its prefix."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def ensure_topics(self, topics: Sequence[str]) -> None:
        """Create topics (with their partition counts from ``schemas.TOPICS``) if missing."""

    async def list_topics(self) -> list[str]:
        """Logical names of the topics that exist under this bus's prefix."""

    async def lag(self, topic: str, group: str) -> int:
        """Messages of ``topic`` that consumer group ``group`` has not committed yet."""

    async def publish(self, topic: str, event: AnyEvent, *, key: str | None = None) -> None:
        """Publish and wait for the broker's acknowledgement. ``key`` defaults to ``schemas.key_for``.

        Bounded: returns or raises :class:`BusError` within the bus's ``publish_timeout_s`` (no
        acknowledgement, no room in a full backlog), so callers need no timer of their own around it.
        """

    async def publish_raw(self, topic: str, data: bytes, *, key: str) -> None:
        """Publish undecoded bytes (tests of bad input; replaying raw records)."""

    async def subscribe(
        self,
        topic: str,
        group: str,
        handler: Handler,
        *,
        from_beginning: bool = True,
        max_retries: int = 2,
    ) -> Subscription:
        """Consume ``topic`` as consumer group ``group``, one message at a time per partition."""

    async def subscribe_batch(
        self,
        topic: str,
        group: str,
        handler: BatchHandler,
        *,
        max_batch: int = 500,
        max_wait_s: float = 0.2,
        from_beginning: bool = True,
        max_retries: int = 2,
        on_assigned: Assigned | None = None,
    ) -> Subscription:
        """Consume in batches of up to ``max_batch``; a batch is committed after the handler returned.

        A batch waits up to ``max_wait_s`` after its first message for more, except right after a full
        batch: the rest of a backlog is delivered at once.

        When a batch handler raises, the batch is retried; after ``max_retries`` each message is
        retried alone so only the poison ones go to the dead-letter topic.

        ``on_assigned`` (a stateful consumer's hook) is awaited with the partitions this subscriber
        holds whenever they change (the first assignment included), once the partitions' previous
        holder committed its last block and before any of their records is handed over.
        """

    async def read_partitions(self, topic: str, partitions: Sequence[int]) -> dict[int, list[Message]]:
        """Every record retained in ``partitions`` of ``topic``, from the start of each to its end as of
        the call (no consumer group; a changelog's restore). Records that do not decode are left out."""

"""The tests' event collector: subscribe to topics on a bus, then await the events a test expects.

events = await Collector().attach(bus, CONTROL, group="my-test")
(drained,) = await events.wait_for(lambda e: isinstance(e, InferenceDrained))
...
await events.stop()
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from infra.bus.base import Bus, Message, Subscription
from schemas import AnyEvent


class Collector:
    """Subscribes to topics (its own consumer group) and lets a test await the events it expects."""

    def __init__(self) -> None:
        self.events: list[AnyEvent] = []
        self._changed = asyncio.Condition()
        self._subs: list[Subscription] = []

    async def attach(self, bus: Bus, *topics: str, group: str = "test-collector") -> Collector:
        """Subscribe to each topic from its beginning, as consumer group ``{group}.{topic}``."""
        for topic in topics:
            self._subs.append(await bus.subscribe(topic, f"{group}.{topic}", self._on, from_beginning=True))
        return self

    async def _on(self, msg: Message) -> None:
        async with self._changed:
            self.events.append(msg.event)
            self._changed.notify_all()

    def of(self, kind: type[Any]) -> list[Any]:
        """The events collected so far that are instances of ``kind``."""
        return [e for e in self.events if isinstance(e, kind)]

    async def wait_for(
        self, pred: Callable[[AnyEvent], bool], within_s: float = 5.0, count: int = 1
    ) -> list[Any]:
        """Return every collected event matching ``pred`` once there are ``count`` of them."""

        async def _wait() -> list[Any]:
            async with self._changed:
                while True:
                    got = [e for e in self.events if pred(e)]
                    if len(got) >= count:
                        return got
                    await self._changed.wait()

        return await asyncio.wait_for(_wait(), within_s)

    async def stop(self) -> None:
        """Stop every subscription."""
        for sub in self._subs:
            await sub.stop()


__all__ = ["Collector"]

"""A tiny event collector for worker and reward tests: subscribe, then await what you expect."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from infra.bus.base import Bus, Message, Subscription
from schemas import AnyEvent


class Events:
    def __init__(self) -> None:
        self.items: list[AnyEvent] = []
        self._cond = asyncio.Condition()
        self._subs: list[Subscription] = []

    async def attach(self, bus: Bus, *topics: str, group: str = "test-events") -> Events:
        for topic in topics:
            self._subs.append(await bus.subscribe(topic, f"{group}.{topic}", self._on))
        return self

    async def _on(self, msg: Message) -> None:
        async with self._cond:
            self.items.append(msg.event)
            self._cond.notify_all()

    def of(self, kind: type[Any], **match: Any) -> list[Any]:
        return [
            e for e in self.items if isinstance(e, kind) and all(getattr(e, k) == v for k, v in match.items())
        ]

    async def wait(self, pred: Callable[[Any], bool], count: int = 1, within_s: float = 10.0) -> list[Any]:
        async def _wait() -> list[Any]:
            async with self._cond:
                while True:
                    got = [e for e in self.items if pred(e)]
                    if len(got) >= count:
                        return got
                    await self._cond.wait()

        return await asyncio.wait_for(_wait(), within_s)

    async def wait_for(
        self, kind: type[Any], count: int = 1, within_s: float = 10.0, **match: Any
    ) -> list[Any]:
        return await self.wait(
            lambda e: isinstance(e, kind) and all(getattr(e, k) == v for k, v in match.items()),
            count,
            within_s,
        )

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.stop()

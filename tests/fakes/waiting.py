"""The tests' one wait-until helper: poll a condition that has no event of its own, under a deadline.

    await wait_until(lambda: recorder.stats.events >= 8, within_s=30, what="the recorder")
    await wait_until(lambda: bus.lag(topic, group), what="no lag")   # a predicate may be async

Prefer awaiting a real event (``Collector.wait_for``, an ``asyncio.Event``); poll only in-process
state that offers none (counters, a uvicorn server's ``started``, a spool's depth, ClickHouse rows).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    within_s: float = 10.0,
    what: str = "condition",
    interval_s: float = 0.01,
) -> None:
    """Return once ``predicate()`` holds (awaited if it is a coroutine function), checking every ``interval_s``.

    Raises ``AssertionError("timed out after {within_s}s waiting for {what}")`` once ``within_s`` has
    passed; the event loop keeps running between checks.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        held = predicate()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {within_s}s waiting for {what}")
        await asyncio.sleep(interval_s)


__all__ = ["wait_until"]

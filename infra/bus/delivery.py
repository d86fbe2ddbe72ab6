"""The one delivery policy of both buses: retry with backoff, then dead-letter; in a failing batch,
find the poison message.

* one message: the handler is called up to ``1 + max_retries`` times, ``backoff(n)`` apart
  (``base · 2^(n-1)``, capped); if it still raises, the message is dead-lettered
  (``infra.bus.deadletter.deliver``: on the topic, else parked in a local file) and the consumer moves
  on. A message that cannot be decoded is dead-lettered at once (no handler can take it).
* a batch: the batch handler gets the same retries; if it still raises, every message of the batch is
  delivered alone with its own retries, so the poison ones are dead-lettered and the rest are handled.

The consumer loop both buses share (``infra.bus.consumer``) calls these; only how records are fetched
and committed differs between the buses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int
    backoff_s: float
    max_backoff_s: float = 2.0

    def backoff(self, attempt: int) -> float:
        return float(min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s))


async def deliver_one(
    handle: Callable[[], Awaitable[object]],
    policy: RetryPolicy,
    dead_letter: Callable[[BaseException, int], Awaitable[None]],
    *,
    failed_once: bool = False,
) -> None:
    """``handle()`` until it succeeds or its retries are spent, then ``dead_letter(error, attempts)``.

    ``failed_once``: the caller already made the first attempt (a hot path without bookkeeping).
    """
    attempts = 0
    if failed_once:
        attempts = 1
        await asyncio.sleep(policy.backoff(1))
    while True:
        attempts += 1
        try:
            await handle()
            return
        except Exception as exc:
            if attempts > policy.max_retries:
                await dead_letter(exc, attempts)
                return
            await asyncio.sleep(policy.backoff(attempts))


async def deliver_batch(
    handle: Callable[[], Awaitable[object]],
    policy: RetryPolicy,
    one_by_one: Callable[[], Awaitable[None]],
) -> None:
    """``handle()`` (the whole batch) with the same retries; then ``one_by_one()`` to find the poison."""
    attempts = 0
    while True:
        attempts += 1
        try:
            await handle()
            return
        except Exception:
            if attempts > policy.max_retries:
                await one_by_one()
                return
            await asyncio.sleep(policy.backoff(attempts))

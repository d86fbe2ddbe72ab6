"""The delivery policy both buses share (``infra.bus.delivery``); each bus's own suite runs it for real."""

from __future__ import annotations

import pytest

from infra.bus.delivery import RetryPolicy, deliver_batch, deliver_one

pytestmark = pytest.mark.timeout(10)
POLICY = RetryPolicy(max_retries=2, backoff_s=0.0)


def test_backoff_doubles_up_to_its_cap() -> None:
    policy = RetryPolicy(max_retries=5, backoff_s=0.1, max_backoff_s=0.3)
    assert [policy.backoff(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.3, 0.3]


async def test_a_handler_that_keeps_failing_is_retried_then_dead_lettered() -> None:
    calls: list[int] = []
    dead: list[tuple[str, int]] = []

    async def handle() -> None:
        calls.append(1)
        raise ValueError("poison")

    async def dead_letter(exc: BaseException, attempts: int) -> None:
        dead.append((str(exc), attempts))

    await deliver_one(handle, POLICY, dead_letter)
    assert len(calls) == 3 and dead == [("poison", 3)]  # 1 + max_retries attempts
    calls.clear()
    dead.clear()
    await deliver_one(handle, POLICY, dead_letter, failed_once=True)  # the caller made the first try
    assert len(calls) == 2 and dead == [("poison", 3)]


async def test_a_handler_that_recovers_is_not_dead_lettered() -> None:
    calls: list[int] = []

    async def handle() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("flaky")

    async def dead_letter(exc: BaseException, attempts: int) -> None:
        raise AssertionError("dead-lettered a message that was handled")

    await deliver_one(handle, POLICY, dead_letter)
    assert len(calls) == 3


async def test_a_failing_batch_is_retried_then_delivered_one_by_one() -> None:
    batches: list[int] = []
    alone: list[int] = []

    async def handle() -> None:
        batches.append(1)
        raise ValueError("one of them is poison")

    async def one_by_one() -> None:
        alone.append(1)

    await deliver_batch(handle, POLICY, one_by_one)
    assert len(batches) == 3 and alone == [1]

    async def good() -> None:
        batches.append(2)

    batches.clear()
    alone.clear()
    await deliver_batch(good, POLICY, one_by_one)
    assert batches == [2] and alone == []

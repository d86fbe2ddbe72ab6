"""Streaming helpers: incremental text deltas, per-choice grouping, and merging request streams."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from infra.engine.outputs import ChoiceResult, RequestUpdate, TokenEvent
from infra.engine.sampling import SamplingParams

JSON = dict[str, Any]


def sse(payload: JSON | str) -> str:
    body = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {body}\n\n"


class TextDelta:
    """Incremental detokenisation for streaming: never sends text a later stop string would cut off."""

    def __init__(self, tokenizer: Any, params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.skip = params.skip_special_tokens
        self.hold = max((len(s) for s in params.stop), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0

    def push(self, ids: list[int], done: ChoiceResult | None) -> str:
        self.ids.extend(ids)
        if done is not None:
            text = done.text  # the engine's final text, already cut at the stop string
        else:
            text = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip)
            text = text.rstrip("\ufffd")  # an incomplete UTF-8 character waits for its next byte
            text = text[: max(len(text) - self.hold, 0)]
        delta = text[self.sent :]
        self.sent = max(self.sent, len(text))
        return delta


def usage(prompt_tokens: int, completion_tokens: int) -> JSON:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": None,
    }


def by_choice(update: RequestUpdate) -> list[tuple[int, list[TokenEvent], ChoiceResult | None]]:
    by: dict[int, list[TokenEvent]] = {}
    for t in update.tokens:
        by.setdefault(t.index, []).append(t)
    done = {c.index: c for c in update.finished}
    return [(i, by.get(i, []), done.get(i)) for i in sorted(set(by) | set(done))]


async def prime(stream: AsyncIterator[RequestUpdate]) -> RequestUpdate | None:
    """Pull the first update before the HTTP response starts, so engine errors become a 4xx/5xx."""
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return None


async def chain(
    first: RequestUpdate | None, rest: AsyncIterator[RequestUpdate]
) -> AsyncIterator[RequestUpdate]:
    if first is not None:
        yield first
    async for update in rest:
        yield update


async def merge(streams: Sequence[AsyncIterator[RequestUpdate]]) -> AsyncIterator[tuple[int, RequestUpdate]]:
    """Interleave several request streams as their updates arrive (a completions batch)."""
    queue: asyncio.Queue[tuple[int, RequestUpdate | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[RequestUpdate]) -> None:
        try:
            async for update in stream:
                queue.put_nowait((i, update))
        except BaseException as exc:  # forwarded to the consumer, which re-raises it
            queue.put_nowait((i, exc))
        finally:
            queue.put_nowait((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()

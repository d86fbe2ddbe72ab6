"""The order and numbers of an episode's calls, whichever gateways served them.

A gateway numbers an episode's calls (``call_seq``) from the calls it has seen. One gateway numbers
them in the order it served them (with a gap after a restart: gateway/episodes/seqs.py), and the numbers
are the order. Gateways admitting one episode by signed ticket see only their own calls, so two of them
number it independently: 0, 0, 1, 1 when its calls alternate between them, 0, 1, 0, 1 when it moves to
the other halfway. So when an episode's numbers are not distinct, the calls say the order themselves:

- a call whose prompt ids extend another call's prompt + completion ids (one of its choices) comes after
  it: that is the conversation (the extension property ``transitions.py`` merges on);
- calls recorded by one gateway (``producer``) that numbered them distinctly keep its order;
- among the calls these allow next, the one that started first (``started_at``, else ``emitted_at``)
  comes first, then the smaller ``(call_seq, producer, event_id)``. The time first: two gateways'
  numbers are two counters, and say nothing of which call came first. A cycle (ids that extend by
  coincidence) is broken the same way.

Then they are numbered 0..n-1 in that order: the ``call_seq`` of the calls that ``ordered_calls`` gives
the scorers and the transitions, and the number a per-call reward's ``call_seq`` names (an agent's own
count of its calls, 0, 1, 2, ...). Distinct numbers are kept as recorded (gaps included): exactly the
order and numbers of a single gateway.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import pairwise

from schemas import LLMCallRecorded


def reused(calls: Sequence[LLMCallRecorded]) -> int:
    """How many of ``calls`` carry a ``call_seq`` that another of them carries too."""
    return len(calls) - len({c.call_seq for c in calls})


def order(calls: Sequence[LLMCallRecorded]) -> list[LLMCallRecorded]:
    """``calls`` (one episode's, distinct ``call_id``) in the episode's order (the module docstring)."""
    if not reused(calls):
        return sorted(calls, key=lambda c: c.call_seq)
    before = _constraints(calls)
    key = [_tie(c) for c in calls]
    left = sorted(range(len(calls)), key=lambda i: key[i])
    placed: set[int] = set()
    out: list[LLMCallRecorded] = []
    while left:
        pick = next((i for i in left if before[i] <= placed), left[0])  # none free: a cycle, broken
        left.remove(pick)
        placed.add(pick)
        out.append(calls[pick])
    return out


def number(ordered: Sequence[LLMCallRecorded]) -> list[LLMCallRecorded]:
    """The calls with their number in the episode: as recorded when distinct and increasing, else 0..n-1."""
    seqs = [c.call_seq for c in ordered]
    if all(a < b for a, b in pairwise(seqs)):
        return list(ordered)
    return [c if c.call_seq == n else c.model_copy(update={"call_seq": n}) for n, c in enumerate(ordered)]


def _constraints(calls: Sequence[LLMCallRecorded]) -> list[set[int]]:
    """``before[i]``: the calls that must come before call ``i``."""
    before: list[set[int]] = [set() for _ in calls]
    by_producer: dict[str, list[int]] = {}
    for i, call in enumerate(calls):
        by_producer.setdefault(call.producer, []).append(i)
    for members in by_producer.values():
        if reused([calls[i] for i in members]):
            continue  # two gateways under one id: its numbers are no order
        for i in members:
            before[i].update(j for j in members if calls[j].call_seq < calls[i].call_seq)
    prompts = [_prompt(c) for c in calls]
    ends = [_ends(c) for c in calls]
    for i, prompt in enumerate(prompts):
        if prompt is None:
            continue
        for j, full in enumerate(ends):
            if j != i and any(_extends(prompt, f) for f in full):
                before[i].add(j)
    return before


def _tie(call: LLMCallRecorded) -> tuple[datetime, int, str, str]:
    at = call.started_at or call.emitted_at
    at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)  # a naive time is UTC (one sort)
    return (at, call.call_seq, call.producer, call.event_id)


def _prompt(call: LLMCallRecorded) -> list[int] | None:
    if call.prompt_token_ids is not None:
        return call.prompt_token_ids
    return call.choices[0].prompt_token_ids if call.choices else None


def _ends(call: LLMCallRecorded) -> list[list[int]]:
    """Each choice's prompt + generated ids: what a call continuing it starts with."""
    out = []
    for choice in call.choices:
        prompt = choice.prompt_token_ids if choice.prompt_token_ids is not None else call.prompt_token_ids
        if prompt is not None and choice.token_ids:
            out.append(prompt + choice.token_ids)
    return out


def _extends(prompt: list[int], full: list[int]) -> bool:
    n = len(full)
    return len(prompt) >= n and prompt[n - 1] == full[-1] and prompt[:n] == full

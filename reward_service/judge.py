"""An LLM judge, called like any OpenAI client would (through the gateway, so its calls are recorded).

Two modes (``ScorerSpec(name="judge", options={...})``):
- ``mode: "score"`` (default): the judge reads the task, the reference answer (if any) and the
  agent's answer and replies with a score; ``SCORE: x`` with x in [0, 1] (or 0–10, scaled) is parsed.
- ``mode: "rank"``: the service waits until every member of the group has finished (or the group
  timeout passes), then the judge ranks all answers at once (``RANKING: C > A > B``); the best gets
  1.0, the worst 0.0, linearly between.

Options: ``model``, ``criteria`` (extra instructions), ``max_tokens``, ``temperature``.
Errors (HTTP, unparseable reply) raise :class:`JudgeError`, a ``ScorerError``.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Sequence

import httpx

from reward_service.scorers import Score, ScorerError, predicted
from reward_service.state import EpisodeRecord
from schemas import ScorerSpec
from schemas.scorers import JudgeOptions


def _judge_options(spec: ScorerSpec) -> JudgeOptions:
    try:
        return spec.options_as(JudgeOptions)
    except ValueError as exc:
        raise ScorerError(str(exc)) from None


class JudgeError(ScorerError):
    pass


_SCORE = re.compile(r"SCORE\s*[:=]\s*([-+]?\d+(?:\.\d+)?)", re.IGNORECASE)
_RANK = re.compile(r"RANKING\s*[:=]\s*(.+)", re.IGNORECASE)


class Judge:
    def __init__(self, client: httpx.AsyncClient, *, model: str = "judge", timeout_s: float = 60.0) -> None:
        self.client = client  # base_url = an OpenAI-compatible /v1 (the gateway's)
        self.model = model
        self.timeout_s = timeout_s

    async def _ask(self, spec: ScorerSpec, prompt: str) -> str:
        options = _judge_options(spec)
        body = {
            "model": options.model or self.model,
            "messages": [
                {"role": "system", "content": "You are a strict, fair grader."},
                {"role": "user", "content": prompt},
            ],
            "max_tokens": options.max_tokens,
            "temperature": options.temperature,
        }
        try:
            resp = await self.client.post("chat/completions", json=body, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise JudgeError(f"judge: request failed: {type(exc).__name__}: {exc}") from exc
        if resp.status_code != 200:
            raise JudgeError(f"judge: HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            content = resp.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise JudgeError("judge: the reply is not a chat completion") from exc
        if not isinstance(content, str):
            raise JudgeError("judge: the reply has no text")
        return content

    async def score(self, record: EpisodeRecord, spec: ScorerSpec) -> Score:
        task = record.started.task if record.started is not None else None
        parts = [
            "Grade the answer to the task.",
            f"Task: {json.dumps(task.input) if task else '(unknown)'}",
        ]
        if task is not None and task.answer is not None:
            parts.append(f"Reference answer: {json.dumps(task.answer)}")
        parts.append(f"Answer: {predicted(record, spec) or '(no answer)'}")
        if criteria := _judge_options(spec).criteria:
            parts.append(f"Criteria: {criteria}")
        parts.append("Reply with one line 'SCORE: x' where x is between 0 and 1.")
        reply = await self._ask(spec, "\n".join(parts))
        match = _SCORE.search(reply)
        if match is None:
            raise JudgeError(f"judge: no 'SCORE: x' in the reply: {reply[:200]!r}")
        value = float(match.group(1))
        if value > 1.0:
            value = value / 10.0 if value <= 10.0 else 1.0
        return Score(max(0.0, min(1.0, value)), "judge")

    async def rank(self, records: Sequence[EpisodeRecord], spec: ScorerSpec) -> list[Score]:
        """Scores for ``records`` (same order) from one ranking of all of them."""
        if len(records) == 1:
            return [await self.score(records[0], spec)]
        labels = _labels(len(records))
        task = records[0].started.task if records[0].started is not None else None
        parts = [
            "Rank these answers to the same task from best to worst.",
            f"Task: {json.dumps(task.input) if task else '(unknown)'}",
        ]
        if task is not None and task.answer is not None:
            parts.append(f"Reference answer: {json.dumps(task.answer)}")
        for label, record in zip(labels, records, strict=True):
            parts.append(f"Answer {label}: {predicted(record, spec) or '(no answer)'}")
        if criteria := _judge_options(spec).criteria:
            parts.append(f"Criteria: {criteria}")
        parts.append(
            f"Reply with one line 'RANKING: ' followed by all {len(records)} labels, best first, "
            "separated by '>'."
        )
        reply = await self._ask(spec, "\n".join(parts))
        match = _RANK.search(reply)
        if match is None:
            raise JudgeError(f"judge: no 'RANKING:' in the reply: {reply[:200]!r}")
        order = [tok.strip() for tok in match.group(1).split(">")]
        if sorted(order) != sorted(labels):
            raise JudgeError(f"judge: the ranking does not list each answer once: {match.group(1)[:200]!r}")
        n = len(records) - 1
        by_label = {label: 1.0 - pos / n for pos, label in enumerate(order)}
        return [Score(by_label[label], "judge") for label in labels]


def _labels(n: int) -> list[str]:
    letters = string.ascii_uppercase
    return [letters[i] if n <= 26 else f"A{i + 1}" for i in range(n)]

"""Deciding an episode's reward: which scorer applies, and turning failures into recorded errors."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from reward_service.feedback import FeedbackMapping
from reward_service.judge import Judge
from reward_service.scorers import BUILTIN, Score, ScorerError, UnknownScorer, score_agent
from reward_service.state import EpisodeRecord
from schemas import EpisodeSource, ScorerSpec
from schemas.scorers import JudgeOptions


@dataclass(frozen=True, slots=True)
class Outcome:
    reward: float | None
    source: str
    error: str | None = None
    note: str = ""  # the scorer's reason in words (``Score.note``), published as ``score_note``


def scorer_for(record: EpisodeRecord, production_scorer: str) -> ScorerSpec | None:
    """The task's scorer; production sessions use the configured one (None: record unscored)."""
    task = record.started.task if record.started is not None else None
    if task is not None:
        return task.scorer
    if record.source is EpisodeSource.production:
        return None if production_scorer in ("", "none") else ScorerSpec(name=production_scorer)
    return ScorerSpec(name="agent")


def is_rank(spec: ScorerSpec | None) -> bool:
    return spec is not None and spec.name == "judge" and spec.options_as(JudgeOptions).mode == "rank"


class Scoring:
    def __init__(
        self,
        *,
        fill_value: float,
        production_scorer: str,
        feedback: FeedbackMapping,
        judge: Judge | None,
        timeout_s: float = 120.0,
    ) -> None:
        self.timeout_s = timeout_s  # a scorer past this is recorded as failed (a sync one keeps its thread)
        self.fill_value = fill_value
        self.production_scorer = production_scorer
        self.feedback = feedback
        self.judge = judge

    async def score(self, record: EpisodeRecord) -> Outcome:
        if record.source is EpisodeSource.production:
            value = self.feedback.episode_reward(record.rewards)
            if value is not None:
                return Outcome(value, "feedback")
        spec = scorer_for(record, self.production_scorer)
        if spec is None:
            return Outcome(None, "unscored")
        try:
            score = await asyncio.wait_for(self._run(record, spec), self.timeout_s)
        except TimeoutError:
            return Outcome(None, spec.name, f"scorer {spec.name} timed out after {self.timeout_s:g}s")
        except Exception as exc:  # any scorer failure is recorded on the episode, never dropped
            return Outcome(None, spec.name, f"{type(exc).__name__}: {exc}"[:4000])
        return Outcome(score.reward, score.source, note=score.note)

    async def _run(self, record: EpisodeRecord, spec: ScorerSpec) -> Score:
        if spec.name == "agent":
            return await score_agent(record, spec, self.fill_value)
        if spec.name == "judge":
            if self.judge is None:
                raise ScorerError("judge: no judge is configured")
            return await self.judge.score(record, spec)
        fn = BUILTIN.get(spec.name)
        if fn is None:
            raise UnknownScorer(f"unknown scorer {spec.name!r}")
        return await fn(record, spec)

    async def aclose(self) -> None:
        if self.judge is not None:
            await self.judge.client.aclose()

    async def rank(self, records: list[EpisodeRecord], spec: ScorerSpec) -> list[Outcome]:
        try:
            if self.judge is None:
                raise ScorerError("judge: no judge is configured")
            scores = await asyncio.wait_for(self.judge.rank(records, spec), self.timeout_s)
        except Exception as exc:  # the whole group is recorded as failed-to-score
            error = f"{type(exc).__name__}: {exc}"[:4000]
            return [Outcome(None, "judge", error) for _ in records]
        return [Outcome(s.reward, s.source) for s in scores]

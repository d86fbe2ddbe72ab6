"""Which recorded calls become transitions: selective training in a multi-agent program.

A program whose roles should not all learn (a frozen checker, a hosted model) marks them by the model
name each role asks for, or by its system prompt. ``--train-models writer,rewriter``
(``FLYWHEEL_TRAIN_MODELS``) keeps the calls whose requested model is listed;
``FLYWHEEL_TRAIN_SYSTEM_MATCH`` (a regular expression) keeps the calls whose first system message matches
it; with both set a call must pass both. The other calls stay in the event log as the episode's context
(counted in ``EpisodeScored.context_calls``) and never reach the trainer. Nothing set: every call trains.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from infra.policies import system_prompt
from schemas import LLMCallRecorded


@dataclass(frozen=True, slots=True)
class CallSelector:
    models: frozenset[str] = frozenset()
    system_match: re.Pattern[str] | None = None

    @classmethod
    def parse(cls, models: str = "", system_match: str = "") -> CallSelector:
        """From the settings' text; a bad pattern raises ``ValueError``."""
        names = frozenset(m.strip() for m in models.split(",") if m.strip())
        try:
            pattern = re.compile(system_match) if system_match else None
        except re.error as exc:
            raise ValueError(
                f"train_system_match {system_match!r} is not a regular expression: {exc}"
            ) from exc
        return cls(names, pattern)

    @property
    def selects_all(self) -> bool:
        return not self.models and self.system_match is None

    def selects(self, call: LLMCallRecorded) -> bool:
        if self.models and call.model not in self.models:
            return False
        if self.system_match is not None:
            system = system_prompt(call.request)
            return system is not None and self.system_match.search(system) is not None
        return True

    def split(self, calls: Sequence[LLMCallRecorded]) -> tuple[list[LLMCallRecorded], list[LLMCallRecorded]]:
        """``(train, context)`` in the calls' order."""
        if self.selects_all:
            return list(calls), []
        train: list[LLMCallRecorded] = []
        context: list[LLMCallRecorded] = []
        for call in calls:
            (train if self.selects(call) else context).append(call)
        return train, context

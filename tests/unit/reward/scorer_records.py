"""An episode record to score: a task with a gold answer, one call, a finished output."""

from __future__ import annotations

from pydantic import JsonValue

from reward_service.state import EpisodeRecord
from schemas import ScorerSpec
from tests.unit.reward.calls import call, finished, started


def sql_record(spec: ScorerSpec, output: JsonValue, gold: str, metadata: dict[str, str]) -> EpisodeRecord:
    rec = EpisodeRecord("e" * 32)
    rec.add(started("e" * 32, spec, answer=gold, metadata=metadata))
    rec.add(call("e" * 32, 0, [1], [2]))
    rec.add(finished("e" * 32, output, None))
    return rec

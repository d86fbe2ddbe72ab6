"""Events shared by the bus suite and the bus benchmark (waiting is ``tests.fakes.waiting``)."""

from __future__ import annotations

from datetime import UTC, datetime

import schemas as s

_T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def call_event(episode_id: str, seq: int, *, size: int = 2048) -> s.LLMCallRecorded:
    """An ``LLMCallRecorded`` of about ``size`` bytes of JSON (request text pads it)."""
    choice = s.CallChoice(
        index=0,
        text="CALC: 47+38",
        message={"role": "assistant", "content": "CALC: 47+38"},
        finish_reason="stop",
        token_ids=list(range(40)),
        logprobs=[-0.25] * 40,
        weight_versions=[1] * 40,
    )
    event = s.LLMCallRecorded(
        episode_id=episode_id,
        call_seq=seq,
        call_id=f"{episode_id[:8]}-{seq}",
        model="policy",
        request="",
        response='{"id":"x","choices":[]}',
        token_faithful=True,
        prompt_token_ids=list(range(60)),
        choices=[choice],
        weight_version=1,
        started_at=_T0,
        producer="bench",
    )
    pad = max(0, size - len(event.model_dump_json()) - 60)
    request = '{"model":"policy","messages":[{"role":"user","content":"' + "x" * pad + '"}]}'
    return event.model_copy(update={"request": request})

"""Synthetic episode events for reward tests (token ids shaped like the fake upstream's)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pydantic import JsonValue

from schemas import (
    CallChoice,
    EpisodeFinished,
    EpisodeSource,
    EpisodeStarted,
    EpisodeStatus,
    LLMCallRecorded,
    ScorerSpec,
    Task,
)


def call(
    ep: str,
    seq: int,
    prompt: list[int] | None,
    *responses: list[int] | None,
    version: int = 0,
    error: str | None = None,
    content: str = "",
    source: EpisodeSource = EpisodeSource.live,
) -> LLMCallRecorded:
    choices = [
        CallChoice(
            index=i,
            text=content,
            message={"role": "assistant", "content": content},
            token_ids=r,
            logprobs=[-0.5] * len(r) if r is not None else None,
        )
        for i, r in enumerate(responses)
    ]
    return LLMCallRecorded(
        episode_id=ep,
        call_seq=seq,
        call_id=f"{ep[:8]}-{seq}",
        request="{}",
        prompt_token_ids=prompt,
        choices=[] if error else choices,
        token_faithful=prompt is not None,
        weight_version=version,
        error=error,
        status_code=500 if error else 200,
        source=source,
    )


def started(
    ep: str,
    scorer: ScorerSpec | None = None,
    *,
    answer: JsonValue = None,
    group: str = "g",
    size: int = 1,
    idx: int = 0,
    deadline_s: float = 60.0,
    metadata: dict[str, str] | None = None,
) -> EpisodeStarted:
    task = Task(
        task_id="t", input={"q": "?"}, answer=answer, scorer=scorer or ScorerSpec(), metadata=metadata or {}
    )
    return EpisodeStarted(
        episode_id=ep,
        task=task,
        group_id=group,
        group_size=size,
        sample_index=idx,
        deadline_at=datetime.now(UTC) + timedelta(seconds=deadline_s),
    )


def finished(
    ep: str,
    output: JsonValue = None,
    reward: float | None = None,
    *,
    group: str = "g",
    idx: int = 0,
    status: EpisodeStatus = EpisodeStatus.ok,
    superseded: bool = False,
) -> EpisodeFinished:
    return EpisodeFinished(
        episode_id=ep,
        status=status,
        output=output,
        reported_reward=reward,
        group_id=group,
        task_id="t",
        sample_index=idx,
        superseded=superseded,
    )

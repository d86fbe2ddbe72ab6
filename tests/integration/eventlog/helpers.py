"""A small, fully known history of episodes for event-log tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import schemas as s

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def episode(
    *,
    index: int,
    group_id: str,
    task_id: str,
    tenant: str | None,
    at: datetime,
    calls: int,
    version: int,
    reward: float | None,
    source: s.EpisodeSource = s.EpisodeSource.live,
    status: s.EpisodeStatus = s.EpisodeStatus.ok,
) -> list[s.AnyEvent]:
    """Started, ``calls`` LLM calls, finished, scored; one second apart."""
    ep = f"{index:032x}"
    task = s.Task(task_id=task_id, input={"q": index})
    tick = iter(at + timedelta(seconds=i) for i in range(100))
    events: list[s.AnyEvent] = [
        s.EpisodeStarted(
            episode_id=ep, emitted_at=next(tick), task=task, group_id=group_id, tenant=tenant, source=source
        )
    ]
    for seq in range(calls):
        events.append(
            s.LLMCallRecorded(
                episode_id=ep,
                emitted_at=next(tick),
                call_seq=seq,
                call_id=f"{ep}-{seq}",
                tenant=tenant,
                source=source,
                request='{"messages":[]}',
                token_faithful=True,
                prompt_token_ids=[1, 2, 3 + seq],
                choices=[s.CallChoice(index=0, token_ids=[7, 8], logprobs=[-0.5, -0.25])],
                weight_version=version,
            )
        )
    events.append(
        s.EpisodeFinished(
            episode_id=ep, emitted_at=next(tick), status=status, task_id=task_id, group_id=group_id,
            tenant=tenant, source=source, num_calls=calls,
        )
    )  # fmt: skip
    transitions = [
        s.Transition(prompt_ids=[1], response_ids=[7, 8], response_mask=[1, 1], behaviour_logprobs=[-0.5, -0.25],
                     weight_version=version, call_seqs=[i], reward=reward or 0.0)
        for i in range(calls)
    ]  # fmt: skip
    events.append(
        s.EpisodeScored(
            episode_id=ep, emitted_at=next(tick), group_id=group_id, task_id=task_id, tenant=tenant,
            source=source, status=status, reward=reward, num_calls=calls, transitions=transitions,
            finished_at=at,
        )
    )  # fmt: skip
    return events


def history() -> list[s.AnyEvent]:
    """Five episodes: two groups, two tenants, three versions, two days."""
    return [
        *episode(index=1, group_id="g1", task_id="sql-1", tenant="acme", at=T0, calls=3, version=1, reward=1.0),
        *episode(index=2, group_id="g1", task_id="sql-1", tenant="acme", at=T0 + timedelta(minutes=5), calls=2,
                 version=1, reward=0.0),
        *episode(index=3, group_id="g2", task_id="calc-7", tenant=None, at=T0 + timedelta(hours=2), calls=1,
                 version=2, reward=0.5),
        *episode(index=4, group_id="g2", task_id="calc-7", tenant="globex", at=T0 + timedelta(days=1), calls=4,
                 version=3, reward=1.0, source=s.EpisodeSource.production),
        *episode(index=5, group_id="g3", task_id="calc-8", tenant="globex", at=T0 + timedelta(days=1, hours=1),
                 calls=1, version=3, reward=None, status=s.EpisodeStatus.timeout),
    ]  # fmt: skip

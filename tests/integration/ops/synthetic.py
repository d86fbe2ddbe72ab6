"""A short synthetic recorded run: what the gateway, worker and reward service would have published."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import schemas as s

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)


@dataclass
class Run:
    events: list[s.AnyEvent] = field(default_factory=list)
    scored: list[s.EpisodeScored] = field(default_factory=list)
    calls: list[s.LLMCallRecorded] = field(default_factory=list)

    @property
    def trainable(self) -> list[s.EpisodeScored]:
        return [e for e in self.scored if e.transitions and e.mode == s.Mode.train and e.reward is not None]


def _call(episode_id: str, seq: int, version: int, at: datetime, rng: random.Random) -> s.LLMCallRecorded:
    prompt = [1, 2, 3 + seq]
    response = [rng.randrange(10, 60) for _ in range(4)]
    logprobs = [round(-rng.random() * 2, 4) for _ in response]
    messages = [{"role": "system", "content": "calc"}, {"role": "user", "content": f"q{seq}"}]
    answer = {"role": "assistant", "content": f"answer {seq}"}
    if seq == 1:
        answer = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"x": 1}'}}
            ],
        }
    return s.LLMCallRecorded(
        emitted_at=at,
        episode_id=episode_id,
        call_seq=seq,
        call_id=f"{episode_id[:8]}-{seq}",
        model="policy",
        request=json.dumps({"model": "policy", "messages": messages, "tools": [{"type": "function"}]}),
        response=json.dumps({"choices": [{"message": answer}]}),
        upstream=s.UpstreamKind.embedded,
        token_faithful=True,
        prompt_token_ids=prompt,
        choices=[
            s.CallChoice(
                index=0, message=answer, token_ids=response, logprobs=logprobs, weight_versions=[version] * 4
            )
        ],
        weight_version=version,
    )


def synthetic_run(groups: int = 2, size: int = 4, seed: int = 7, tenant: str = "acme") -> Run:
    """``groups`` GRPO groups of ``size`` scored episodes (2 calls each), plus three that cannot train."""
    rng = random.Random(seed)
    run = Run()
    at = T0
    for g in range(groups):
        group_id = s.new_group_id()
        for i in range(size):
            at += timedelta(seconds=5)
            episode_id = s.new_episode_id()
            version = 1 + (g + i) % 3
            task = s.Task(task_id=f"calc-{g}", input={"q": g})
            run.events.append(
                s.EpisodeStarted(
                    emitted_at=at,
                    episode_id=episode_id,
                    task=task,
                    group_id=group_id,
                    group_size=size,
                    tenant=tenant,
                )
            )
            calls = [_call(episode_id, seq, version, at, rng) for seq in range(2)]
            run.calls.extend(calls)
            run.events.extend(calls)
            run.events.append(
                s.EpisodeFinished(emitted_at=at, episode_id=episode_id, status=s.EpisodeStatus.ok)
            )
            transitions = [
                s.Transition(
                    prompt_ids=c.prompt_token_ids or [],
                    response_ids=c.choices[0].token_ids or [],
                    response_mask=[1] * 4,
                    behaviour_logprobs=c.choices[0].logprobs or [],
                    weight_version=version,
                    call_seqs=[c.call_seq],
                    reward=float(i % 2),
                )
                for c in calls
            ]
            run.scored.append(
                s.EpisodeScored(
                    emitted_at=at,
                    episode_id=episode_id,
                    group_id=group_id,
                    group_size=size,
                    task_id=task.task_id,
                    tenant=tenant,
                    reward=float(i % 2),
                    reward_source="exact",
                    num_calls=2,
                    transitions=transitions,
                    sample_index=i,
                )
            )
    # Three episodes replay must skip: no token ids, no logprobs, validation.
    at += timedelta(seconds=5)
    odd_group = s.new_group_id()
    base = {"emitted_at": at, "group_id": odd_group, "group_size": 3, "task_id": "calc-odd", "tenant": tenant}
    run.scored.append(
        s.EpisodeScored(**base, episode_id=s.new_episode_id(), reward=1.0, unusable_reason="no_token_ids")
    )
    no_lp = s.Transition(prompt_ids=[1], response_ids=[5, 6], response_mask=[1, 1], behaviour_logprobs=[])
    run.scored.append(s.EpisodeScored(**base, episode_id=s.new_episode_id(), reward=1.0, transitions=[no_lp]))
    ok = run.scored[0].transitions
    run.scored.append(
        s.EpisodeScored(**base, episode_id=s.new_episode_id(), reward=1.0, transitions=ok, mode=s.Mode.val)
    )
    run.events.extend(run.scored)
    return run

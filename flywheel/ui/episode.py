"""One episode as the view shows it, built from its recorded events (no HTTP, no HTML here).

The calls come in ``call_seq`` order with what the agent sent (the messages new since the previous
call), what it got (text, tool calls) and each choice's tokens with their behaviour logprobs. Token
text is what the engine reported beside each logprob in the recorded response (chat:
``logprobs.content[].token``; completions: ``logprobs.tokens``); without it a token shows as its id.
From the episode's latest score come the per-call returns and which calls were merged into one
trajectory; per-call rewards come from ``RewardReported`` events that name a call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError

from infra.eventlog.models import EventRecord
from schemas import EpisodeScored, LLMCallRecorded, RewardOrigin, RewardReported


@dataclass(frozen=True, slots=True)
class Token:
    token_id: int
    text: str
    logprob: float | None


@dataclass(slots=True)
class ChoiceView:
    index: int
    text: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str | None
    tokens: list[Token]


@dataclass(slots=True)
class CallView:
    call: LLMCallRecorded
    new_messages: list[Any]  # what the agent added since the previous call (all of them for the first)
    all_messages: list[Any]
    choices: list[ChoiceView]
    rewards: list[RewardReported] = field(default_factory=list)  # rewards reported for this call
    trajectory: int | None = None  # which transition of the latest score holds this call
    call_return: float | None = None  # the discounted return from this call on (per-call credit)


@dataclass(slots=True)
class EpisodeView:
    episode_id: str
    calls: list[CallView]
    scored: EpisodeScored | None  # the latest score
    feedback: list[RewardReported]  # production feedback and episode-level rewards, in order
    started: dict[str, Any]  # the EpisodeStarted payload (task, tenant, source), {} when not recorded
    finished: dict[str, Any]  # the EpisodeFinished payload, {} when not recorded
    undecodable: int = 0


def _loads(text: str | None) -> Any:
    if not text:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _messages(request: Any) -> list[Any]:
    """The conversation the agent sent, whichever protocol it spoke."""
    if not isinstance(request, dict):
        return []
    for key in ("messages", "input"):
        value = request.get(key)
        if isinstance(value, list):
            return value
        if isinstance(value, str):
            return [{"role": "user", "content": value}]
    prompt = request.get("prompt")
    if prompt is not None:
        return [{"role": "prompt", "content": prompt}]
    return []


def _token_texts(response: Any, index: int) -> list[str]:
    """The engine's text of each generated token of choice ``index`` (empty when not reported)."""
    if not isinstance(response, dict):
        return []
    for choice in response.get("choices") or []:
        if not isinstance(choice, dict) or choice.get("index", 0) != index:
            continue
        lp = choice.get("logprobs")
        if isinstance(lp, dict) and isinstance(lp.get("content"), list):
            return [str(e.get("token", "")) if isinstance(e, dict) else "" for e in lp["content"]]
        if isinstance(lp, dict) and isinstance(lp.get("tokens"), list):
            return [str(t) for t in lp["tokens"]]
    return []


def _choice(call: LLMCallRecorded, response: Any, i: int) -> ChoiceView:
    c = call.choices[i]
    message: dict[str, Any] = c.message if isinstance(c.message, dict) else {}
    content = message.get("content")
    text = c.text or (content if isinstance(content, str) else "")
    listed = message.get("tool_calls")
    tool_calls = [t for t in listed if isinstance(t, dict)] if isinstance(listed, list) else []
    ids = c.token_ids or []
    texts = _token_texts(response, c.index)
    logprobs = c.logprobs or []
    tokens = [
        Token(
            token_id=tid,
            text=texts[j] if j < len(texts) and len(texts) == len(ids) else f"#{tid}",
            logprob=logprobs[j] if j < len(logprobs) else None,
        )
        for j, tid in enumerate(ids)
    ]
    return ChoiceView(c.index, text, tool_calls, c.finish_reason, tokens)


def _new_messages(previous: CallView | None, messages: list[Any]) -> list[Any]:
    """Messages past the previous call's conversation (its messages and its first answer)."""
    if previous is None:
        return messages
    before = list(previous.all_messages)
    first = previous.call.choices[0].message if previous.call.choices else None
    if isinstance(first, dict):
        before.append(first)
    n = 0
    while n < min(len(before), len(messages)) and _same(before[n], messages[n]):
        n += 1
    return messages[n:]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.get("role") == b.get("role") and a.get("content") == b.get("content")
    return bool(a == b)


def build_episode(episode_id: str, events: list[EventRecord]) -> EpisodeView:
    """The view of ``episode_id`` from its events (as ``EventLogReader.episode_events`` returns them)."""
    view = EpisodeView(episode_id, [], None, [], {}, {})
    calls: dict[int, CallView] = {}
    call_rewards: list[RewardReported] = []
    for record in events:
        try:
            if record.type == "llm_call_recorded":
                call = LLMCallRecorded.model_validate_json(record.payload)
                if call.call_seq in calls:  # a duplicate row of the same call
                    continue
                response = _loads(call.response)
                choices = [_choice(call, response, i) for i in range(len(call.choices))]
                messages = _messages(_loads(call.request))
                calls[call.call_seq] = CallView(call, messages, messages, choices)
            elif record.type == "reward_reported":
                reward = RewardReported.model_validate_json(record.payload)
                is_call = reward.call_seq is not None and reward.origin != RewardOrigin.feedback
                (call_rewards if is_call else view.feedback).append(reward)
            elif record.type == "episode_scored":
                scored = EpisodeScored.model_validate_json(record.payload)
                if view.scored is None or scored.score_revision >= view.scored.score_revision:
                    view.scored = scored
            elif record.type == "episode_started":
                view.started = _loads(record.payload) or {}
            elif record.type == "episode_finished":
                view.finished = _loads(record.payload) or {}
        except ValidationError:
            view.undecodable += 1
    previous: CallView | None = None
    for seq in sorted(calls):
        cv = calls[seq]
        cv.new_messages = _new_messages(previous, cv.all_messages)
        previous = cv
        view.calls.append(cv)
    for reward in call_rewards:
        if reward.call_seq in calls:
            calls[reward.call_seq].rewards.append(reward)
        else:
            view.feedback.append(reward)
    if view.scored is not None:
        for t_index, t in enumerate(view.scored.transitions):
            for k, seq in enumerate(t.call_seqs):
                if seq in calls:
                    calls[seq].trajectory = t_index
                    if t.segment_returns is not None and k < len(t.segment_returns):
                        calls[seq].call_return = t.segment_returns[k]
    return view

"""One tenant's Agent Lightning state, changed only by :meth:`TenantState.apply` of a :class:`Record`.

The same records are journaled (``journal.py``) and published (``AglRecorded``), so replaying the
journal in order rebuilds exactly the state the server had answered from. Reads follow AGL 1.0:
events are kept per attempt in arrival order; a rollout's events are those of its ``last_attempt_id``
(attempt ``"0"`` until one is set); the terminal log is append-only, in completion order, and a
deleted rollout keeps its slot there (cursors handed out stay valid).

The triplet projection (``GET …/events?format=triplet``) trims a ``model_request`` to its prompt and
response token ids, behaviour logprobs and server, a ``reward`` to its value, and keeps only the last
request for each prompt (a retried call supersedes the earlier one), as AGL's trainer expects.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.agl.models import DEFAULT_ATTEMPT_ID, Event, Model, PauseState, Rollout

# What a record changes; ``data`` is the JSON of the object named (see serving.py, which builds them).
KINDS = frozenset(
    {
        "rollout_created",
        "rollout_patched",
        "rollout_deleted",
        "event",
        "models_registered",
        "models_cleared",
        "paused",
        "resumed",
    }
)


@dataclass(frozen=True, slots=True)
class Record:
    tenant: str
    kind: str
    data: Any
    rollout_id: str | None = None
    attempt_id: str | None = None


@dataclass(slots=True)
class Pause:
    paused: bool = False
    retry_after_seconds: int = 5
    reason: str | None = None

    def view(self, inflight: int) -> PauseState:
        return PauseState(
            paused=self.paused,
            retry_after_seconds=self.retry_after_seconds,
            reason=self.reason,
            inflight=inflight,
        )


@dataclass(slots=True)
class TenantState:
    rollouts: dict[str, Rollout] = field(default_factory=dict)
    # rollout id → attempt id → events, attempts in the order their first event arrived
    events: dict[str, dict[str, list[Event]]] = field(default_factory=dict)
    models: dict[str, dict[str, Model]] = field(default_factory=dict)
    terminal: list[str] = field(default_factory=list)
    pause: Pause = field(default_factory=Pause)

    def apply(self, record: Record) -> None:
        kind, data = record.kind, record.data
        if kind in ("rollout_created", "rollout_patched"):
            rollout = Rollout.model_validate(data["rollout"])
            self.rollouts[rollout.rollout_id] = rollout
            self.events.setdefault(rollout.rollout_id, {})
            if data.get("terminal"):
                self.terminal.append(rollout.rollout_id)
        elif kind == "rollout_deleted":
            self.rollouts.pop(str(record.rollout_id), None)
            self.events.pop(str(record.rollout_id), None)
        elif kind == "event":
            event = Event.model_validate(data)
            attempts = self.events.setdefault(event.rollout_id, {})
            attempt = attempts.setdefault(event.attempt_id, [])
            _drop_superseded_routes(attempt, event)
            attempt.append(event)
        elif kind == "models_registered":
            for raw in data:
                m = Model.model_validate(raw)
                self.models.setdefault(m.model, {})[m.endpoint] = m
        elif kind == "models_cleared":
            self.models.clear()
        elif kind == "paused":
            self.pause = Pause(True, int(data["retry_after_seconds"]), data.get("reason"))
        elif kind == "resumed":
            self.pause = Pause(False, self.pause.retry_after_seconds, None)
        else:
            raise ValueError(f"unknown AGL record kind {kind!r}")

    # ----------------------------------------------------------------------------------- reads
    def attempts(self, rollout_id: str) -> list[str]:
        return [aid for aid, evs in self.events.get(rollout_id, {}).items() if evs]

    def attempt_events(self, rollout_id: str, attempt_id: str) -> list[Event]:
        return self.events.get(rollout_id, {}).get(attempt_id, [])

    def rollout_events(self, rollout_id: str) -> list[Event]:
        rollout = self.rollouts[rollout_id]
        return self.attempt_events(rollout_id, rollout.status.last_attempt_id or DEFAULT_ATTEMPT_ID)


def new_event(rollout_id: str, attempt_id: str, event_type: str, data: dict[str, Any]) -> Event:
    return Event(
        event_type=event_type, rollout_id=rollout_id, attempt_id=attempt_id, timestamp=time.time(), data=data
    )


# ------------------------------------------------------------------------------------ triplets
def _choice_logprobs(choice: dict[str, Any]) -> list[float] | None:
    """The chosen tokens' logprobs (chat or completions layout); None when absent or not finite."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    if isinstance(lp.get("content"), list):
        values: list[Any] = []
        for entry in lp["content"]:
            if not isinstance(entry, dict) or "logprob" not in entry:
                return None
            values.append(entry["logprob"])
    elif isinstance(lp.get("token_logprobs"), list):
        values = list(lp["token_logprobs"])
    else:
        return None
    out: list[float] = []
    for v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            return None
        if not math.isfinite(f):
            return None
        out.append(f)
    return out


def trim_model_request(data: dict[str, Any]) -> dict[str, Any]:
    resp = data.get("response")
    prompt: Any = []
    response_ids: Any = []
    logprobs: list[float] | None = None
    if isinstance(resp, dict):
        prompt = resp.get("prompt_token_ids", [])
        choices = resp.get("choices") or []
        first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        if not prompt:
            prompt = first.get("prompt_token_ids", [])
        response_ids = first.get("token_ids", [])
        logprobs = _choice_logprobs(first) if first else None
    elif isinstance(resp, list):  # a response kept as its raw stream chunks
        for chunk in resp:
            if not isinstance(chunk, dict):
                continue
            if not prompt and chunk.get("prompt_token_ids"):
                prompt = chunk["prompt_token_ids"]
            for choice in (chunk.get("choices") or [])[:1]:
                if isinstance(choice, dict) and choice.get("token_ids"):
                    response_ids = [*response_ids, *choice["token_ids"]]
    server = data.get("server") or {}
    trimmed: dict[str, Any] = {
        "prompt_token_ids": prompt,
        "response_token_ids": response_ids,
        "response_log_probs": logprobs,
        "server": {"model": server.get("model"), "version": server.get("version")},
    }
    if data.get("routed_experts") is not None:
        trimmed["routed_experts"] = data["routed_experts"]
    for key in ("http_status", "status"):
        if key in data:
            trimmed[key] = data[key]
    if isinstance(resp, dict) and "error" in resp:
        trimmed["error"] = resp["error"]
    return trimmed


def to_triplet(event: Event) -> Event:
    if event.event_type == "model_request":
        return event.model_copy(update={"data": trim_model_request(event.data)})
    if event.event_type == "reward":
        kept = {"value": event.data.get("value")}
        kept.update({k: event.data[k] for k in ("source", "reason") if k in event.data})
        return event.model_copy(update={"data": kept})
    return event


def _prompt_key(ids: Any) -> tuple[int, ...] | None:
    if not isinstance(ids, list) or not ids or any(type(t) is not int for t in ids):
        return None
    return tuple(ids)


def keep_last_per_prompt(events: list[Event]) -> list[Event]:
    """Trimmed events with only the last ``model_request`` per prompt (requests without a usable
    prompt are all kept: there is nothing to compare them by)."""
    last: dict[tuple[int, ...], int] = {}
    for i, e in enumerate(events):
        if e.event_type == "model_request" and (key := _prompt_key(e.data.get("prompt_token_ids"))):
            last[key] = i
    kept = set(last.values())
    return [
        e
        for i, e in enumerate(events)
        if e.event_type != "model_request" or i in kept or _prompt_key(e.data.get("prompt_token_ids")) is None
    ]


def without_routes(event: Event) -> Event:
    if event.event_type != "model_request" or "routed_experts" not in event.data:
        return event
    return event.model_copy(update={"data": {k: v for k, v in event.data.items() if k != "routed_experts"}})


def _drop_superseded_routes(attempt: list[Event], new: Event) -> None:
    """A MoE route tensor is large: keep it only on the last request of a trajectory that the new
    request repeats or extends (the trainer needs one per merged sequence)."""
    if new.event_type != "model_request" or new.data.get("routed_experts") is None:
        return
    prompt = trim_model_request(new.data)["prompt_token_ids"]
    for i in range(len(attempt) - 1, -1, -1):
        prev = attempt[i]
        if prev.event_type != "model_request":
            continue
        p = trim_model_request(prev.data)
        context = list(p["prompt_token_ids"]) + list(p["response_token_ids"])
        if (prompt == p["prompt_token_ids"] or prompt[: len(context)] == context) and (
            "routed_experts" in prev.data
        ):
            attempt[i] = without_routes(prev)
        return

"""Evaluating prompt candidates on real rollouts: activate a version at the gateway, run the agent, score.

Everything goes through the running stack's bus, as any other client of it would:

* :meth:`Rollouts.activate` publishes ``PromptVersionRequested`` on ``flywheel.control`` and waits for
  a gateway's ``PromptVersionActivated`` (the same event ``flywheel optimize --activate`` uses);
* :meth:`Rollouts.run` publishes one ``RolloutRequested(mode=val)`` per task (a group of one, which the
  trainer never trains on), so the rollout worker runs the unchanged agent, its calls go through the
  gateway (which substitutes the candidate) to the engine, and the reward service scores each episode
  with the task's scorer; it waits for every ``EpisodeScored`` and keeps the episode's last recorded
  call, whose request and reply are the conversation the model saw (GEPA's trace).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.bus.base import Bus, Message, Subscription
from schemas import (
    CONTROL,
    EPISODES,
    TRANSITIONS,
    AgentRef,
    EpisodeScored,
    EpisodeStarted,
    LLMCallRecorded,
    Mode,
    PromptComponent,
    PromptVersionActivated,
    PromptVersionRequested,
    RolloutRequested,
    Task,
    new_group_id,
    tasks_topic,
)

Candidate = dict[str, str]


class OptimizeError(RuntimeError):
    """Something the optimiser depends on failed (activation unanswered, episodes not scored, ...)."""


def prompt_version_of(candidate: Candidate) -> str:
    """A candidate's version id: its content hash, so equal texts are one version everywhere."""
    blob = json.dumps(candidate, sort_keys=True, ensure_ascii=False).encode()
    return "p-" + hashlib.sha256(blob).hexdigest()[:12]


@dataclass(frozen=True)
class ComponentSpec:
    """What the gateway matches (``original``) for a named component, and how (``match``)."""

    name: str
    original: str
    match: str = "system"


@dataclass
class EpisodeResult:
    task: Task
    episode_id: str
    reward: float
    status: str
    note: str  # the scorer's reason (``EpisodeScored.score_note``) and any error
    prompt_version: str | None
    num_calls: int
    transcript: list[dict[str, str]] = field(default_factory=list)  # as the model saw it

    def output(self) -> dict[str, Any]:
        reply = next((m["content"] for m in reversed(self.transcript) if m["role"] == "assistant"), "")
        return {"task_id": self.task.task_id, "reward": self.reward, "last_reply": reply}


def _content(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(str(p.get("text", "")) for p in value if isinstance(p, dict))
    return "" if value is None else str(value)


def transcript(call: LLMCallRecorded | None) -> list[dict[str, str]]:
    """The conversation of an episode's last call as the model saw it (substitutions applied) + reply."""
    if call is None:
        return []
    try:
        request = json.loads(call.request)
    except ValueError:
        return []
    raw = request.get("messages") if isinstance(request, dict) else None
    messages = [
        {"role": str(m.get("role", "")), "content": _content(m.get("content"))}
        for m in (raw if isinstance(raw, list) else [])
        if isinstance(m, dict)
    ]
    for sub in call.prompt_substitutions:
        i = sub.message_index
        if i is not None and i < len(messages):
            text = messages[i]["content"]
            span = sub.original != text and sub.original in text
            messages[i]["content"] = (
                text.replace(sub.original, sub.substituted, 1) if span else sub.substituted
            )
    if call.choices:
        messages.append({"role": "assistant", "content": call.choices[0].text})
    elif call.error:
        messages.append({"role": "assistant", "content": f"(the call failed: {call.error[:300]})"})
    return messages


class Rollouts:
    """Runs the agent on tasks under a prompt version, through the stack on ``bus``."""

    def __init__(
        self,
        bus: Bus,
        agent: AgentRef,
        *,
        model: str = "policy",
        pool: str | None = None,
        deadline_s: float = 120.0,
        timeout_s: float = 600.0,
    ) -> None:
        self.bus = bus
        self.agent = agent
        self.model = model
        self.pool = pool
        self.deadline_s = deadline_s
        self.timeout_s = timeout_s
        self.components: list[ComponentSpec] = []
        self.episodes_run = 0
        self._subs: list[Subscription] = []
        self._scored: dict[str, asyncio.Future[EpisodeScored]] = {}
        self._acks: dict[str, asyncio.Future[PromptVersionActivated]] = {}
        self._last_call: dict[str, LLMCallRecorded] = {}
        self._calls_seen: dict[str, int] = {}
        self._ours: set[str] = set()
        self._call_arrived = asyncio.Event()

    async def start(self) -> None:
        group = f"optimize-{uuid.uuid4().hex[:12]}"
        for topic, handler in (
            (TRANSITIONS, self._on_scored),
            (EPISODES, self._on_call),
            (CONTROL, self._on_control),
        ):
            self._subs.append(
                await self.bus.subscribe(topic, f"{group}.{topic}", handler, from_beginning=False)
            )

    async def stop(self) -> None:
        subs, self._subs = self._subs, []
        for sub in subs:
            await sub.stop()

    # ------------------------------------------------------------------------------ bus input
    async def _on_scored(self, msg: Message) -> None:
        event = msg.event
        if isinstance(event, EpisodeScored):
            fut = self._scored.get(event.group_id)
            if fut is not None and not fut.done():
                fut.set_result(event)

    async def _on_call(self, msg: Message) -> None:
        event = msg.event
        if isinstance(event, EpisodeStarted) and event.group_id in self._scored:
            self._ours.add(event.episode_id)  # only our episodes' calls are kept
        elif isinstance(event, LLMCallRecorded) and event.episode_id in self._ours:
            last = self._last_call.get(event.episode_id)
            if last is None or event.call_seq >= last.call_seq:
                self._last_call[event.episode_id] = event
            self._calls_seen[event.episode_id] = self._calls_seen.get(event.episode_id, 0) + 1
            self._call_arrived.set()

    async def _on_control(self, msg: Message) -> None:
        event = msg.event
        if isinstance(event, PromptVersionActivated):
            fut = self._acks.get(event.request_id)
            if fut is not None and not fut.done():
                fut.set_result(event)

    # ------------------------------------------------------------------------------ actions
    async def activate(self, candidate: Candidate | None, *, reason: str = "flywheel optimize") -> str | None:
        """Make ``candidate`` the gateway's active prompt version (None: the agent's own prompts)."""
        version = prompt_version_of(candidate) if candidate is not None else None
        comps = [
            PromptComponent(name=c.name, match=c.match, original=c.original, text=(candidate or {})[c.name])
            for c in self.components
            if candidate is not None and c.name in candidate
        ]
        request = PromptVersionRequested(
            model=self.model, prompt_version=version, components=comps, reason=reason, producer="optimize"
        )
        fut: asyncio.Future[PromptVersionActivated] = asyncio.get_running_loop().create_future()
        self._acks[request.event_id] = fut
        try:
            await self.bus.publish(CONTROL, request)
            await asyncio.wait_for(fut, 30.0)
        except TimeoutError as exc:
            raise OptimizeError(
                f"no gateway activated prompt version {version} within 30s (is one running for model "
                f"{self.model!r}?)"
            ) from exc
        finally:
            self._acks.pop(request.event_id, None)
        return version

    async def run(self, tasks: Sequence[Task]) -> list[EpisodeResult]:
        """One episode per task under the active version; results in the order of ``tasks``."""
        loop = asyncio.get_running_loop()
        groups = [(new_group_id(), task) for task in tasks]
        futs = {gid: loop.create_future() for gid, _ in groups}
        self._scored.update(futs)
        try:
            for gid, task in groups:
                (request,) = RolloutRequested.group(
                    task,
                    self.agent,
                    group_id=gid,
                    mode=Mode.val,
                    model=self.model,
                    deadline_s=self.deadline_s,
                    pool=self.pool,
                    producer="optimize",
                )
                await self.bus.publish(tasks_topic(self.pool), request)
            try:
                done = await asyncio.wait_for(asyncio.gather(*futs.values()), self.timeout_s)
            except TimeoutError as exc:
                got = sum(1 for f in futs.values() if f.done())
                raise OptimizeError(
                    f"{got} of {len(futs)} episodes scored after {self.timeout_s:.0f}s"
                ) from exc
        finally:
            for gid in futs:
                self._scored.pop(gid, None)
        self.episodes_run += len(groups)
        return list(
            await asyncio.gather(
                *(self._result(task, scored) for (_, task), scored in zip(groups, done, strict=True))
            )
        )

    async def _result(self, task: Task, scored: EpisodeScored) -> EpisodeResult:
        # the calls travel on another topic than the score: wait (briefly) until all have arrived here
        async def all_calls() -> None:
            while self._calls_seen.get(scored.episode_id, 0) < scored.num_calls:
                self._call_arrived.clear()
                await self._call_arrived.wait()

        with contextlib.suppress(TimeoutError):  # the trace is then shorter; the score is what counts
            await asyncio.wait_for(all_calls(), 5.0)
        call = self._last_call.pop(scored.episode_id, None)
        self._calls_seen.pop(scored.episode_id, None)
        self._ours.discard(scored.episode_id)
        notes = [n for n in (scored.score_note, scored.score_error) if n]
        if scored.status.value != "ok":
            notes.append(f"episode ended with status {scored.status.value}")
        return EpisodeResult(
            task=task,
            episode_id=scored.episode_id,
            reward=float(scored.reward or 0.0),
            status=scored.status.value,
            note="; ".join(notes),
            prompt_version=call.prompt_version if call is not None else None,
            num_calls=scored.num_calls,
            transcript=transcript(call),
        )

    async def detect_original(self, probe: Task) -> str:
        """The agent's system message, read from a recorded call of one rollout under its own prompts."""
        await self.activate(None, reason="flywheel optimize: read the agent's prompt")
        (result,) = await self.run([probe])
        system = next((m["content"] for m in result.transcript if m["role"] in ("system", "developer")), None)
        if system is None:
            raise OptimizeError(
                "the agent sent no system message on its first call; give the text to replace with "
                "--original-prompt, or mark a span [[flywheel:NAME]]...[[/flywheel:NAME]] and use "
                "--match span"
            )
        return system

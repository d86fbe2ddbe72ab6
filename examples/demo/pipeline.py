"""What the demo asks of the running stack: evaluations and training progress, all through the bus.

An evaluation publishes one ``RolloutRequested(mode=val)`` per held-out task (a group of one) and
waits for the reward service's ``EpisodeScored`` of each: the same worker → agent → gateway → engine
→ reward path as training, and the trainer skips ``val`` episodes. With ``by_model`` it also reads the
episodes' ``LLMCallRecorded`` and counts, per requested model name, the calls that became transitions
(``trained``) and those the reward service's selector kept as context, and which LoRA adapter (and
version) served them: with a policy map the gateway picks each call's adapter, so an evaluation measures
the adapters as the agent's roles are served by them. Training progress is read from the
trainer's ``TrainerStepCompleted`` events on ``flywheel.control``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from examples.demo.ledger import BASE
from infra.bus.base import Bus, Message
from schemas import (
    CONTROL,
    EPISODES,
    TRANSITIONS,
    AgentRef,
    EpisodeScored,
    EpisodeStatus,
    LLMCallRecorded,
    Mode,
    RolloutRequested,
    Task,
    TrainerStepCompleted,
    new_group_id,
    tasks_topic,
)


class EvaluationTimeout(TimeoutError):
    def __init__(self, got: int, wanted: int, seconds: float) -> None:
        super().__init__(f"evaluation: {got} of {wanted} episodes scored after {seconds:.0f}s")
        self.got = got
        self.wanted = wanted


@dataclass(frozen=True)
class EvalResult:
    success: float  # share of episodes with reward ≥ 1
    reward: float
    transitions_per_episode: float  # LLM calls per episode: one transition per call (LightningRL)
    trajectories_per_episode: float  # what the reward service built after merging calls that extend
    calls_per_episode: float
    episodes: int
    errors: int  # episodes whose agent failed (error/timeout)
    seconds: float
    weight_versions: list[int] = field(default_factory=list)
    # per requested model name: {"calls", "trained", "context"} per episode (``evaluate(by_model=True)``)
    calls_by_model: dict[str, dict[str, float]] | None = None
    # per requested model name: the adapters that served its calls (``(base)``: none) and the adapter
    # versions they were recorded with; only when an adapter served one of the episodes' calls
    adapters_by_model: dict[str, dict[str, list[int]]] | None = None

    def as_dict(self) -> dict[str, Any]:
        extra: dict[str, Any] = {} if self.calls_by_model is None else {"calls_by_model": self.calls_by_model}
        if self.adapters_by_model is not None:
            extra["adapters_by_model"] = self.adapters_by_model
        return {
            "success": round(self.success, 4),
            "reward": round(self.reward, 4),
            "transitions_per_episode": round(self.transitions_per_episode, 4),
            "trajectories_per_episode": round(self.trajectories_per_episode, 4),
            "calls_per_episode": round(self.calls_per_episode, 4),
            "episodes": self.episodes,
            "errors": self.errors,
            "seconds": round(self.seconds, 2),
            "weight_versions": self.weight_versions,
            **extra,
        }


Models = dict[str, dict[int, str]]  # episode_id → call_seq → the model name the call asked for
# episode_id → call_seq → the adapter that served the call (None: no adapter) and its version
Served = dict[str, dict[int, tuple[str | None, int | None]]]


def calls_by_model(scored: Sequence[EpisodeScored], models: Models) -> dict[str, dict[str, float]]:
    """Per model name, per episode: calls, calls that became transitions, context calls."""
    n = max(1, len(scored))
    counts: dict[str, dict[str, float]] = {}
    for e in scored:
        trained = {seq for t in e.transitions for seq in t.call_seqs}
        for seq, model in models.get(e.episode_id, {}).items():
            row = counts.setdefault(model, {"calls": 0.0, "trained": 0.0, "context": 0.0})
            row["calls"] += 1
            row["trained" if seq in trained else "context"] += 1
    return {m: {k: round(v / n, 4) for k, v in row.items()} for m, row in sorted(counts.items())}


def adapters_by_model(
    scored: Sequence[EpisodeScored], models: Models, served: Served
) -> dict[str, dict[str, list[int]]] | None:
    """Per model name, the adapters that served the episodes' calls (``(base)``: none) with the adapter
    versions recorded; None when no adapter served any of them."""
    seen: dict[str, dict[str, set[int]]] = {}
    for e in scored:
        calls = served.get(e.episode_id, {})
        for seq, model in models.get(e.episode_id, {}).items():
            adapter, version = calls.get(seq, (None, None))
            versions = seen.setdefault(model, {}).setdefault(adapter or BASE, set())
            if adapter is not None and version is not None:
                versions.add(version)
    if not any(a != BASE for by in seen.values() for a in by):
        return None
    return {m: {a: sorted(v) for a, v in sorted(by.items())} for m, by in sorted(seen.items())}


def summarise(
    scored: Sequence[EpisodeScored],
    seconds: float,
    models: Models | None = None,
    served: Served | None = None,
) -> EvalResult:
    n = max(1, len(scored))
    versions = sorted({t.weight_version for e in scored for t in e.transitions})
    return EvalResult(
        success=sum(1 for e in scored if (e.reward or 0.0) >= 1.0) / n,
        reward=sum(e.reward or 0.0 for e in scored) / n,
        transitions_per_episode=sum(e.num_calls for e in scored) / n,
        trajectories_per_episode=sum(len(e.transitions) for e in scored) / n,
        calls_per_episode=sum(e.num_calls for e in scored) / n,
        episodes=len(scored),
        errors=sum(1 for e in scored if e.status is not EpisodeStatus.ok),
        seconds=seconds,
        weight_versions=versions,
        calls_by_model=None if models is None else calls_by_model(scored, models),
        adapters_by_model=None if models is None else adapters_by_model(scored, models, served or {}),
    )


async def evaluate(
    bus: Bus,
    tasks: Sequence[Task],
    agent: AgentRef,
    *,
    model: str = "policy",
    deadline_s: float = 120.0,
    timeout_s: float = 600.0,
    by_model: bool = False,
) -> EvalResult:
    """Run ``agent`` once on every task in ``mode=val`` and summarise the scored episodes."""
    wanted: dict[str, Task] = {new_group_id(): task for task in tasks}
    got: dict[str, EpisodeScored] = {}
    done = asyncio.Event()
    models: Models = {}
    served: Served = {}
    new_call = asyncio.Event()

    async def on_call(msg: Message) -> None:
        event = msg.event
        if isinstance(event, LLMCallRecorded):
            models.setdefault(event.episode_id, {})[event.call_seq] = event.model
            served.setdefault(event.episode_id, {})[event.call_seq] = (event.adapter, event.adapter_version)
            new_call.set()

    async def on_scored(msg: Message) -> None:
        event = msg.event
        if isinstance(event, EpisodeScored) and event.group_id in wanted:
            got[event.group_id] = event
            if len(got) == len(wanted):
                done.set()

    t0 = time.perf_counter()
    group = f"demo-eval-{uuid.uuid4().hex[:12]}"
    calls = await bus.subscribe(EPISODES, group, on_call, from_beginning=False) if by_model else None
    sub = await bus.subscribe(TRANSITIONS, group, on_scored, from_beginning=False)
    try:
        for group_id, task in wanted.items():
            (request,) = RolloutRequested.group(
                task,
                agent,
                group_id=group_id,
                mode=Mode.val,
                model=model,
                deadline_s=deadline_s,
                producer="demo",
            )
            await bus.publish(tasks_topic(None), request)
        try:
            await asyncio.wait_for(done.wait(), timeout_s)
        except TimeoutError as exc:
            raise EvaluationTimeout(len(got), len(wanted), time.perf_counter() - t0) from exc
        if calls is not None:  # an episode's calls precede its scoring, but on another subscription
            await _calls_seen(list(got.values()), models, new_call)
    finally:
        await sub.stop()
        if calls is not None:
            await calls.stop()
    seconds = time.perf_counter() - t0
    return summarise(list(got.values()), seconds, models if by_model else None, served)


async def _calls_seen(
    scored: Sequence[EpisodeScored], models: Models, new_call: asyncio.Event, timeout_s: float = 10.0
) -> None:
    """Wait until every scored episode's calls were read (or ``timeout_s``: then count what came)."""
    deadline = time.perf_counter() + timeout_s
    while any(len(models.get(e.episode_id, {})) < e.num_calls for e in scored):
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        new_call.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(new_call.wait(), left)


@dataclass
class StepPoint:
    step: int
    version: int
    elapsed_s: float
    metrics: dict[str, float]


class TrainingMonitor:
    """Collects ``TrainerStepCompleted`` events (for the live display and the plot).

    It also reads the training episodes' ``EpisodeScored`` so each step carries ``calls_per_episode``
    (the transitions per episode before merging) of the episodes scored since the previous step.
    """

    def __init__(
        self, bus: Bus, model: str = "policy", on_step: Callable[[StepPoint], None] | None = None
    ) -> None:
        self.bus = bus
        self.model = model
        self.on_step = on_step
        self.points: list[StepPoint] = []
        self.t0 = time.perf_counter()
        self._subs: list[Any] = []
        self._new = asyncio.Event()
        self._calls: list[int] = []

    async def start(self) -> None:
        self.t0 = time.perf_counter()
        group = f"demo-monitor-{uuid.uuid4().hex[:12]}"
        self._subs.append(await self.bus.subscribe(TRANSITIONS, group, self._on_scored, from_beginning=False))
        self._subs.append(await self.bus.subscribe(CONTROL, group, self._on_control, from_beginning=False))

    async def stop(self) -> None:
        subs, self._subs = self._subs, []
        for sub in subs:
            await sub.stop()

    async def _on_scored(self, msg: Message) -> None:
        event = msg.event
        if isinstance(event, EpisodeScored) and event.mode is Mode.train and event.num_calls > 0:
            self._calls.append(event.num_calls)

    async def _on_control(self, msg: Message) -> None:
        event = msg.event
        if isinstance(event, TrainerStepCompleted) and event.model == self.model:
            metrics = event.metrics.as_dict()
            if self._calls:
                metrics["calls_per_episode"] = sum(self._calls) / len(self._calls)
                self._calls = []
            point = StepPoint(event.step, event.version, time.perf_counter() - self.t0, metrics)
            self.points.append(point)
            self._new.set()
            if self.on_step is not None:
                self.on_step(point)

    async def wait_steps(self, n: int, timeout_s: float) -> bool:
        """Wait until ``n`` steps were seen (True) or ``timeout_s`` passed (False)."""
        deadline = time.perf_counter() + timeout_s
        while len(self.points) < n:
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            self._new.clear()
            try:
                await asyncio.wait_for(self._new.wait(), left)
            except TimeoutError:
                return False
        return True

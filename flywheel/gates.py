"""Gates: every release candidate is evaluated before it can serve production.

The trainer proposes a candidate every ``release_every`` versions (``VersionProposed``). The gate keeper
runs the eval suite (a task file, each task's scorer, one agent) on it in validation mode through the
rollout workers, the calls naming the version (``policy@v12``: gateway/releases.py serves them from it),
and the served version on the same suite, then applies the rules:

- ``min``: the candidate's figure is at least this (``max``: at most);
- ``max_regression``: the candidate is no worse than the served version by more than this margin
  (for ``score`` and ``success`` lower is worse; for ``calls_per_episode`` and ``error_rate``, higher).

It publishes ``VersionEvaluated`` with both versions' figures and the first rule failed, and, when every
rule passed, either a canary (``VersionCanary``, with ``canary`` configured: flywheel/canary.py decides
its end) or, when ``promote`` is ``auto``, ``VersionPromoted`` decided by the gate. A rule names one of
:data:`METRICS`; the configuration is a JSON file (``flywheel up --gates FILE``), checked on load.
"""

from __future__ import annotations

import asyncio
import statistics
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from flywheel.canary import CanaryConfig, CanaryJudge
from flywheel.taskfile import guess_agent_kind, load_task_file
from infra.bus.base import Bus, Message, Subscription
from infra.logging import get_logger
from infra.releases import ReleaseBook, ReleaseError, versioned_name
from schemas import (
    CONTROL,
    EPISODES,
    TRANSITIONS,
    AgentRef,
    AnyEvent,
    EpisodeScored,
    EpisodeSource,
    EpisodeStarted,
    EpisodeStatus,
    Mode,
    RolloutRequested,
    Task,
    VersionCanary,
    VersionEvaluated,
    VersionProposed,
    new_group_id,
    tasks_topic,
)
from schemas.control import RELEASE_EVENTS

log = get_logger("flywheel.gates")

METRICS = ("score", "success", "calls_per_episode", "error_rate")
_LOWER_IS_BETTER = frozenset({"calls_per_episode", "error_rate"})


class GateError(ValueError):
    """A gate configuration that cannot be used; the message is one line."""


class GateRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metric: str
    min: float | None = None
    max: float | None = None
    max_regression: float | None = Field(default=None, ge=0)
    adapter: str | None = Field(default=None, description="the policy it applies to; None: every policy")

    @field_validator("metric")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in METRICS:
            raise ValueError(f"unknown metric {value!r} (known: {', '.join(METRICS)})")
        return value

    def check(self, figures: dict[str, float], served: dict[str, float]) -> str | None:
        """None when it holds; else what failed, in one line."""
        value = figures[self.metric]
        if self.min is not None and value < self.min:
            return f"{self.metric} {value:.3f} < min {self.min:g}"
        if self.max is not None and value > self.max:
            return f"{self.metric} {value:.3f} > max {self.max:g}"
        if self.max_regression is not None and self.metric in served:
            was = served[self.metric]
            worse = value - was if self.metric in _LOWER_IS_BETTER else was - value
            if worse > self.max_regression:
                return f"{self.metric} {value:.3f} regresses {worse:.3f} from the served {was:.3f} (margin {self.max_regression:g})"
        return None


class GateConfig(BaseModel):
    """``gates.json``: the eval suite, the agent that runs it, the rules, and what a pass does."""

    model_config = ConfigDict(extra="forbid")

    tasks: Path
    agent: str = Field(min_length=1)
    rules: list[GateRule] = Field(min_length=1)
    promote: Literal["auto", "manual"] = "auto"
    canary: CanaryConfig | None = Field(default=None, description="a passed candidate is canaried first")
    samples: int = Field(default=1, ge=1, le=16, description="rollouts per task and version")
    deadline_s: float = Field(default=120.0, gt=0)
    timeout_s: float = Field(default=600.0, gt=0)

    @classmethod
    def load(cls, path: Path) -> GateConfig:
        try:
            config = cls.model_validate_json(path.read_text())
        except OSError as exc:
            raise GateError(f"cannot read {path}: {exc.strerror or exc}") from exc
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise GateError(
                f"{path}: {str(first['msg']).removeprefix('Value error, ')}"
                + (f" at {where}" if where else "")
            ) from exc
        if not config.tasks.is_absolute():
            config = config.model_copy(update={"tasks": path.parent / config.tasks})
        return config

    def suite(self) -> list[Task]:
        return load_task_file(self.tasks)

    def agent_ref(self) -> AgentRef:
        return AgentRef(kind=guess_agent_kind(self.agent), spec=self.agent)

    def rules_for(self, adapter: str | None) -> list[GateRule]:
        return [r for r in self.rules if r.adapter is None or r.adapter == adapter]


def figures_of(scored: list[EpisodeScored]) -> dict[str, float]:
    """The guard metrics of one version's evaluation episodes."""
    if not scored:
        return {"score": 0.0, "success": 0.0, "calls_per_episode": 0.0, "error_rate": 1.0, "episodes": 0.0}
    rewards = [e.reward if e.reward is not None else 0.0 for e in scored]
    return {
        "score": statistics.fmean(rewards),
        "success": statistics.fmean(1.0 if r >= 1.0 else 0.0 for r in rewards),
        "calls_per_episode": statistics.fmean(e.num_calls for e in scored),
        "error_rate": statistics.fmean(0.0 if e.status is EpisodeStatus.ok else 1.0 for e in scored),
        "episodes": float(len(scored)),
    }


@dataclass
class GateKeeper:
    """Evaluates each candidate as it is proposed; one evaluation at a time, the newest candidate first."""

    bus: Bus
    config: GateConfig
    model: str = "policy"
    book: ReleaseBook = field(init=False)
    _pending: dict[str | None, int] = field(default_factory=dict, init=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _sub: Subscription | None = field(default=None, init=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False)
    _served_figures: dict[tuple[str | None, int], dict[str, float]] = field(default_factory=dict, init=False)
    _judges: dict[str | None, CanaryJudge] = field(default_factory=dict, init=False)
    _production: set[str] = field(default_factory=set, init=False)
    _episodes: Subscription | None = field(default=None, init=False)
    on_evaluated: Callable[[VersionEvaluated], None] | None = None

    def __post_init__(self) -> None:
        self.book = ReleaseBook(self.model)
        self.tasks = self.config.suite()

    async def start(self) -> None:
        group = f"gates-{uuid.uuid4().hex[:8]}"
        self._sub = await self.bus.subscribe(CONTROL, group, self._on_control, from_beginning=True)
        if self.config.canary is not None:
            self._episodes = await self.bus.subscribe(EPISODES, group, self._on_episode, from_beginning=False)
        self._task = asyncio.create_task(self._run(), name="flywheel-gates")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for sub in (self._sub, self._episodes):
            if sub is not None:
                await sub.stop()

    async def _on_control(self, msg: Message) -> None:
        event = msg.event
        if isinstance(event, RELEASE_EVENTS) and event.model == self.model:
            new = self.book.apply(event)
            if (
                new
                and isinstance(event, VersionCanary)
                and event.share > 0
                and self.config.canary is not None
            ):
                self._judge(event.adapter).reset()  # a new canary: its arms start empty
            self._wake.set()  # a canary that ended lets the evaluations waiting for it go on
            if isinstance(event, VersionProposed):
                rec = self.book.release(event.adapter).record(event.version)
                if rec is not None and rec.evaluation is None:
                    self._pending[event.adapter] = max(event.version, self._pending.get(event.adapter, 0))
                    self._wake.set()

    def _judge(self, adapter: str | None) -> CanaryJudge:
        judge = self._judges.get(adapter)
        if judge is None:
            assert self.config.canary is not None
            judge = self._judges[adapter] = CanaryJudge(
                self.config.canary, self.book, self._publish, adapter=adapter, production=self._production
            )
        return judge

    async def _publish(self, event: AnyEvent) -> None:
        await self.bus.publish(CONTROL, event)
        if isinstance(event, RELEASE_EVENTS):
            self.book.apply(event)

    async def _on_episode(self, msg: Message) -> None:
        event = msg.event
        if isinstance(event, EpisodeStarted) and event.source is EpisodeSource.production:
            self._production.add(event.episode_id)
            return
        for adapter, rel in list(self.book.releases.items()):
            if rel.canary is not None:
                await self._judge(adapter).observe(event)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            # a policy in canary waits: its evaluation slot serves the canary's version
            ready = [a for a in self._pending if self.book.release(a).canary is None]
            for adapter in ready:
                version = self._pending.pop(adapter)
                try:
                    await self.evaluate(version, adapter)
                except Exception as exc:  # one failed evaluation must not stop the next ones
                    log.error("evaluation failed", version=version, adapter=adapter, error=str(exc))

    async def evaluate(self, version: int, adapter: str | None) -> VersionEvaluated:
        """Run the suite on ``version`` and the served version, apply the rules, publish the decision."""
        name = adapter or self.model
        served = self.book.served(adapter)
        figures = figures_of(await self._run_suite(versioned_name(name, version)))
        key = (adapter, served)
        if key not in self._served_figures:
            self._served_figures[key] = figures_of(await self._run_suite(versioned_name(name, served)))
        served_figures = self._served_figures[key]
        failed = [f for r in self.config.rules_for(adapter) if (f := r.check(figures, served_figures))]
        event = VersionEvaluated(
            producer="gates",
            model=self.model,
            adapter=adapter,
            version=version,
            passed=not failed,
            rule=failed[0] if failed else "all rules held",
            figures=figures,
            served_figures={**served_figures, "version": float(served)},
        )
        await self.bus.publish(CONTROL, event)
        self.book.apply(event)
        log.info("version evaluated", version=version, adapter=adapter, passed=event.passed, rule=event.rule)
        if self.on_evaluated is not None:
            self.on_evaluated(event)
        if event.passed and self.config.canary is not None:
            await self._canary(version, adapter)
        elif event.passed and self.config.promote == "auto":
            await self._promote(version, adapter, event)
        return event

    async def _canary(self, version: int, adapter: str | None) -> None:
        assert self.config.canary is not None
        try:
            canary = self.book.plan_canary(
                version, self.config.canary.share, adapter=adapter, by="gate", reason="passed its gates"
            )
        except ReleaseError as exc:
            log.info("passed, not canaried", version=version, adapter=adapter, why=str(exc))
            return
        self._judge(adapter).reset()
        await self._publish(canary)

    async def _promote(self, version: int, adapter: str | None, evaluated: VersionEvaluated) -> None:
        try:
            promoted = self.book.plan_promote(
                version, adapter=adapter, by="gate", reason=evaluated.rule, rule=True
            )
        except ReleaseError as exc:
            log.info("passed, not promoted", version=version, adapter=adapter, why=str(exc))
            return
        await self._publish(promoted)

    async def _run_suite(self, model: str) -> list[EpisodeScored]:
        """Every task of the suite ``samples`` times, ``mode=val``, the calls served by ``model``."""
        wanted = {new_group_id(): task for task in self.tasks}
        got: dict[str, list[EpisodeScored]] = {}
        done = asyncio.Event()
        size = self.config.samples

        async def on_scored(msg: Message) -> None:
            event = msg.event
            if isinstance(event, EpisodeScored) and event.group_id in wanted and not event.superseded:
                got.setdefault(event.group_id, []).append(event)
                if sum(len(v) for v in got.values()) >= len(wanted) * size:
                    done.set()

        sub = await self.bus.subscribe(
            TRANSITIONS, f"gates-eval-{uuid.uuid4().hex[:10]}", on_scored, from_beginning=False
        )
        try:
            agent = self.config.agent_ref()
            for group_id, task in wanted.items():
                for request in RolloutRequested.group(
                    task,
                    agent,
                    size,
                    group_id=group_id,
                    mode=Mode.val,
                    model=model,
                    deadline_s=self.config.deadline_s,
                    producer="gates",
                ):
                    await self.bus.publish(tasks_topic(None), request)
            try:
                await asyncio.wait_for(done.wait(), self.config.timeout_s)
            except TimeoutError:
                log.warning("evaluation timed out", model=model, scored=len(got), wanted=len(wanted))
        finally:
            await sub.stop()
        return [e for events in got.values() for e in events]

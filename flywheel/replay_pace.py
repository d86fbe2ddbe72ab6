"""A replay paced by the trainer's steps (:mod:`flywheel.replay`'s ``pace``): which groups, in which order,
how many to a step, and after which steps to wait for the trainer.

- **Order**: the groups in the order they completed in the recorded run (:func:`completion_order`).
- **Units**: a step is ``groups_per_step`` units, the trainer's batch. A GRPO group is one unit; so is
  each rated production session (:func:`trainer.groups.is_production_session`), as the trainer's loop
  counts each waiting session as one ready group (``trainer.loop``'s ``_collect``).
- **Left out** (``no_signal``): groups whose members all carry the same return (:func:`has_signal`, the
  trainer's own test). A production session is never tested as a group: its signal is its reward
  against its tenant's running baseline (:mod:`trainer.baselines`), so it is always sent.
- **Waits**: the trainer reports a step (``TrainerStepCompleted``) only when its batch trained something.
  A step of production sessions alone trains nothing when every session's reward equals its baseline
  (a tenant's first sessions, all rated alike). :func:`plan_steps` follows the baseline a fresh trainer
  keeps (the default :class:`~trainer.config.AlgorithmConfig`) and marks such a step, so the replay
  sends it without waiting for a step that will not come.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from infra.bus.base import Bus, Message, Subscription
from schemas import CONTROL, EpisodeScored, TrainerStepCompleted
from trainer.advantages import has_variance
from trainer.baselines import ProductionBaselines
from trainer.config import AlgorithmConfig
from trainer.credit import has_excess
from trainer.groups import is_production_session

Group = list[EpisodeScored]


def has_signal(members: Sequence[EpisodeScored]) -> bool:
    """The trainer's own test (trainer.batching): different rewards, or per-call returns that differ."""
    rewards = [float(m.reward or 0.0) for m in members]
    return has_variance(rewards) or any(
        has_excess(t, r) for m, r in zip(members, rewards, strict=True) for t in m.transitions
    )


def is_production_group(members: Sequence[EpisodeScored]) -> bool:
    """A replayed production session (a group of one): trained against its tenant's baseline."""
    return bool(members) and all(is_production_session(m) for m in members)


def completion_order(log: Sequence[EpisodeScored], planned: Sequence[EpisodeScored]) -> list[Group]:
    """``plan_replay``'s copies (``planned``) grouped, in the order the groups completed in ``log``.

    A group completed when its last member was scored (its last place in the log): the order the
    recorded trainer could take the groups in.
    """
    place = {e.episode_id: i for i, e in enumerate(log)}
    by_group: dict[str, Group] = {}
    for event in planned:
        by_group.setdefault(event.group_id, []).append(event)
    return sorted(by_group.values(), key=lambda g: max(place[m.episode_id] for m in g))


@dataclass
class PacedPlan:
    steps: list[list[Group]]  # each step's units: GRPO groups and production sessions (groups of one)
    trains: list[bool]  # per step: whether a fresh trainer would train on it (and report a step)
    no_signal: int  # episodes of the groups left out (every member the same return)
    production: int  # production sessions planned, one unit each


def plan_steps(
    log: Sequence[EpisodeScored],
    planned: Sequence[EpisodeScored],
    groups_per_step: int,
    cfg: AlgorithmConfig | None = None,
) -> PacedPlan:
    """The steps of a paced replay of ``planned`` (module docstring), ``groups_per_step`` units each."""
    kept: list[Group] = []
    no_signal = production = 0
    for group in completion_order(log, planned):
        if is_production_group(group):
            production += 1
            kept.append(group)
        elif has_signal(group):
            kept.append(group)
        else:
            no_signal += len(group)
    steps = [kept[i : i + groups_per_step] for i in range(0, len(kept), groups_per_step)]
    cfg = cfg or AlgorithmConfig()
    baselines = ProductionBaselines()
    trains: list[bool] = []
    for step in steps:
        sessions = [m for g in step if is_production_group(g) for m in g]
        advantages = baselines.advantages(sessions, cfg) if sessions else []
        trains.append(
            any(not is_production_group(g) for g in step)
            or any(abs(adv) > 1e-9 for adv, _ in advantages)
            or any(has_excess(t, float(m.reward or 0.0)) for m in sessions for t in m.transitions)
        )
        baselines.update(sessions, cfg)  # as the trainer does, trained or not
    return PacedPlan(steps, trains, no_signal, production)


class TrainerSteps:
    """Counts the trainer's ``TrainerStepCompleted`` events emitted since it started watching.

    A private consumer group reads the control topic from the beginning and counts only the steps
    emitted after ``start`` (a fresh group's "from now on" could miss a step while it joins).
    """

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.count = 0
        self._since = datetime.now(UTC)
        self._changed = asyncio.Condition()
        self._sub: Subscription | None = None

    async def start(self) -> None:
        await self.bus.ensure_topics([CONTROL])
        self._since = datetime.now(UTC)
        group = f"replay-pace-{uuid.uuid4().hex[:12]}"
        self._sub = await self.bus.subscribe(CONTROL, group, self._handle, from_beginning=True)

    async def _handle(self, message: Message) -> None:
        event = message.event
        if isinstance(event, TrainerStepCompleted) and event.emitted_at >= self._since:
            async with self._changed:
                self.count += 1
                self._changed.notify_all()

    async def wait_beyond(self, count: int, timeout_s: float) -> bool:
        """True once more than ``count`` steps were seen; False after ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s), self._changed:
                await self._changed.wait_for(lambda: self.count > count)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.stop()
            self._sub = None

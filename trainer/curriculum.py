"""A curriculum for the tasks the trainer requests: prefer tasks whose recent groups carried signal.

A GRPO group whose episodes all got the same reward (all solved, or all failed) has zero advantage
everywhere and trains nothing; a batch of such groups is a step spent for nothing. ``SignalCurriculum``
sits between the task source and :class:`trainer.rollouts.RolloutPlanner`:

* after each group it records the task's outcome (:meth:`observe`): a group *with signal* (rewards
  not all equal) puts its task back in a revisit queue, up to ``max_visits`` groups per task; a group
  without signal does not;
* the next task (:meth:`next_task`) is a revisit with probability ``revisit`` while the queue holds
  one (the most recent first: its policy-relative difficulty is the freshest), else the next fresh
  task from the source, skipping fresh tasks whose recorded history (``history``: the event log's
  per-task group rewards from earlier runs, :func:`infra.eventlog` ``task_history``) shows their last
  ``window`` groups all without signal, at most ``max_skips`` in a row.

Nothing here is tied to one scorer: signal means a reward spread within the group, as GRPO sees it.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from schemas import Task


def has_signal(rewards: Sequence[float], eps: float = 1e-9) -> bool:
    """True when the group's rewards differ (GRPO's advantages are not all zero)."""
    return len(rewards) > 1 and max(rewards) - min(rewards) > eps


@dataclass
class CurriculumStats:
    fresh: int = 0
    revisits: int = 0
    skipped: int = 0  # fresh tasks passed over for their recorded history
    groups_with_signal: int = 0
    groups_without_signal: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class SignalCurriculum:
    tasks: Iterator[Task]
    revisit: float = 0.5
    max_visits: int = 4
    window: int = 2
    max_skips: int = 8
    max_queue: int = 256  # revisits waiting; the oldest go first when it is full
    history: Mapping[str, Sequence[Sequence[float]]] = field(default_factory=dict)
    seed: int = 0
    stats: CurriculumStats = field(default_factory=CurriculumStats)

    def __post_init__(self) -> None:
        if not 0.0 <= self.revisit <= 1.0:
            raise ValueError("revisit must be a probability in [0, 1]")
        self._rng = random.Random(self.seed)
        self._queue: deque[Task] = deque(maxlen=self.max_queue)
        self._visits: dict[str, int] = {}

    def next_task(self) -> Task | None:
        """The task of the next group; None when the source is exhausted and nothing waits."""
        if self._queue and self._rng.random() < self.revisit:
            return self._take_revisit()
        skipped = 0
        for task in self.tasks:
            if skipped < self.max_skips and self._known_flat(task.task_id):
                skipped += 1
                self.stats.skipped += 1
                continue
            self.stats.fresh += 1
            self._visits[task.task_id] = self._visits.get(task.task_id, 0) + 1
            return task
        return self._take_revisit() if self._queue else None

    def _take_revisit(self) -> Task:
        task = self._queue.pop()
        self.stats.revisits += 1
        self._visits[task.task_id] = self._visits.get(task.task_id, 0) + 1
        return task

    def _known_flat(self, task_id: str) -> bool:
        groups = list(self.history.get(task_id, ()))[-self.window :]
        return len(groups) >= self.window and not any(has_signal(g) for g in groups)

    def observe(self, task: Task, rewards: Sequence[float]) -> None:
        """A group of ``task`` finished with ``rewards`` (one per episode that was scored)."""
        if has_signal(rewards):
            self.stats.groups_with_signal += 1
            if self._visits.get(task.task_id, 0) < self.max_visits:
                self._queue.append(task)
        else:
            self.stats.groups_without_signal += 1

"""Optional: the trainer asks for its own rollouts, keeping a bounded number of groups in flight.

When the trainer is given tasks, it publishes ``RolloutRequested`` × ``group_size`` per group itself
(docs/architecture.md, flow 1) and so controls how far generation may run ahead of training: in sync mode it asks
for ``B`` groups and waits for them; in async mode it keeps up to ``K`` groups in flight while it trains,
which is what bounds staleness at the source (the staleness rule in :mod:`trainer.batching` is the
backstop). Without tasks the trainer trains on whatever ``EpisodeScored`` arrives.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from infra.bus.base import Bus
from schemas import AgentRef, Mode, RolloutRequested, Task, tasks_topic
from trainer.curriculum import SignalCurriculum


class RolloutPlanner:
    def __init__(
        self,
        bus: Bus,
        tasks: Iterator[Task],
        agent: AgentRef,
        *,
        group_size: int,
        model: str = "policy",
        pool: str | None = None,
        deadline_s: float = 300.0,
        max_attempts: int = 1,
        curriculum: SignalCurriculum | None = None,
    ) -> None:
        """``curriculum``: it picks each group's task (from its own source) and hears every group's
        rewards; ``tasks`` is then unused."""
        self.bus = bus
        self.tasks = tasks
        self.curriculum = curriculum
        self.agent = agent
        self.group_size = group_size
        self.model = model
        self.pool = pool
        self.deadline_s = deadline_s
        self.max_attempts = max_attempts
        self.in_flight: dict[str, int] = {}  # group_id -> weight version when requested
        self._task_of: dict[str, Task] = {}  # group_id -> its task, while in flight (curriculum)
        self.exhausted = False

    async def submit(self, version: int) -> str | None:
        """Request one group of the next task; None when the task iterator is exhausted."""
        task = self._next_task()
        if task is None:
            self.exhausted = True
            return None
        requests = RolloutRequested.group(
            task,
            self.agent,
            self.group_size,
            max_attempts=self.max_attempts,
            mode=Mode.train,
            model=self.model,
            deadline_s=self.deadline_s,
            pool=self.pool,
            producer="trainer",
        )
        for request in requests:
            await self.bus.publish(tasks_topic(self.pool), request)
        group_id = requests[0].group_id
        self.in_flight[group_id] = version
        if self.curriculum is not None:
            self._task_of[group_id] = task
        return group_id

    def _next_task(self) -> Task | None:
        if self.curriculum is not None:
            return self.curriculum.next_task()
        return next(self.tasks, None)

    async def top_up(self, limit: int, version: int) -> int:
        """Submit groups until ``limit`` are in flight; returns how many were submitted."""
        n = 0
        while len(self.in_flight) < limit and not self.exhausted:
            if await self.submit(version) is None:
                break
            n += 1
        return n

    def finished(self, group_id: str, rewards: Sequence[float] | None = None) -> None:
        """``group_id`` is no longer in flight; ``rewards``: its episodes' (None: it was dropped)."""
        self.in_flight.pop(group_id, None)
        task = self._task_of.pop(group_id, None)
        if task is not None and rewards is not None and self.curriculum is not None:
            self.curriculum.observe(task, rewards)

"""The events of ``flywheel.tasks`` (key: task_id): run an agent on a task, or stop the runs of a
group. ``schemas.events`` puts them into the union of every event."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from schemas.common import AgentRef, EventBase, Mode, Task
from schemas.ids import new_group_id


class RolloutRequested(EventBase):
    """Run ``agent`` on ``task`` once (one attempt of one member of a GRPO group)."""

    type: Literal["rollout_requested"] = "rollout_requested"
    task: Task
    agent: AgentRef
    group_id: str = Field(min_length=1, max_length=64)
    group_size: int = Field(default=1, ge=1, le=4096, description="episodes the trainer waits for")
    sample_index: int = Field(default=0, ge=0, description="which member of the group (0..group_size-1)")
    attempt: int = Field(default=0, ge=0)
    max_attempts: int = Field(default=1, ge=1, le=100)
    mode: Mode = Mode.train
    model: str = Field(default="policy", min_length=1, max_length=256)
    deadline_s: float = Field(default=300.0, gt=0, le=7 * 24 * 3600)
    pool: str | None = Field(default=None, max_length=64)

    @property
    def task_id(self) -> str:
        return self.task.task_id

    @classmethod
    def group(
        cls, task: Task, agent: AgentRef, size: int = 1, *, group_id: str | None = None, **fields: Any
    ) -> list[RolloutRequested]:
        """The ``size`` requests of one group on ``task`` (``sample_index`` 0..size-1, a fresh group id
        unless one is given); ``fields`` are the rest (mode, model, deadline_s, pool, producer, ...)."""
        gid = group_id or new_group_id()
        return [
            cls(task=task, agent=agent, group_id=gid, group_size=size, sample_index=i, **fields)
            for i in range(size)
        ]


class RolloutCancelled(EventBase):
    """Stop running (or do not start) the rollouts of ``group_id`` (all of them when ``task_id`` is None)."""

    type: Literal["rollout_cancelled"] = "rollout_cancelled"
    task_id: str = Field(min_length=1, max_length=256)
    group_id: str = Field(min_length=1, max_length=64)
    reason: str = ""


TaskEvent = Annotated[RolloutRequested | RolloutCancelled, Field(discriminator="type")]

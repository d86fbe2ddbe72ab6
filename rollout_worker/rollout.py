"""One rollout: open the episode, run the agent, finish the episode, schedule a retry.

Delivery and duplicates (what a crash can do, and why nothing is lost):
- The worker commits a task's offset only after the episode's ``EpisodeFinished`` (and a retry's
  ``RolloutRequested``) were acknowledged by the bus. A worker that dies mid-episode never committed
  it, so the task is redelivered to another worker of the group and runs again as a *new* episode with
  the *same* ``(group_id, sample_index, attempt)``; the dead episode is left open and is closed by the
  reward service at its deadline (plus grace) as ``cancelled`` + ``superseded``.
- A worker that dies after publishing ``EpisodeFinished`` but before the commit also causes a rerun:
  two finished episodes with the same ``(group_id, sample_index, attempt)``. Consumers count a group
  member once: the first non-superseded ``EpisodeScored`` per ``(group_id, sample_index)`` wins, later
  ones are duplicates. So a group completes exactly once with ``group_size`` members.
- A retry (status in ``retry_statuses`` and attempts left) finishes the failed episode with
  ``superseded=True`` and publishes a new ``RolloutRequested`` with ``attempt + 1``.
- Graceful shutdown hands back what it cannot finish: the episode is finished ``cancelled`` +
  ``superseded`` and the same request (same attempt) is republished for another worker.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from prometheus_client import Counter, Gauge, Histogram

from infra.bus.base import Bus
from infra.logging import get_logger
from infra.tickets import EpisodeTicket, TicketKey
from rollout_worker.llm import LLM
from rollout_worker.runners import AgentResult, AgentRun, AgentRunner, AgentSpecError, Stopwatch
from schemas import (
    AgentKind,
    EpisodeFinished,
    EpisodeStarted,
    EpisodeStatus,
    RolloutRequested,
    new_episode_id,
    new_event_id,
    tasks_topic,
)
from schemas.common import utcnow
from schemas.topics import EPISODES

log = get_logger("rollout_worker")

# a signed episode URL stays valid this long past the episode's deadline (its agent is killed at the
# deadline; the grace covers a call in flight then and clocks that differ by a little)
TICKET_GRACE_S = 120.0
EPISODES_TOTAL = Counter("flywheel_worker_episodes_total", "Episodes finished by this worker", ["status"])
RETRIES_TOTAL = Counter("flywheel_worker_retries_total", "Rollouts republished as a new attempt")
HANDED_BACK_TOTAL = Counter("flywheel_worker_handed_back_total", "Rollouts handed back on shutdown")
RUNNING = Gauge("flywheel_worker_running_episodes", "Episodes running now")
OVERHEAD = Histogram(
    "flywheel_worker_overhead_seconds",
    "Per-episode time spent outside the agent",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
)


class StopReason(StrEnum):
    cancelled = "cancelled"  # RolloutCancelled for its group
    handback = "handback"  # the worker is shutting down


@dataclass(slots=True)
class Running:
    request: RolloutRequested
    episode_id: str
    task: asyncio.Task[AgentResult] | None = None
    stop_reason: StopReason | None = None


@dataclass(slots=True)
class RolloutStats:
    finished: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    handed_back: int = 0
    overhead_ms: list[float] = field(default_factory=list)  # everything but the agent's own run
    agent_ms: list[float] = field(default_factory=list)  # the agent's own run (same episodes, same order)

    def record(self, status: EpisodeStatus, overhead_ms: float, agent_ms: float) -> None:
        self.finished[status.value] = self.finished.get(status.value, 0) + 1
        self.overhead_ms.append(overhead_ms)
        self.agent_ms.append(agent_ms)
        if len(self.overhead_ms) > 10_000:
            del self.overhead_ms[:5_000]
            del self.agent_ms[:5_000]


class RolloutRunner:
    """Runs ``RolloutRequested`` events; shared by the worker's batch handler."""

    def __init__(
        self,
        bus: Bus,
        runners: dict[AgentKind, AgentRunner],
        *,
        gateway_url: str,
        worker_id: str,
        pool: str | None = None,
        retry_statuses: frozenset[EpisodeStatus] = frozenset({EpisodeStatus.error, EpisodeStatus.timeout}),
        tickets: TicketKey | None = None,
    ) -> None:
        self.bus = bus
        self.runners = runners
        self.gateway_url = gateway_url.rstrip("/")
        self.worker_id = worker_id
        self.pool = pool
        self.retry_statuses = retry_statuses
        self.tickets = tickets  # sign episode URLs (infra/tickets.py) so gateways need no lookup
        self.running: dict[str, Running] = {}
        self.cancelled_groups: dict[str, None] = {}  # insertion-ordered, bounded
        self.handing_back = False
        self.stats = RolloutStats()

    def cancel_group(self, group_id: str, task_id: str | None) -> int:
        self.cancelled_groups[group_id] = None
        while len(self.cancelled_groups) > 100_000:
            self.cancelled_groups.pop(next(iter(self.cancelled_groups)))
        hit = 0
        for item in list(self.running.values()):
            if item.request.group_id == group_id and task_id in (None, item.request.task_id):
                self._stop(item, StopReason.cancelled)
                hit += 1
        return hit

    def hand_back_all(self) -> None:
        self.handing_back = True
        for item in list(self.running.values()):
            self._stop(item, StopReason.handback)

    @staticmethod
    def _stop(item: Running, reason: StopReason) -> None:
        item.stop_reason = item.stop_reason or reason
        if item.task is not None:
            item.task.cancel()

    def _segment(self, req: RolloutRequested, episode_id: str, deadline_at: datetime) -> str:
        """The episode URL's path segment: the id, signed into a ticket when this worker has the key."""
        if self.tickets is None:
            return episode_id
        expires = deadline_at.timestamp() + TICKET_GRACE_S
        return self.tickets.sign(EpisodeTicket(episode_id, req.group_id, expires, req.model))

    async def run(self, req: RolloutRequested) -> None:
        watch = Stopwatch()
        episode_id = new_episode_id()
        item = Running(req, episode_id)
        now = datetime.now(UTC)
        deadline_at = now + timedelta(seconds=req.deadline_s)
        llm = LLM(
            f"{self.gateway_url}/episodes/{self._segment(req, episode_id, deadline_at)}/v1",
            episode_id,
            req.model,
        )
        await self.bus.publish(
            EPISODES,
            EpisodeStarted(
                producer=self.worker_id,
                episode_id=episode_id,
                mode=req.mode,
                model=req.model,
                task=req.task,
                agent=req.agent,
                group_id=req.group_id,
                group_size=req.group_size,
                sample_index=req.sample_index,
                attempt=req.attempt,
                deadline_at=deadline_at,
            ),
        )
        self.running[episode_id] = item
        RUNNING.inc()
        try:
            if self.handing_back:
                item.stop_reason = StopReason.handback
            elif req.group_id in self.cancelled_groups:
                item.stop_reason = StopReason.cancelled
            run = AgentRun(
                episode_id=episode_id,
                agent=req.agent,
                task=req.task.model_dump(mode="json"),
                llm=llm,
                deadline_s=req.deadline_s,
                deadline_at=deadline_at,
            )
            result = await self._run_agent(item, run)
        finally:
            self.running.pop(episode_id, None)
            RUNNING.dec()
        await self._finish(item, result, watch)

    async def _run_agent(self, item: Running, run: AgentRun) -> AgentResult:
        if item.stop_reason is not None:
            return _stopped(item.stop_reason, 0.0)
        runner = self.runners.get(run.agent.kind)
        if runner is None:
            return AgentResult(
                EpisodeStatus.error, error=f"this worker has no runner for {run.agent.kind} agents"
            )
        item.task = asyncio.ensure_future(runner.run(run))
        watch = Stopwatch()
        try:
            return await asyncio.shield(item.task)
        except asyncio.CancelledError:
            if item.stop_reason is None:  # the worker itself is being cancelled
                item.task.cancel()
                raise
            # Wait for the runner to clean up (kill the process group / delete the Job).
            with contextlib.suppress(BaseException):
                await item.task
            return _stopped(item.stop_reason, watch.elapsed())
        except AgentSpecError as exc:
            return AgentResult(EpisodeStatus.error, error=str(exc))
        except Exception as exc:  # a runner bug must not take the worker down; the episode records it
            log.exception("runner_failed", episode_id=item.episode_id)
            return AgentResult(EpisodeStatus.error, error=f"runner failed: {type(exc).__name__}: {exc}")

    async def _finish(self, item: Running, result: AgentResult, watch: Stopwatch) -> None:
        req = item.request
        handback = item.stop_reason is StopReason.handback
        retry = (
            not handback
            and item.stop_reason is None
            and result.status in self.retry_statuses
            and req.attempt + 1 < req.max_attempts
        )
        finished = EpisodeFinished(
            producer=self.worker_id,
            episode_id=item.episode_id,
            status=result.status,
            output=result.output,
            error=result.error[-16000:] if result.error else None,
            reported_reward=result.reward,
            duration_s=watch.elapsed(),
            task_id=req.task_id,
            group_id=req.group_id,
            attempt=req.attempt,
            sample_index=req.sample_index,
            superseded=retry or handback,
        )
        await self.bus.publish(EPISODES, finished)
        topic = tasks_topic(req.pool or self.pool)
        if retry:
            await self.bus.publish(topic, self._again(req, req.attempt + 1))
            self.stats.retries += 1
            RETRIES_TOTAL.inc()
        elif handback:
            await self.bus.publish(topic, self._again(req, req.attempt))
            self.stats.handed_back += 1
            HANDED_BACK_TOTAL.inc()
        overhead_s = watch.elapsed() - result.agent_s
        self.stats.record(result.status, overhead_s * 1000, result.agent_s * 1000)
        EPISODES_TOTAL.labels(result.status.value).inc()
        OVERHEAD.observe(overhead_s)
        log.debug(
            "episode_finished",
            episode_id=item.episode_id,
            task_id=req.task_id,
            status=result.status.value,
            retry=retry,
            handed_back=handback,
        )

    def _again(self, req: RolloutRequested, attempt: int) -> RolloutRequested:
        return req.model_copy(
            update={
                "attempt": attempt,
                "event_id": new_event_id(),
                "emitted_at": utcnow(),
                "producer": self.worker_id,
            }
        )


def _stopped(reason: StopReason, agent_s: float) -> AgentResult:
    message = (
        "cancelled by RolloutCancelled" if reason is StopReason.cancelled else "worker shut down; handed back"
    )
    return AgentResult(EpisodeStatus.cancelled, error=message, agent_s=agent_s)

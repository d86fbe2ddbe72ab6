"""The rollout worker: a consumer group on ``flywheel.tasks`` (or ``flywheel.tasks.<pool>``).

Wiring:
- tasks are consumed in batches of up to ``concurrency``; the batch's rollouts run concurrently and the
  batch is committed once every one of them has published its ``EpisodeFinished`` (see
  ``rollout.py`` for what a crash does). A batch waits for its slowest episode, so a worker runs at most
  ``concurrency`` episodes and at least one; add workers (or partitions) to scale out.
- ``RolloutCancelled`` is read through a second, per-worker consumer group that starts at the end of
  the topic, so every worker sees every cancellation while its current batch is still running.
- ``stop()`` stops taking tasks, lets running episodes finish for up to ``shutdown_drain_timeout_s``,
  then hands the rest back (finished ``cancelled`` + ``superseded``; the request is republished).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from infra.bus.base import Bus, Message, Subscription
from infra.logging import get_logger
from rollout_worker.callable_runner import CallableRunner
from rollout_worker.command_runner import CommandRunner
from rollout_worker.kubernetes_runner import KubernetesRunner
from rollout_worker.rollout import RolloutRunner, RolloutStats
from rollout_worker.runners import AgentRunner
from rollout_worker.settings import WorkerSettings
from schemas import EPISODES, AgentKind, RolloutCancelled, RolloutRequested, tasks_topic

log = get_logger("rollout_worker")


def default_runners(settings: WorkerSettings) -> dict[AgentKind, AgentRunner]:
    return {
        AgentKind.command: CommandRunner(
            kill_grace_s=settings.kill_grace_s,
            tail_chars=settings.stderr_tail_chars,
            nice=settings.agent_nice,
        ),
        AgentKind.callable: CallableRunner(threads=settings.concurrency),
        AgentKind.kubernetes: KubernetesRunner(
            namespace=settings.k8s_namespace,
            jobs_per_minute=settings.k8s_jobs_per_minute,
            ttl_after_finished_s=settings.k8s_ttl_after_finished_s,
            poll_s=settings.k8s_poll_s,
        ),
    }


class RolloutWorker:
    def __init__(
        self, bus: Bus, settings: WorkerSettings, runners: dict[AgentKind, AgentRunner] | None = None
    ) -> None:
        self.bus = bus
        self.settings = settings
        self.topic = tasks_topic(settings.pool)
        self.runners = runners if runners is not None else default_runners(settings)
        self.rollouts = RolloutRunner(
            bus,
            self.runners,
            gateway_url=settings.gateway_url,
            worker_id=settings.worker_id,
            pool=settings.pool,
            retry_statuses=frozenset(settings.retry_statuses),
            tickets=settings.ticket_key(),
        )
        self._subs: list[Subscription] = []
        self._stopping = False

    @property
    def stats(self) -> RolloutStats:
        return self.rollouts.stats

    async def start(self) -> None:
        await self.bus.ensure_topics([self.topic, EPISODES])
        self._subs.append(
            await self.bus.subscribe(
                self.topic,
                f"{self.settings.worker_group}.cancel.{self.settings.worker_id}",
                self._on_cancel,
                from_beginning=False,
            )
        )
        self._subs.append(
            await self.bus.subscribe_batch(
                self.topic,
                self.settings.worker_group,
                self._on_batch,
                max_batch=self.settings.concurrency,
                max_wait_s=self.settings.batch_wait_s,
            )
        )
        log.info(
            "worker_started", topic=self.topic, group=self.settings.worker_group, id=self.settings.worker_id
        )

    async def _on_cancel(self, message: Message) -> None:
        if isinstance(message.event, RolloutCancelled):
            hit = self.rollouts.cancel_group(message.event.group_id, message.event.task_id)
            log.info("rollouts_cancelled", group_id=message.event.group_id, running=hit)

    async def _on_batch(self, messages: Sequence[Message]) -> None:
        requests: list[RolloutRequested] = []
        for message in messages:
            event = message.event
            if isinstance(event, RolloutCancelled):
                self.rollouts.cancel_group(event.group_id, event.task_id)
            elif isinstance(event, RolloutRequested):
                requests.append(event)
        # Let every rollout finish before failing the batch (a raise makes the bus redeliver it: the
        # rerun episodes are duplicates that consumers absorb, see rollout.py).
        results = await asyncio.gather(*(self.rollouts.run(r) for r in requests), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def stop(self, drain_timeout_s: float | None = None) -> None:
        """Stop taking tasks; finish running episodes (up to the drain timeout), hand back the rest."""
        if self._stopping:
            return
        self._stopping = True
        timeout = self.settings.shutdown_drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        stopping = asyncio.gather(*(sub.stop() for sub in self._subs))
        done, _ = await asyncio.wait({stopping}, timeout=timeout)
        if not done:
            log.warning("worker_handing_back", running=len(self.rollouts.running))
            self.rollouts.hand_back_all()
            await stopping
        for runner in self.runners.values():
            with contextlib.suppress(Exception):
                await runner.aclose()
        log.info("worker_stopped", id=self.settings.worker_id)

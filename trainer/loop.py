"""The trainer loop every trainer runs: groups in, steps out, the state a restart keeps.

What a step does is the trainer's own (:class:`trainer.service.TrainerService` trains the whole model,
:class:`trainer.policy_service.PolicyTrainerService` one LoRA adapter per policy); the rest is here.
One iteration, top-down::

    wait while paused (``TrainerPauseRequested`` on control; the state outlives a restart in status.json)
    top up rollouts (only when the trainer was given tasks)
    collect B ready groups (complete, or expired at their deadline) and the waiting production sessions
    step_on(groups): the trainer's own step (its module's docstring)

Scored episodes enter through one batch subscription into the intake and the inbox (durable before the
bus commits); a checkpoint keeps the step, the consumed groups, the offsets and the samples per source.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from infra.bus.base import Bus, Message, Subscription
from infra.logging import get_logger
from schemas import (
    CONTROL,
    DEADLETTER,
    TASKS,
    TRANSITIONS,
    EpisodeScored,
    EpisodeSource,
    InferenceDrained,
    InferenceResumed,
    StepMetrics,
    TrainerPauseRequested,
    TrainerResumeRequested,
)
from trainer.backends.base import Backend
from trainer.baselines import ProductionBaselines
from trainer.batching import TrainBatch, build_batch
from trainer.checkpoints import CheckpointInfo, CheckpointMeta, CheckpointStore
from trainer.config import AlgorithmConfig
from trainer.groups import Group, Intake
from trainer.metrics import NullTracker, Tracker, TrainerMetrics
from trainer.rollouts import RolloutPlanner
from trainer.sft import sft_batch
from trainer.status import TrainerStatus, read_status, write_status
from trainer.weights import PipelinedUpdates, UpdateResult, WeightSync

log = get_logger(__name__)


@dataclass(frozen=True)
class LoopConfig:
    mode: Literal["sync", "async"] = "async"
    # sft: cross-entropy on the episodes trainer.sft.select_episodes keeps (reward ≥ sft_reward_threshold)
    objective: Literal["rl", "sft"] = "rl"
    batch_groups: int = 8  # B: groups per training step
    max_in_flight: int = 16  # K: groups requested ahead (async; sync requests exactly B)
    batch_timeout_s: float | None = None  # train on fewer than B ready groups after this long
    sync_every: int = 1  # weight update every N steps
    checkpoint_every: int = 10
    success_threshold: float = 1.0
    model: str = "policy"
    consumer_group: str = "trainer"
    inbox_fsync: bool = True
    # after a scored episode arrives, wait this long for more before the inbox write (one fsync for all)
    intake_wait_s: float = 0.005
    push_on_start: bool = True  # a resumed trainer loads its checkpoint into the engines first
    # every N versions, keep the weights under releases/ and publish VersionProposed (0: never); the
    # gateways serve production only versions promoted from these (gateway/releases.py)
    release_every: int = 0


def keep_release(source: Path, root: Path, version: int) -> Path:
    """A copy of the exported weights ``source`` under ``root/releases`` (kept: a release may serve again)."""
    target = root / "releases" / f"v{version:06d}"
    if target.exists():
        shutil.rmtree(target)
    if source.is_dir():
        shutil.copytree(source, target)
        return target
    target.mkdir(parents=True)
    return Path(shutil.copy2(source, target))


def export_keeping_three(export: Callable[[Path], Path], version: int, root: Path) -> Path:
    """``export`` version ``version`` under ``root/exports`` (a directory a server loads); keeps three."""
    exports = root / "exports"
    path = export(exports / f"v{version:06d}")
    for old in sorted(p for p in exports.iterdir() if p.is_dir())[:-3]:
        shutil.rmtree(old, ignore_errors=True)
    return path


class TrainerLoop:
    def __init__(
        self,
        *,
        bus: Bus,
        backend: Backend,
        weights: WeightSync,
        store: CheckpointStore,
        intake: Intake,
        algo: AlgorithmConfig,
        loop: LoopConfig,
        metrics: TrainerMetrics | None = None,
        tracker: Tracker | None = None,
        planner: RolloutPlanner | None = None,
        base_model: str = "",
    ) -> None:
        self.bus = bus
        self.backend = backend
        self.weights = weights
        self.store = store
        self.intake = intake
        self.algo = algo
        self.loop = loop
        self.metrics = metrics or TrainerMetrics()
        self.tracker: Tracker = tracker or NullTracker()
        self.planner = planner
        self.base_model = base_model
        self.step = 0
        self.last_metrics = StepMetrics()
        self._ready: list[Group] = []
        self._wake = asyncio.Event()
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._pause_reason: str | None = None  # None: not paused
        self._stopping = False
        self._closed = False
        self._subs: list[Subscription] = []
        self._offsets: dict[str, int] = {}
        self._gen_started = time.perf_counter()
        self.batches_without_signal = 0
        self.baselines = ProductionBaselines()
        self.samples_trained: Counter[str] = Counter({src.value: 0 for src in EpisodeSource})
        # what batches left out since the start, per reason (trainer.batching): status.json's ``excluded``
        self.excluded: Counter[str] = Counter()
        self._updates = PipelinedUpdates(weights, self._update_done)

    # ------------------------------------------------------------------ lifecycle
    async def _restore_and_listen(self) -> CheckpointInfo | None:
        """The state every trainer shares (step, consumed groups, offsets, samples, inbox, pause) from
        the newest checkpoint, then the control topic; returns that checkpoint for the weights' restore."""
        latest = self.store.latest()
        if latest is not None:
            self.step = latest.meta.step
            self.intake.mark_consumed(latest.meta.consumed_groups)
            self._offsets = dict(latest.meta.offsets)
            self.samples_trained.update(latest.meta.samples)
        for event in self.store.read_inbox():
            self.intake.add(event)
        self._restore_pause()
        await self.bus.ensure_topics([TRANSITIONS, CONTROL, DEADLETTER, TASKS])
        control_group = f"trainer-control-{uuid.uuid4().hex[:12]}"
        self._subs.append(
            await self.bus.subscribe(CONTROL, control_group, self._on_control, from_beginning=False)
        )
        return latest

    async def _consume_transitions(self) -> None:
        """Subscribe to scored episodes: last, once the weights the trainer starts from are in place."""
        self._subs.append(
            await self.bus.subscribe_batch(
                TRANSITIONS,
                self.loop.consumer_group,
                self._on_transitions,
                max_batch=1024,
                max_wait_s=self.loop.intake_wait_s,
            )
        )

    def request_stop(self) -> None:
        """Make the running :meth:`run` return after the step in progress (a later ``run`` trains again)."""
        self._stopping = True
        self._wake.set()
        self._unpaused.set()

    # ------------------------------------------------------------------ handlers
    async def _on_transitions(self, msgs: Sequence[Message]) -> None:
        """A batch of scored episodes: into the intake, then into the inbox with one write and one fsync.

        The bus commits the batch once this returns, so every accepted episode is durable in the inbox
        by then. Per episode, the open-write-fsync cost ~1 ms of the event loop: 64 of them per demo
        update, while the loop also dispatches the next rollouts.
        """
        accepted: list[EpisodeScored] = []
        for msg in msgs:
            event = msg.event
            self._offsets[f"{msg.topic}/{msg.partition}"] = msg.offset + 1
            if not isinstance(event, EpisodeScored):
                self.metrics.skipped.labels("wrong_type").inc()
                self.intake.skipped["wrong_type"] += 1
                continue
            reason = "other_model" if event.model != self.loop.model else self.intake.add(event)
            if reason == "other_model":
                self.intake.skipped[reason] += 1
            if reason is None:
                accepted.append(event)
            else:
                self.metrics.skipped.labels(reason).inc()
                log.info(
                    "episode_skipped", episode_id=event.episode_id, group_id=event.group_id, reason=reason
                )
        if accepted:
            self.store.append_inbox(accepted, fsync=self.loop.inbox_fsync)
        self._wake.set()

    async def _on_control(self, msg: Message) -> None:
        event = msg.event
        if isinstance(event, InferenceDrained | InferenceResumed):
            await self.weights.observe(event)
        elif isinstance(event, TrainerPauseRequested) and event.model == self.loop.model:
            self._set_paused(event.reason or "paused")
            log.info("trainer_paused", reason=event.reason)
        elif isinstance(event, TrainerResumeRequested) and event.model == self.loop.model:
            self._set_paused(None)
            log.info("trainer_resume_requested")

    # ------------------------------------------------------------------ pause
    # One channel: TrainerPauseRequested / TrainerResumeRequested on flywheel.control (``flywheel trainer
    # pause|resume`` publishes them on Kafka, or through a running stack's ops API). The trainer keeps the
    # state in status.json, so a trainer restarted while paused stays paused until it hears a resume.
    @property
    def paused(self) -> bool:
        return self._pause_reason is not None

    def _set_paused(self, reason: str | None) -> None:
        self._pause_reason = reason
        if reason is None:
            self._unpaused.set()
        else:
            self._unpaused.clear()
        self.metrics.paused.set(0.0 if reason is None else 1.0)
        self._write_status()

    def _restore_pause(self) -> None:
        last = read_status(self.store.root)
        if last is not None and last.paused:
            self._set_paused(last.pause_reason or "paused")
            log.info("trainer_still_paused", reason=last.pause_reason)

    async def _wait_unpaused(self) -> None:
        while self.paused and not self._stopping:
            self._write_status()
            self._unpaused.clear()  # a resume or request_stop() sets it
            await self._unpaused.wait()

    # ------------------------------------------------------------------ collecting
    def _take_ready(self) -> None:
        self._ready.extend(self.intake.ready())
        if self.planner is not None:  # groups dropped at their deadline are no longer in flight
            ready = {g.group_id for g in self._ready}
            for gid in list(self.planner.in_flight):
                if gid in self.intake.consumed and gid not in ready:
                    self.planner.finished(gid)

    async def _collect(self, n: int) -> list[Group] | None:
        """Up to ``n`` ready groups plus every waiting production session (up to the per-step cap).

        Each waiting production session counts as one ready group toward ``n``, so a step with only
        production sessions trains once ``n`` of them wait (or ``batch_timeout_s`` after the first);
        when a step starts they all ride along, beside the live groups, rather than wait for a group.
        """
        first_ready_at: float | None = None
        while not self._stopping:
            self._take_ready()
            units = len(self._ready) + self.intake.production_waiting
            if units and first_ready_at is None:
                first_ready_at = time.monotonic()
            if units >= n:
                break
            timeout = self.loop.batch_timeout_s
            if (
                timeout is not None
                and first_ready_at is not None
                and time.monotonic() - first_ready_at >= timeout
            ):
                break
            if self.planner is not None and self.loop.mode == "async":
                await self.planner.top_up(self.loop.max_in_flight, self.backend.version)
            wait = self.intake.next_deadline_in()
            wait = 0.5 if wait is None else min(max(wait, 0.01), 0.5)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)
        if self._stopping:
            return None
        taken, self._ready = self._ready[:n], self._ready[n:]
        production = self.intake.take_production(self.algo.production_max_per_step)
        if self.planner is not None:
            for g in taken:
                self.planner.finished(g.group_id, [e.reward for e in g.episodes() if e.reward is not None])
            if self.loop.mode == "async":
                # Refill now, not after the step: K groups stay in flight *while* this batch trains.
                # Topping up only after training left K − B groups to generate during the step (measured
                # on the demo's settings, B = 8, K = 12: the engine idled for half of every step).
                await self.planner.top_up(self.loop.max_in_flight, self.backend.version)
        return [*taken, *production]

    # ------------------------------------------------------------------ the loop
    async def run(self, max_steps: int | None = None) -> None:
        """Train until ``max_steps`` steps were taken (None: until :meth:`request_stop` or :meth:`stop`)."""
        if self._closed:
            return
        self._stopping = False
        taken = 0
        while not self._stopping and (max_steps is None or taken < max_steps):
            await self._wait_unpaused()
            if self._stopping:
                break
            if self.planner is not None:
                limit = self.loop.batch_groups if self.loop.mode == "sync" else self.loop.max_in_flight
                if self.loop.mode == "async" or not self.planner.in_flight:
                    await self.planner.top_up(limit, self.backend.version)
                drained = not self.planner.in_flight and not self._ready and self.intake.pending_groups == 0
                if self.planner.exhausted and drained:
                    break
            gen_start = self._gen_started
            groups = await self._collect(self.loop.batch_groups)
            if groups is None:
                break
            gen_seconds = time.perf_counter() - gen_start
            if await self.step_on(groups, gen_seconds):
                taken += 1
        await self._updates.finish()

    async def step_on(self, groups: list[Group], gen_seconds: float) -> bool:
        """Train on ``groups``; False when nothing trained (no signal, failure). Each trainer's own."""
        raise NotImplementedError

    def _batch(self, groups: list[Group], version: int, baselines: ProductionBaselines) -> TrainBatch:
        """The batch of ``groups`` for a policy at ``version``: SFT's selected episodes, or RL's
        advantages against ``baselines``; what it skipped is counted."""
        if self.loop.objective == "sft":
            batch = sft_batch(groups, self.algo.sft_reward_threshold)
        else:
            batch = build_batch(
                groups, self.algo, version, success_threshold=self.loop.success_threshold, baselines=baselines
            )
            # the sessions are consumed now, trained or not: their rewards are the baseline's history
            baselines.update(batch.production, self.algo)
        for reason, n in batch.stats.skipped.items():
            self.metrics.skipped.labels(reason).inc(n)
        self.excluded.update(batch.stats.skipped)
        if not batch.samples:  # a batch that trains nothing publishes no step: the status says why
            self._write_status()
        return batch

    def _update_done(self, result: UpdateResult) -> None:
        self.metrics.weight_updates.labels("activated" if result.activated else "failed").inc()
        self.metrics.serving_version.set(self.weights.serving_version)
        self.last_metrics = self.last_metrics.updated(
            {
                "serving_version": float(self.weights.serving_version),
                "drain_ms": result.drain_ms,
                "load_ms": result.load_ms,
                "gateways_missing": float(len(result.missing)),
                "weight_update_failed": 0.0 if result.activated else 1.0,
            }
        )
        self._write_status()

    # ------------------------------------------------------------------ persistence
    def _shared_meta(self, version: int, config: dict[str, Any]) -> CheckpointMeta:
        """What every trainer's checkpoint holds: step, consumed group ids, bus offsets, samples."""
        pending_groups = {g.group_id for g in self._ready}
        return CheckpointMeta(
            version=version,
            step=self.step,
            model=self.loop.model,
            base_model=self.base_model,
            config=config,
            consumed_groups=self.intake.consumed_ids(excluding=pending_groups)[-200_000:],
            offsets=dict(self._offsets),
            samples=dict(self.samples_trained),
        )

    def _save_shared(self, meta: CheckpointMeta, save: Callable[[Path], Any]) -> Path:
        """Save ``meta`` (with ``save`` writing the weights) and rewrite the inbox to what is pending."""
        path = self.store.save(meta, save)
        pending: list[EpisodeScored] = [e for g in self._ready for e in g.episodes()]
        self.store.rewrite_inbox([*pending, *self.intake.pending_events()])
        return path

    def status(self) -> TrainerStatus:
        return TrainerStatus(
            model=self.loop.model,
            step=self.step,
            version=self.backend.version,
            serving_version=self.weights.serving_version,
            paused=self.paused,
            pause_reason=self._pause_reason or "",
            mode=self.loop.mode,
            pending_groups=self.intake.pending_groups,
            pending_production=self.intake.production_waiting,
            samples=dict(self.samples_trained),  # cumulative, per episode source
            ready_groups=len(self._ready),
            skipped=dict(self.intake.skipped),
            excluded={k: v for k, v in sorted(self.excluded.items()) if v},
            known_gateways=sorted(self.weights.known_gateways),
            metrics=self.last_metrics,
            updated_at=time.time(),
        )

    def _write_status(self) -> None:
        write_status(self.store.root, self.status())

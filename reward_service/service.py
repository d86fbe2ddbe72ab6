"""The reward service's core: episode events in, ``EpisodeScored`` out.

Per batch of episode events: journal each event (``state.py``), score every episode that finished,
assemble its transitions, publish ``EpisodeScored`` keyed by ``group_id``, forget the episode, and make
the journal durable before the batch is committed. ``EpisodeScored`` carries a deterministic
``event_id`` (derived from the episode id), so a batch redelivered after a crash republishes the same
event and consumers deduplicate it.

Feedback after scoring (``RewardReported(origin=feedback)`` for a production session already scored)
re-scores it: the session is retained by the store (``state.py``: bounded, compact, durable with the
journal), the new feedback is added, and the session is published again as ``EpisodeScored`` with
``score_revision`` one higher and an ``event_id`` derived from (episode, revision), so a redelivered
feedback republishes the same event and consumers deduplicate it. Feedback that changes nothing (no
mappable rating, the same reward) is kept without a new revision. Feedback for a session the store no
longer holds goes to ``flywheel.deadletter`` with the reason (and is counted): the gateway refuses
feedback past ``feedback_window_s`` with a 409, so this happens only when the count bound evicted the
session earlier or the service lost its state.

A sweeper closes what no one else will: production sessions idle for ``idle_timeout_s``, live
episodes abandoned past their deadline + grace (their worker died; the task was redelivered as another
episode), and episodes opened without a deadline (by hand) that have been silent for ``idle_timeout_s``
get an ``EpisodeFinished`` published on their behalf, which then flows through the same path.
Judge rankings wait for their whole group, or for ``group_timeout_s``.

Scale-out (``changelog=True``, ``changelog.py``): the store's changes go to ``flywheel.reward-state``
before each batch is committed, and the state of every partition of ``flywheel.episodes`` this instance
is given is rebuilt from there before any of its events is handled; the state of a partition it loses
is dropped. Several instances in one group then score each episode once, from all its calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from prometheus_client import Counter

from infra.bus.base import Bus, Message
from infra.logging import get_logger
from reward_service import changelog as state_log
from reward_service.scoring import Outcome, Scoring, is_rank, scorer_for
from reward_service.selection import CallSelector
from reward_service.state import EpisodeRecord, EpisodeStore
from reward_service.transitions import assemble
from schemas import (
    DEADLETTER,
    EPISODES,
    REWARD_STATE,
    TRANSITIONS,
    DeadLetter,
    EpisodeFinished,
    EpisodeScored,
    EpisodeSource,
    EpisodeStarted,
    EpisodeStatus,
    LLMCallRecorded,
    Mode,
    RewardOrigin,
    RewardReported,
    ScorerSpec,
    encode,
)
from schemas.scorers import ScorerOptions

log = get_logger("reward_service")

SCORED = Counter("flywheel_reward_episodes_scored_total", "Episodes scored", ["reward_source"])
UNUSABLE = Counter(
    "flywheel_reward_episodes_unusable_total", "Episodes without usable transitions", ["reason"]
)
SCORE_ERRORS = Counter("flywheel_reward_score_errors_total", "Episodes a scorer failed on")
PREFIX_MISMATCH = Counter("flywheel_reward_prefix_mismatches_total", "Calls that did not extend the last one")
RENUMBERED = Counter(
    "flywheel_reward_calls_renumbered_total", "Calls whose call_seq another had (ordering.py)"
)
CLOSED = Counter("flywheel_reward_episodes_closed_total", "Episodes closed by the service", ["why"])
LATE_FEEDBACK = Counter(
    "flywheel_reward_late_feedback_total", "Feedback that arrived after its session was scored", ["outcome"]
)


def scored_event_id(episode_id: str, revision: int = 0) -> str:
    """Deterministic per (episode, revision): a redelivered batch republishes the same event."""
    key = f"episode-scored:{episode_id}" + (f":{revision}" if revision else "")
    return hashlib.sha256(key.encode()).hexdigest()[:32]


@dataclass(slots=True)
class RewardStats:
    scored: int = 0
    unusable: dict[str, int] = field(default_factory=dict)
    score_errors: int = 0
    late_events: int = 0
    rescored: int = 0  # late feedback that published a new revision
    feedback_unchanged: int = 0  # late feedback kept without a new revision (no new reward)
    context_calls: int = 0  # calls the selector kept out of training (selection.py)
    feedback_unheld: int = 0  # late feedback for a session no longer held: sent to the dead-letter topic
    restored: int = 0  # changelog records replayed into the store (partitions given to this instance)
    forgotten: int = 0  # open episodes dropped with a partition given to another instance
    renumbered: int = 0  # episodes numbered by several gateways, numbered again (ordering.py)


class RewardService:
    def __init__(
        self,
        bus: Bus,
        scoring: Scoring,
        store: EpisodeStore,
        *,
        group: str = "reward-service",
        discount: float = 1.0,
        idle_timeout_s: float = 300.0,
        abandon_grace_s: float = 60.0,
        group_timeout_s: float = 600.0,
        sweep_interval_s: float = 1.0,
        max_batch: int = 500,
        batch_wait_s: float = 0.05,
        producer: str = "reward-service",
        selector: CallSelector | None = None,
    ) -> None:
        self.bus = bus
        self.scoring = scoring
        self.store = store
        self.group = group
        self.discount = discount
        self.idle_timeout_s = idle_timeout_s
        self.abandon_grace_s = abandon_grace_s
        self.group_timeout_s = group_timeout_s
        self.sweep_interval_s = sweep_interval_s
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.producer = producer
        self.selector = selector or CallSelector()
        self.stats = RewardStats()
        self.waiting_groups: dict[str, float] = {}  # rank-mode group → first finish (monotonic)
        self._sub: object | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        # with a changelog: the partitions of flywheel.episodes whose state this instance holds
        self.owned: set[int] | None = set() if store.changes is not None else None

    async def start(self) -> None:
        topics = [EPISODES, TRANSITIONS, DEADLETTER] + ([REWARD_STATE] if self.owned is not None else [])
        await self.bus.ensure_topics(topics)
        self._wait_for_groups()  # the open episodes rebuilt from the journal
        self._sub = await self.bus.subscribe_batch(
            EPISODES,
            self.group,
            self.handle,
            max_batch=self.max_batch,
            max_wait_s=self.batch_wait_s,
            on_assigned=self.assigned if self.owned is not None else None,
        )
        self._sweeper = asyncio.create_task(self._sweep_forever())
        log.info("reward_service_started", group=self.group, open_episodes=len(self.store.open))

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._sub is not None:
            await self._sub.stop()  # type: ignore[attr-defined]
        self.store.shutdown()
        await self.scoring.aclose()
        log.info("reward_service_stopped", scored=self.stats.scored)

    def _wait_for_groups(self) -> None:
        for record in list(self.store.open.values()):
            if record.finished is not None and is_rank(scorer_for(record, "none")) and record.started:
                self.waiting_groups.setdefault(record.started.group_id or record.episode_id, time.monotonic())

    # ---------------------------------------------------------------------------- the changelog

    async def assigned(self, partitions: frozenset[int]) -> None:
        """The group gave this instance ``partitions``: drop the state of those it lost, restore the new."""
        async with self._lock:
            assert self.owned is not None
            lost = self.owned - partitions
            if lost:
                self.stats.forgotten += state_log.forget(self.store, lost)
                self.owned -= lost
            await self._restore(partitions - self.owned)

    async def _restore(self, partitions: set[int] | frozenset[int]) -> None:
        """Rebuild the state of ``partitions`` from the changelog (under the lock)."""
        assert self.owned is not None
        if partitions:
            self.stats.restored += await state_log.restore_partitions(self.bus, self.store, partitions)
            self.owned |= partitions
            self._wait_for_groups()

    # ---------------------------------------------------------------------------- the handler

    async def handle(self, messages: Sequence[Message]) -> None:
        async with self._lock:
            if self.owned is not None:  # a partition not restored yet (a bus without the hook): first
                await self._restore({m.partition for m in messages} - self.owned)
            finished: dict[str, EpisodeRecord] = {}
            late_feedback: list[RewardReported] = []
            for message in messages:
                event = message.event
                if not isinstance(event, EpisodeStarted | LLMCallRecorded | RewardReported | EpisodeFinished):
                    continue
                record = self.store.add(event)
                if record is None:
                    if isinstance(event, RewardReported) and event.origin is RewardOrigin.feedback:
                        late_feedback.append(event)
                    else:
                        self.stats.late_events += 1
                    continue
                if isinstance(event, EpisodeFinished) and record.finished is event:
                    finished[record.episode_id] = record
            ranked: list[EpisodeRecord] = []
            direct: list[EpisodeRecord] = []
            for record in finished.values():
                spec = scorer_for(record, self.scoring.production_scorer)
                (ranked if is_rank(spec) and not _superseded(record) else direct).append(record)
            outcomes = await asyncio.gather(*(self.scoring.score(r) for r in direct))
            for record, outcome in zip(direct, outcomes, strict=True):
                await self._publish(record, outcome)
            for record in ranked:
                self.waiting_groups.setdefault(_group_id(record), time.monotonic())
            await self._rank_ready(force=False)
            for feedback in late_feedback:
                await self._rescore(feedback)
            await state_log.write_changes(self.bus, self.store)
            self.store.flush()

    async def _rescore(self, feedback: RewardReported) -> None:
        """Feedback after scoring: publish the session again with the new reward, one revision up."""
        held = self.store.retained_record(feedback.episode_id)
        if held is None:
            self.stats.feedback_unheld += 1
            LATE_FEEDBACK.labels("unheld").inc()
            reason = (
                f"feedback for episode {feedback.episode_id} arrived after it was scored, and the reward "
                f"service no longer holds it (retains {self.store.retain} sessions for "
                f"{self.store.retain_s:g}s): not re-scored"
            )
            log.warning("late_feedback_unheld", episode_id=feedback.episode_id)
            await self.bus.publish(
                DEADLETTER,
                DeadLetter(
                    producer=self.producer,
                    original_topic=EPISODES,
                    key=feedback.episode_id,
                    consumer_group=self.group,
                    error_type="FeedbackNotHeld",
                    error=reason,
                    payload=encode(feedback).decode("utf-8", "replace"),
                ),
            )
            return
        record, revision = held
        before = self.scoring.feedback.episode_reward(record.rewards)
        if not record.add(feedback):
            return  # a redelivery of feedback already applied
        self.store.note(feedback)
        value = self.scoring.feedback.episode_reward(record.rewards)
        if value is None or value == before:
            self.stats.feedback_unchanged += 1
            LATE_FEEDBACK.labels("unchanged").inc()
            self.store.keep(record, revision=revision)
            return
        await self._publish(record, Outcome(value, "feedback"), revision=revision + 1)
        self.stats.rescored += 1
        LATE_FEEDBACK.labels("rescored").inc()

    async def _rank_ready(self, *, force: bool) -> None:
        now = time.monotonic()
        for group_id, since in list(self.waiting_groups.items()):
            members = [
                r
                for r in self.store.open.values()
                if r.finished is not None and _group_id(r) == group_id and not _superseded(r)
            ]
            if not members:
                self.waiting_groups.pop(group_id, None)
                continue
            size = members[0].started.group_size if members[0].started is not None else 1
            distinct = {r.finished.sample_index for r in members if r.finished is not None}
            if len(distinct) < size and not force and now - since < self.group_timeout_s:
                continue
            self.waiting_groups.pop(group_id, None)
            members.sort(key=lambda r: (r.finished.sample_index if r.finished else 0, r.episode_id))
            spec = scorer_for(members[0], "none") or ScorerSpec(name="judge")
            outcomes = await self.scoring.rank(members, spec)
            for record, outcome in zip(members, outcomes, strict=True):
                await self._publish(record, outcome)

    async def _publish(self, record: EpisodeRecord, outcome: Outcome, *, revision: int = 0) -> None:
        started, finished = record.started, record.finished
        assert finished is not None
        task = started.task if started is not None else None
        chosen: float | None = None
        if task is not None:
            with contextlib.suppress(ValueError):  # an unknown scorer's options: the default discount
                chosen = task.scorer.options_as(ScorerOptions).discount
        discount = self.discount if chosen is None else chosen
        call_rewards = {
            r.call_seq: r.value
            for r in record.rewards
            if r.call_seq is not None and r.value is not None and r.origin is RewardOrigin.agent
        }
        calls = record.ordered_calls()
        trained, context = self.selector.split(calls)
        assembly = assemble(
            trained,
            reward=outcome.reward if outcome.reward is not None else 0.0,
            call_rewards=call_rewards,
            discount=float(discount) if isinstance(discount, int | float) else self.discount,
        )
        reason = assembly.unusable_reason(len(trained))
        if calls and not trained:
            reason = "no_selected_calls"
        if started is None and not calls and record.source is EpisodeSource.live:
            reason = "state_lost"
        elif reason is None and outcome.error is not None:
            reason = "score_error"
        elif reason is None and outcome.reward is None:
            reason = "unscored"
        scored = EpisodeScored(
            event_id=scored_event_id(record.episode_id, revision),
            producer=self.producer,
            episode_id=record.episode_id,
            group_id=_group_id(record),
            group_size=started.group_size if started is not None else 1,
            task_id=finished.task_id or (started.task_id if started is not None else None),
            attempt=finished.attempt if finished.attempt else (started.attempt if started else 0),
            sample_index=finished.sample_index or (started.sample_index if started else 0),
            source=record.source,
            mode=started.mode if started is not None else Mode.train,
            model=started.model if started is not None else "policy",
            tenant=record.tenant,
            status=finished.status,
            reward=outcome.reward,
            reward_source=outcome.source,
            score_error=outcome.error,
            score_note=outcome.note[:8192] or None,
            num_calls=len(calls),
            context_calls=len(context),
            prefix_mismatches=assembly.prefix_mismatches,
            transitions=assembly.transitions,
            unusable_reason=reason,
            finished_at=finished.emitted_at,
            superseded=finished.superseded,
            score_revision=revision,
        )
        await self.bus.publish(TRANSITIONS, scored)
        self.store.note(state_log.marker(scored))
        if revision == 0:
            self.store.close(record.episode_id)
        else:
            self.store.keep(record, revision=revision)
            return  # counted as a re-score, not as another scored episode
        self.stats.scored += 1
        self.stats.context_calls += len(context)
        if reused := record.reused_seqs:  # several gateways numbered it: ordered by the conversation
            self.stats.renumbered += 1
            RENUMBERED.inc(reused)
            log.info("calls_renumbered", episode_id=record.episode_id, calls=len(calls), reused=reused)
        SCORED.labels(outcome.source).inc()
        PREFIX_MISMATCH.inc(assembly.prefix_mismatches)
        if outcome.error is not None:
            self.stats.score_errors += 1
            SCORE_ERRORS.inc()
        if reason is not None:
            self.stats.unusable[reason] = self.stats.unusable.get(reason, 0) + 1
            UNUSABLE.labels(reason).inc()

    # ---------------------------------------------------------------------------- the sweeper

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_s)
            try:
                await self.sweep()
            except Exception:  # the sweeper must survive a bus hiccup; the next round retries
                log.exception("sweep_failed")

    async def sweep(self, now_wall: datetime | None = None) -> None:
        """Close idle production sessions and abandoned live episodes; rank groups that timed out."""
        now = time.monotonic()
        wall = now_wall or datetime.now(UTC)
        for record in list(self.store.open.values()):
            if record.finished is not None or record.closing:
                continue
            if record.source is EpisodeSource.production:
                if now - record.last_event_at >= self.idle_timeout_s:
                    await self._close(record, EpisodeStatus.ok, None, "idle")
            elif record.started is not None and record.started.deadline_at is not None:
                if (wall - record.started.deadline_at).total_seconds() >= self.abandon_grace_s:
                    await self._close(
                        record,
                        EpisodeStatus.cancelled,
                        "abandoned: no EpisodeFinished by the deadline",
                        "abandoned",
                    )
            elif now - record.last_event_at >= self.idle_timeout_s:
                if record.started is None:
                    await self._close(
                        record, EpisodeStatus.cancelled, "abandoned: no EpisodeStarted", "orphan"
                    )
                else:  # opened without a deadline (by hand, through the admin API) and never finished
                    error = f"abandoned: no event for {self.idle_timeout_s:g}s and no EpisodeFinished"
                    await self._close(record, EpisodeStatus.cancelled, error, "abandoned_idle")
        async with self._lock:
            await self._rank_ready(force=False)
            await state_log.write_changes(self.bus, self.store)
            self.store.flush()

    async def _close(self, record: EpisodeRecord, status: EpisodeStatus, error: str | None, why: str) -> None:
        started = record.started
        await self.bus.publish(
            EPISODES,
            EpisodeFinished(
                producer=self.producer,
                episode_id=record.episode_id,
                status=status,
                error=error,
                num_calls=len(record.calls),
                task_id=started.task_id if started is not None else None,
                group_id=started.group_id if started is not None else None,
                attempt=started.attempt if started is not None else 0,
                sample_index=started.sample_index if started is not None else 0,
                source=record.source,
                tenant=record.tenant,
                superseded=why == "abandoned",
            ),
        )
        record.closing = True
        CLOSED.labels(why).inc()


def _group_id(record: EpisodeRecord) -> str:
    if record.finished is not None and record.finished.group_id:
        return record.finished.group_id
    if record.started is not None and record.started.group_id:
        return record.started.group_id
    return record.episode_id  # a production session is a group of one


def _superseded(record: EpisodeRecord) -> bool:
    return record.finished is not None and record.finished.superseded

"""The reward service's state follows the partitions of ``flywheel.episodes`` (Kafka Streams' changelog).

Several reward services share one consumer group; Kafka moves a partition of ``flywheel.episodes`` from
one to another whenever an instance joins or leaves. The per-episode state (the open episodes' events,
which episodes are done, the scored production sessions retained for late feedback) must move with it,
or the new owner would score an episode from the calls it saw after the move.

So the state is also written to ``flywheel.reward-state``, keyed by ``episode_id`` like the episodes
topic and with as many partitions (``schemas.TOPICS``): changelog partition p holds the state of episodes
partition p. What is appended, per batch, before the batch's offsets are committed (a crash between the
two re-delivers the batch; the records carry their ``event_id`` and the restore deduplicates them):

- every episode event the store kept (``EpisodeStore.add``) and every feedback event applied to a
  retained session (``RewardService._rescore``), as they are;
- the ``EpisodeScored`` the service published, without its transitions, as the "scored" marker:
  revision 0 closes the episode (done; a production session is retained), a later revision re-stamps
  the retained session's revision.

When the group gives an instance partitions (``Bus.subscribe_batch(on_assigned=...)``, after their
previous holder committed its last block), it drops the episodes of the partitions it lost and
:func:`restore` replays the changelog partitions it gained, from their start, through the same store
transitions; a batch of a partition not restored yet restores it first.

The topic is not compacted: every record of an episode shares its key, and compaction would keep only
the last one. It is deleted by time instead (``retention.ms``, 8 days: the default feedback window and a
day), so a restore reads everything of the partition written in that time (docs/limits.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from infra.bus.base import Bus
from infra.bus.partitioner import partition_for
from infra.logging import get_logger
from reward_service.state import Change, EpisodeStore
from schemas import (
    EPISODES,
    REWARD_STATE,
    TOPICS,
    EpisodeFinished,
    EpisodeScored,
    EpisodeStarted,
    LLMCallRecorded,
    RewardReported,
)

log = get_logger("reward_service")

PARTITIONS = TOPICS[EPISODES].partitions


def partition_of(episode_id: str) -> int:
    """The partition of ``flywheel.episodes`` (and of the changelog) that holds ``episode_id``."""
    return partition_for(episode_id, PARTITIONS)


def marker(scored: EpisodeScored) -> EpisodeScored:
    """The changelog's "scored" record: the event without the transitions (the bulk of it)."""
    return scored.model_copy(update={"transitions": [], "score_note": None})


def forget(store: EpisodeStore, partitions: Iterable[int]) -> int:
    """Drop the state of the episodes of ``partitions`` (lost to another instance); open ones dropped."""
    lost = frozenset(partitions)
    return store.forget(lambda episode_id: partition_of(episode_id) in lost) if lost else 0


def restore(store: EpisodeStore, changes: Iterable[Change]) -> int:
    """Replay changelog records into ``store`` (nothing is queued again); the number applied."""
    queued, store.changes = store.changes, None
    applied = 0
    try:
        for change in changes:
            applied += apply(store, change)
    finally:
        store.changes = queued
    return applied


def apply(store: EpisodeStore, change: Change) -> bool:
    """One record, through the transition the service made when it wrote it."""
    episode_id = change.episode_id
    if isinstance(change, EpisodeScored):
        at = change.emitted_at.timestamp()
        if change.score_revision == 0:
            if episode_id in store.done:
                return False  # a marker written again by a retried batch
            store.close(episode_id, at=at)
            return True
        held = store.retained_record(episode_id)
        if held is None or held[1] >= change.score_revision:
            return False
        store.keep(held[0], revision=change.score_revision, at=at)
        return True
    if isinstance(change, RewardReported) and episode_id in store.done:  # feedback after scoring
        held = store.retained_record(episode_id)
        if held is None or not held[0].add(change):
            return False
        store.keep(held[0], revision=held[1], at=change.emitted_at.timestamp())
        return True
    before = store.open.get(episode_id)
    seen = len(before.seen) if before is not None else 0
    record = store.add(change)
    return record is not None and len(record.seen) > seen


async def write_changes(bus: Bus, store: EpisodeStore) -> None:
    """Append the store's queued changes to the changelog, in order per episode (before the commit)."""
    changes = store.changes
    if not changes:
        return
    per_episode: dict[str, list[Change]] = {}
    for change in changes:
        per_episode.setdefault(change.episode_id, []).append(change)

    async def write(records: list[Change]) -> None:
        for record in records:
            await bus.publish(REWARD_STATE, record, key=record.episode_id)

    await asyncio.gather(*(write(records) for records in per_episode.values()))
    del changes[: sum(map(len, per_episode.values()))]  # kept on failure: the retried batch writes them


async def restore_partitions(bus: Bus, store: EpisodeStore, partitions: Iterable[int]) -> int:
    """Rebuild the state of ``partitions`` from the changelog; the number of records applied."""
    wanted = sorted(partitions)
    forget(store, wanted)  # whatever is left of an earlier hold of these partitions is stale
    read = await bus.read_partitions(REWARD_STATE, wanted)
    applied = 0
    for p in wanted:
        changes = [
            m.event
            for m in read.get(p, [])
            if isinstance(
                m.event, EpisodeStarted | LLMCallRecorded | RewardReported | EpisodeFinished | EpisodeScored
            )
        ]
        applied += restore(store, changes)
    log.info("reward_state_restored", partitions=wanted, applied=applied, open_episodes=len(store.open))
    return applied

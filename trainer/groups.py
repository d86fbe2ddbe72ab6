"""Intake: ``EpisodeScored`` events in, complete (or expired) GRPO groups out.

Rules, in the order they apply to an arriving event:

- the same ``event_id`` twice is a duplicate (``duplicate_event``);
- an episode of a group that was already trained or dropped is skipped (``group_consumed``) — this is
  what keeps a restarted trainer from training twice on redelivered events; a re-score
  (``score_revision > 0``) of one is ``rescore_after_trained``;
- ``mode=val`` episodes are not training data (``not_train``);
- malformed transitions (lengths disagree, empty response, ids outside the vocabulary, non-finite
  logprobs) are skipped whole (``malformed:<what>``);
- an episode marked ``superseded`` leaves its group (``superseded``): another episode replaces it;
- a re-scored episode (same ``episode_id``, higher ``score_revision``) replaces the earlier score; a
  lower revision after a higher one, or the same re-score twice, is skipped (``older_revision``);
- a production session (:func:`is_production_session`: ``source=production``, or a replay of one) joins
  no group: it waits on its own until the next step takes it (:meth:`Intake.take_production`), and
  is trained against its tenant's baseline (:mod:`trainer.baselines`); one without a reward (no
  feedback, no scorer) is skipped as ``no_reward`` and one without transitions as ``no_transitions``
  — neither is trained with a fill value;
- a retry (``attempt > 0``) replaces the earlier attempt of the same group member — same ``task_id``
  and ``sample_index``, lower ``attempt`` (``superseded_attempt``) — so each member counts once, with
  its latest attempt; a late earlier attempt after a retry is skipped (``older_attempt``).

Episodes without usable transitions still count toward completing their group, and their reward still
enters the group baseline; they just contribute no tokens. A group is ready when it has
``group_size`` members, or when ``group_timeout_s`` has passed since its first episode: then it is
trained on partially (``partial="train"``, with at least ``min_partial`` rewarded members) or dropped.
Nothing here raises on bad data: every skip is counted by reason in :attr:`Intake.skipped`.
"""

from __future__ import annotations

import math
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from schemas import EpisodeScored, EpisodeSource, Mode
from trainer.credit import segments_valid


@dataclass
class Group:
    group_id: str
    group_size: int
    first_seen: float
    members: dict[str, EpisodeScored] = field(default_factory=dict)  # episode_id -> latest score
    expired: bool = False

    @property
    def complete(self) -> bool:
        return len(self.members) >= self.group_size

    def episodes(self) -> list[EpisodeScored]:
        return list(self.members.values())


def is_production_session(event: EpisodeScored) -> bool:
    """A deployed agent's session, live (``source=production``) or replayed from the event log
    (``source=replay`` with ``recorded_source=production``): a group of one, with a per-tenant baseline."""
    return event.source == EpisodeSource.production or (
        event.source == EpisodeSource.replay and event.recorded_source == EpisodeSource.production
    )


def malformed_reason(event: EpisodeScored, vocab_size: int | None = None) -> str | None:
    """Why ``event``'s transitions cannot be trained on, or None when they can."""
    for t in event.transitions:
        n = len(t.response_ids)
        if n == 0:
            return "malformed:empty_response"
        if len(t.response_mask) != n:
            return "malformed:mask_length"
        if len(t.behaviour_logprobs) != n:
            return "malformed:logprobs_length"
        if any(m not in (0, 1) for m in t.response_mask):
            return "malformed:mask_values"
        if not any(t.response_mask):
            return "malformed:empty_mask"
        if any(not math.isfinite(lp) or lp > 1e-4 for lp in t.behaviour_logprobs):
            return "malformed:logprobs_values"
        if not segments_valid(t):
            return "malformed:segments"
        if vocab_size is not None and any(i < 0 or i >= vocab_size for i in (*t.prompt_ids, *t.response_ids)):
            return "malformed:token_out_of_vocab"
    return None


def _older_revision(event: EpisodeScored, previous: EpisodeScored) -> bool:
    """``event`` does not supersede ``previous``: a lower revision, or the same re-score again."""
    return event.score_revision < previous.score_revision or (
        event.score_revision == previous.score_revision > 0
    )


class Intake:
    def __init__(
        self,
        *,
        group_timeout_s: float = 600.0,
        partial: Literal["train", "drop"] = "train",
        min_partial: int = 2,
        vocab_size: int | None = None,
        consumed: Iterable[str] = (),
        clock: Callable[[], float] = time.monotonic,
        seen_capacity: int = 200_000,
    ) -> None:
        self.group_timeout_s = group_timeout_s
        self.partial = partial
        self.min_partial = min_partial
        self.vocab_size = vocab_size
        self._seen_capacity = seen_capacity
        # trained or dropped groups, at most ``seen_capacity`` of them (oldest out): a late episode of a
        # group older than that is taken again, as after a restart from a checkpoint that kept as many
        self.consumed: set[str] = set()
        self._consumed_order: deque[str] = deque()
        for gid in consumed:
            self._consume(gid)
        self.skipped: Counter[str] = Counter()
        self.dropped_groups: Counter[str] = Counter()
        self._clock = clock
        self._groups: dict[str, Group] = {}
        self._production: dict[str, EpisodeScored] = {}  # episode_id -> latest score, arrival order
        self._seen: OrderedDict[str, None] = OrderedDict()

    # ------------------------------------------------------------------ intake
    def add(self, event: EpisodeScored) -> str | None:
        """Buffer one event; returns the skip reason, or None when it was taken."""
        # a re-score may keep the first score's event id: the revision makes it a different event
        seen_key = (
            event.event_id if event.score_revision == 0 else f"{event.event_id}#r{event.score_revision}"
        )
        if seen_key in self._seen:
            return self._skip("duplicate_event")
        self._remember(seen_key)
        if event.group_id in self.consumed:
            return self._skip("rescore_after_trained" if event.score_revision > 0 else "group_consumed")
        if event.mode != Mode.train:
            return self._skip("not_train")
        reason = malformed_reason(event, self.vocab_size)
        if reason is not None:
            return self._skip(reason)
        if is_production_session(event):
            return self._add_production(event)
        group = self._groups.get(event.group_id)
        if event.superseded:
            if group is not None:
                group.members.pop(event.episode_id, None)
            return self._skip("superseded")
        if group is None:
            group = Group(event.group_id, event.group_size, self._clock())
            self._groups[event.group_id] = group
        group.group_size = max(group.group_size, event.group_size)
        previous = group.members.get(event.episode_id)
        if previous is not None and _older_revision(event, previous):
            return self._skip("older_revision")
        if event.episode_id not in group.members:
            same_member = [
                e
                for e in group.members.values()
                if e.task_id == event.task_id
                and e.sample_index == event.sample_index
                and e.attempt != event.attempt
            ]
            if any(e.attempt > event.attempt for e in same_member):
                return self._skip("older_attempt")
            for old in same_member:
                del group.members[old.episode_id]
                self.skipped["superseded_attempt"] += 1
        group.members[event.episode_id] = event
        return None

    def _add_production(self, event: EpisodeScored) -> str | None:
        """A production session waits alone (no group to fill) until the next step takes it.

        It stays here, not in a ready group, until :meth:`take_production`, so a re-score (a higher
        ``score_revision`` of the same episode) can still replace it; once trained, its id is consumed
        and a re-score is skipped as ``rescore_after_trained``.
        """
        previous = self._production.get(event.episode_id)
        if previous is not None and _older_revision(event, previous):
            return self._skip("older_revision")
        if event.superseded:
            self._production.pop(event.episode_id, None)
            return self._skip("superseded")
        if event.reward is None:  # no feedback and no scorer: never trained with a fill value
            self._production.pop(event.episode_id, None)
            return self._skip("no_reward")
        if not event.transitions:
            self._production.pop(event.episode_id, None)
            return self._skip("no_transitions")
        if previous is not None:
            self.skipped["superseded_revision"] += 1
        self._production[event.episode_id] = event
        return None

    def _skip(self, reason: str) -> str:
        self.skipped[reason] += 1
        return reason

    def _remember(self, event_id: str) -> None:
        self._seen[event_id] = None
        if len(self._seen) > self._seen_capacity:
            self._seen.popitem(last=False)

    # ------------------------------------------------------------------ output
    def ready(self) -> list[Group]:
        """Pop every complete group and every group past its deadline (kept or dropped by policy)."""
        now = self._clock()
        out: list[Group] = []
        for gid in list(self._groups):
            group = self._groups[gid]
            if group.complete:
                out.append(self._pop(gid))
            elif now - group.first_seen >= self.group_timeout_s:
                group = self._pop(gid)
                rewarded = sum(1 for e in group.episodes() if e.reward is not None)
                if self.partial == "train" and rewarded >= self.min_partial:
                    group.expired = True
                    out.append(group)
                else:
                    self.dropped_groups["deadline"] += 1
        return out

    @property
    def production_waiting(self) -> int:
        return len(self._production)

    def take_production(self, limit: int) -> list[Group]:
        """Up to ``limit`` waiting production episodes, oldest first, each as a group of one (consumed)."""
        out: list[Group] = []
        for eid in list(self._production)[:limit]:
            event = self._production.pop(eid)
            self._consume(event.group_id)
            out.append(Group(event.group_id, 1, self._clock(), {eid: event}))
        return out

    def consumed_ids(self, excluding: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """The consumed group ids, oldest first, less ``excluding`` (what a checkpoint keeps: in the order
        ``_consume`` evicts them, so a restored trainer forgets the same ones first)."""
        return [gid for gid in self._consumed_order if gid not in excluding]

    def _consume(self, gid: str) -> None:
        if gid in self.consumed:
            return
        self.consumed.add(gid)
        self._consumed_order.append(gid)
        while len(self._consumed_order) > self._seen_capacity:
            self.consumed.discard(self._consumed_order.popleft())

    def _pop(self, gid: str) -> Group:
        self._consume(gid)
        return self._groups.pop(gid)

    def mark_consumed(self, group_ids: Iterable[str]) -> None:
        for gid in group_ids:
            self._consume(gid)
            self._groups.pop(gid, None)
            for eid in [e for e, ev in self._production.items() if ev.group_id == gid]:
                del self._production[eid]

    @property
    def pending_groups(self) -> int:
        return len(self._groups)

    def pending_events(self) -> list[EpisodeScored]:
        return [*(e for g in self._groups.values() for e in g.members.values()), *self._production.values()]

    def next_deadline_in(self) -> float | None:
        """Seconds until the oldest pending group expires (None when nothing is pending)."""
        if not self._groups:
            return None
        oldest = min(g.first_seen for g in self._groups.values())
        return max(0.0, oldest + self.group_timeout_s - self._clock())

"""Per-episode state, kept durable so the reward service's committed offsets never outrun its work.

Restart safety (DESIGN.md, "Consumers commit offsets only after their work is durable"): the bus
commits an episode event's offset as soon as the handler returns, long before the episode finishes.
So every event is journaled before the handler returns — into SQLite (WAL) under the data dir when
``journal`` is a path — and the open episodes are rebuilt from the journal on start. Scored episodes
are removed and remembered (bounded) so a duplicate ``EpisodeFinished`` is not scored twice.

Scale-out caveat: the journal is local to one reward-service instance. If Kafka moves a partition to
another instance while an episode on it is open, the new owner has not seen the episode's earlier
events; it scores the episode from what it has and marks it (``unusable_reason="state_lost"`` when
nothing was seen). Run one instance per journal, or keep partitions sticky.
"""

from __future__ import annotations

import sqlite3
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from schemas import (
    EPISODES,
    EpisodeFinished,
    EpisodeSource,
    EpisodeStarted,
    LLMCallRecorded,
    RewardReported,
    decode,
    encode,
)

EpisodeEvent = EpisodeStarted | LLMCallRecorded | RewardReported | EpisodeFinished


@dataclass(slots=True)
class EpisodeRecord:
    episode_id: str
    started: EpisodeStarted | None = None
    calls: dict[int, LLMCallRecorded] = field(default_factory=dict)
    rewards: list[RewardReported] = field(default_factory=list)
    finished: EpisodeFinished | None = None
    seen: set[str] = field(default_factory=set)
    last_event_at: float = field(default_factory=time.monotonic)
    closing: bool = False  # the service published an EpisodeFinished on its behalf

    def add(self, event: EpisodeEvent) -> bool:
        if event.event_id in self.seen:
            return False
        self.seen.add(event.event_id)
        self.last_event_at = time.monotonic()
        match event:
            case EpisodeStarted():
                self.started = event
            case LLMCallRecorded():
                self.calls.setdefault(event.call_seq, event)
            case RewardReported():
                self.rewards.append(event)
            case EpisodeFinished():
                if self.finished is None:
                    self.finished = event
        return True

    @property
    def source(self) -> EpisodeSource:
        if self.started is not None:
            return self.started.source
        if self.finished is not None:
            return self.finished.source
        first = next(iter(self.calls.values()), None)
        return first.source if first is not None else EpisodeSource.live

    @property
    def tenant(self) -> str | None:
        for candidate in (self.started, self.finished, next(iter(self.calls.values()), None)):
            if candidate is not None and candidate.tenant:
                return candidate.tenant
        return None

    def ordered_calls(self) -> list[LLMCallRecorded]:
        return [self.calls[k] for k in sorted(self.calls)]


class EpisodeStore:
    """Open episodes in memory, journaled to SQLite when ``journal`` is a path."""

    def __init__(self, journal: Path | None = None, *, remember_done: int = 100_000) -> None:
        self.open: dict[str, EpisodeRecord] = {}
        self.done: OrderedDict[str, None] = OrderedDict()
        self.remember_done = remember_done
        self._db: sqlite3.Connection | None = None
        if journal is not None:
            journal.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(journal), isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS events (n INTEGER PRIMARY KEY, episode_id TEXT, body BLOB)"
            )
            self._db.execute("CREATE INDEX IF NOT EXISTS events_episode ON events(episode_id)")
            self._db.execute("CREATE TABLE IF NOT EXISTS done (episode_id TEXT PRIMARY KEY, at REAL)")
            self._load()
            self._db.execute("BEGIN")

    def _load(self) -> None:
        assert self._db is not None
        for (episode_id,) in self._db.execute("SELECT episode_id FROM done ORDER BY at"):
            self.done[episode_id] = None
        for episode_id, body in self._db.execute("SELECT episode_id, body FROM events ORDER BY n"):
            event = decode(EPISODES, body)
            assert isinstance(event, EpisodeStarted | LLMCallRecorded | RewardReported | EpisodeFinished)
            self.open.setdefault(episode_id, EpisodeRecord(episode_id)).add(event)

    def add(self, event: EpisodeEvent) -> EpisodeRecord | None:
        """Record ``event``; None when its episode was already scored (a late or duplicate event)."""
        if event.episode_id in self.done:
            return None
        record = self.open.get(event.episode_id)
        if record is None:
            record = self.open[event.episode_id] = EpisodeRecord(event.episode_id)
        if record.add(event) and self._db is not None:
            self._db.execute(
                "INSERT INTO events (episode_id, body) VALUES (?, ?)", (event.episode_id, encode(event))
            )
        return record

    def close(self, episode_id: str) -> None:
        """The episode is scored: forget its events, remember that it is done."""
        self.open.pop(episode_id, None)
        self.done[episode_id] = None
        if self._db is not None:
            self._db.execute("DELETE FROM events WHERE episode_id = ?", (episode_id,))
            self._db.execute("INSERT OR REPLACE INTO done VALUES (?, ?)", (episode_id, time.time()))
        while len(self.done) > self.remember_done:
            old, _ = self.done.popitem(last=False)
            if self._db is not None:
                self._db.execute("DELETE FROM done WHERE episode_id = ?", (old,))

    def flush(self) -> None:
        """Make everything recorded so far durable (called before the bus commits)."""
        if self._db is not None:
            self._db.execute("COMMIT")
            self._db.execute("BEGIN")

    def shutdown(self) -> None:
        if self._db is not None:
            self.flush()
            self._db.execute("COMMIT")
            self._db.close()
            self._db = None

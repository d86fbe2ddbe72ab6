"""Per-episode state, kept durable so the reward service's committed offsets never outrun its work.

Restart safety (docs/architecture.md, "Consumers commit offsets only after their work is durable"): the bus
commits an episode event's offset as soon as the handler returns, long before the episode finishes.
So every event is journaled before the handler returns — into SQLite (``infra/journal.py``) under the data dir when
``journal`` is a path — and the open episodes are rebuilt from the journal on start. Scored episodes
are removed and remembered (bounded) so a duplicate ``EpisodeFinished`` is not scored twice.

Retention for late feedback (docs/architecture.md, flow 2, "Production traffic"): a scored production session is kept, in
compact form, so that feedback arriving after it was scored can re-score it. Kept: its events with the
request/response text dropped (ids, logprobs, versions, rewards stay: all that assembly and the feedback
mapping read), as one zlib-compressed blob of JSON lines — a few bytes per token — in the journal's
``retained`` table, or in memory when there is no journal. Bounded by ``retain`` sessions (oldest
scored out first) and by ``retain_s`` seconds since the last (re-)score; the default window is the
gateway's ``feedback_window_s``, past which the gateway refuses feedback with a 409.

Scale-out (``changelog.py``): with ``changelog=True`` there is no journal; every event the store keeps,
and each feedback applied to a retained session, is also queued in ``changes`` for the service to
append to ``flywheel.reward-state`` before the batch is committed, and the state of a partition is
rebuilt from that topic by whichever instance is given the partition (``forget`` drops a lost one).
Without it, the journal is local to one instance: run one instance per journal.
"""

from __future__ import annotations

import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from infra.journal import Journal
from infra.logging import get_logger
from reward_service import ordering
from schemas import (
    EPISODES,
    EpisodeFinished,
    EpisodeScored,
    EpisodeSource,
    EpisodeStarted,
    LLMCallRecorded,
    RewardReported,
    decode,
    encode,
)

EpisodeEvent = EpisodeStarted | LLMCallRecorded | RewardReported | EpisodeFinished
Change = EpisodeEvent | EpisodeScored  # a record of the changelog (changelog.py)
VERSION = 1  # the journal's tables (infra/journal.py)
log = get_logger("reward_service")
_TABLES = (
    "CREATE TABLE IF NOT EXISTS events (n INTEGER PRIMARY KEY, episode_id TEXT, body BLOB)",
    "CREATE INDEX IF NOT EXISTS events_episode ON events(episode_id)",
    "CREATE TABLE IF NOT EXISTS done (episode_id TEXT PRIMARY KEY, at REAL)",
    "CREATE TABLE IF NOT EXISTS retained (episode_id TEXT PRIMARY KEY, at REAL, revision INTEGER, body BLOB)",
)


@dataclass(slots=True)
class EpisodeRecord:
    episode_id: str
    started: EpisodeStarted | None = None
    # every recorded call, by call_id, as received: never one per call_seq (several gateways may have
    # numbered the episode, each from 0: ordering.py)
    recorded: dict[str, LLMCallRecorded] = field(default_factory=dict)
    rewards: list[RewardReported] = field(default_factory=list)
    finished: EpisodeFinished | None = None
    seen: set[str] = field(default_factory=set)
    last_event_at: float = field(default_factory=time.monotonic)
    closing: bool = False  # the service published an EpisodeFinished on its behalf
    _numbered: list[LLMCallRecorded] | None = field(default=None, init=False, repr=False, compare=False)

    def add(self, event: EpisodeEvent) -> bool:
        if event.event_id in self.seen:
            return False
        self.seen.add(event.event_id)
        self.last_event_at = time.monotonic()
        match event:
            case EpisodeStarted():
                self.started = event
            case LLMCallRecorded():
                if event.call_id in self.recorded:  # the same call under another event id: kept once
                    log.warning("call_recorded_twice", episode_id=self.episode_id, call_id=event.call_id)
                else:
                    self.recorded[event.call_id] = event
                    self._numbered = None
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
        first = next(iter(self.recorded.values()), None)
        return first.source if first is not None else EpisodeSource.live

    @property
    def tenant(self) -> str | None:
        for candidate in (self.started, self.finished, next(iter(self.recorded.values()), None)):
            if candidate is not None and candidate.tenant:
                return candidate.tenant
        return None

    @property
    def reused_seqs(self) -> int:
        """Recorded calls whose ``call_seq`` another call of the episode has too (renumbered)."""
        return ordering.reused(list(self.recorded.values()))

    def ordered_calls(self) -> list[LLMCallRecorded]:
        """Every call in the episode's order, each with its number there as ``call_seq`` (ordering.py)."""
        if self._numbered is None:
            self._numbered = ordering.number(ordering.order(list(self.recorded.values())))
        return list(self._numbered)

    @property
    def calls(self) -> dict[int, LLMCallRecorded]:
        """The calls by their number in the episode."""
        return {c.call_seq: c for c in self.ordered_calls()}

    def events(self) -> list[EpisodeEvent]:
        """Its events, as recorded, in an order that ``add`` replays to the same record."""
        out: list[EpisodeEvent] = [] if self.started is None else [self.started]
        out.extend(self.recorded.values())
        out.extend(self.rewards)
        if self.finished is not None:
            out.append(self.finished)
        return out


@dataclass(slots=True)
class Retained:
    """A scored production session kept for late feedback: its last published revision and when."""

    revision: int
    at: float  # wall clock of the last (re-)score


def _pack(record: EpisodeRecord) -> bytes:
    lines = []
    for event in record.events():
        if isinstance(event, LLMCallRecorded):  # the text is the bulk; re-scoring needs only the ids
            event = event.model_copy(update={"request": "", "response": None})
        lines.append(encode(event))
    return zlib.compress(b"\n".join(lines))


def _unpack(episode_id: str, blob: bytes) -> EpisodeRecord:
    record = EpisodeRecord(episode_id)
    for line in zlib.decompress(blob).split(b"\n"):
        event = decode(EPISODES, line)
        assert isinstance(event, EpisodeStarted | LLMCallRecorded | RewardReported | EpisodeFinished)
        record.add(event)
    return record


class EpisodeStore:
    """Open episodes in memory, journaled to SQLite when ``journal`` is a path."""

    def __init__(
        self,
        journal: Path | None = None,
        *,
        remember_done: int = 100_000,
        retain: int = 10_000,
        retain_s: float = 7 * 24 * 3600.0,
        changelog: bool = False,
    ) -> None:
        if changelog and journal is not None:
            raise ValueError("the changelog replaces the journal: give one or the other")
        # what the service appends to the changelog before the batch is committed (None: no changelog)
        self.changes: list[Change] | None = [] if changelog else None
        self.open: dict[str, EpisodeRecord] = {}
        self.done: OrderedDict[str, None] = OrderedDict()
        self.remember_done = remember_done
        self.retain = retain
        self.retain_s = retain_s
        self.retained: OrderedDict[str, Retained] = OrderedDict()  # oldest (re-)score first
        self._blobs: dict[str, bytes] = {}  # without a journal: the retained sessions themselves
        self._db: Journal | None = None
        if journal is not None:
            self._db = Journal(journal, tables=_TABLES, version=VERSION, durability="normal")
            self._load()
            self._db.begin()  # every event up to the next flush() commits as one

    def _load(self) -> None:
        assert self._db is not None
        for (episode_id,) in self._db.query("SELECT episode_id FROM done ORDER BY at"):
            self.done[episode_id] = None
        for episode_id, at, revision in self._db.query(
            "SELECT episode_id, at, revision FROM retained ORDER BY at"
        ):
            self.retained[episode_id] = Retained(int(revision), float(at))
        for episode_id, body in self._db.query("SELECT episode_id, body FROM events ORDER BY n"):
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
        if record.add(event):
            self.note(event)
            if self._db is not None:
                self._db.execute(
                    "INSERT INTO events (episode_id, body) VALUES (?, ?)", (event.episode_id, encode(event))
                )
        return record

    def note(self, change: Change) -> None:
        """Queue ``change`` for the changelog (when there is one)."""
        if self.changes is not None:
            self.changes.append(change)

    def forget(self, lost: Callable[[str], bool]) -> int:
        """Drop every episode (open, done, retained) whose id ``lost`` says is no longer ours."""
        open_ids = [e for e in self.open if lost(e)]
        for episode_id in open_ids:
            del self.open[episode_id]
            if self._db is not None:
                self._db.execute("DELETE FROM events WHERE episode_id = ?", (episode_id,))
        for episode_id in [e for e in self.done if lost(e)]:
            del self.done[episode_id]
            if self._db is not None:
                self._db.execute("DELETE FROM done WHERE episode_id = ?", (episode_id,))
        for episode_id in [e for e in self.retained if lost(e)]:
            self._drop(episode_id)
        return len(open_ids)

    def close(self, episode_id: str, *, at: float | None = None) -> None:
        """The episode is scored: forget its events, remember that it is done (production: retain it)."""
        record = self.open.pop(episode_id, None)
        self.done[episode_id] = None
        if self._db is not None:
            self._db.execute("DELETE FROM events WHERE episode_id = ?", (episode_id,))
            self._db.execute("INSERT OR REPLACE INTO done VALUES (?, ?)", (episode_id, time.time()))
        while len(self.done) > self.remember_done:
            old, _ = self.done.popitem(last=False)
            if self._db is not None:
                self._db.execute("DELETE FROM done WHERE episode_id = ?", (old,))
        if record is not None and record.source is EpisodeSource.production and self.retain > 0:
            self.keep(record, revision=0, at=at)

    def keep(self, record: EpisodeRecord, *, revision: int, at: float | None = None) -> None:
        """Retain a scored production session (again, after a re-score) as its newest revision.

        ``at``: when it was (re-)scored, for a restore (default: now)."""
        blob, now = _pack(record), time.time() if at is None else at
        self.retained.pop(record.episode_id, None)
        self.retained[record.episode_id] = Retained(revision, now)
        if self._db is not None:
            self._db.execute(
                "INSERT OR REPLACE INTO retained VALUES (?, ?, ?, ?)",
                (record.episode_id, now, revision, blob),
            )
        else:
            self._blobs[record.episode_id] = blob
        self._expire(time.time())

    def _expire(self, now: float) -> None:
        while self.retained:
            oldest, kept = next(iter(self.retained.items()))
            if len(self.retained) <= self.retain and now - kept.at <= self.retain_s:
                break
            self._drop(oldest)

    def _drop(self, episode_id: str) -> None:
        self.retained.pop(episode_id, None)
        self._blobs.pop(episode_id, None)
        if self._db is not None:
            self._db.execute("DELETE FROM retained WHERE episode_id = ?", (episode_id,))

    def retained_record(self, episode_id: str) -> tuple[EpisodeRecord, int] | None:
        """A retained scored session rebuilt with its last revision; None when not (or no longer) held."""
        self._expire(time.time())
        kept = self.retained.get(episode_id)
        if kept is None:
            return None
        if self._db is not None:
            rows = self._db.query("SELECT body FROM retained WHERE episode_id = ?", (episode_id,))
            blob = bytes(rows[0][0]) if rows else None
        else:
            blob = self._blobs.get(episode_id)
        if blob is None:
            return None
        return _unpack(episode_id, blob), kept.revision

    def flush(self) -> None:
        """Make everything recorded so far durable (called before the bus commits)."""
        if self._db is not None:
            self._db.commit()
            self._db.begin()

    def shutdown(self) -> None:
        if self._db is not None:
            self._db.commit()
            self._db.close()
            self._db = None
